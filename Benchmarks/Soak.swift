import ExampleServices
import Foundation

/// soak (run only when named; `make soak`): the real `mainspring-daemon` (the release build next
/// to this executable) under 100 connections × 10,000 pipelined lines, 1,000 connect/disconnect
/// cycles and one client that never reads, all at once, repeated for `SOAK_ROUNDS` rounds (30).
/// Counts lost and reordered replies, samples the daemon's resident memory (after the first
/// round and at the end: a leak grows between them), and reports the healthy clients' p99
/// reply latency. Sizes: `SOAK_CONNECTIONS`, `SOAK_LINES`, `SOAK_CYCLES`, `SOAK_ROUNDS` (a smoke
/// run: 4 × 100 lines, 20 cycles, one round).
let soakScenario = Scenario(
    name: "soak",
    summary: "the daemon under 100 × 10,000 lines, 1,000 connection cycles and a non-reading client (minutes)"
) { _ in
    let connections = Int(ProcessInfo.processInfo.environment["SOAK_CONNECTIONS"] ?? "") ?? sized(100, smoke: 4)
    let lines = Int(ProcessInfo.processInfo.environment["SOAK_LINES"] ?? "") ?? sized(10_000, smoke: 100)
    let cycles = Int(ProcessInfo.processInfo.environment["SOAK_CYCLES"] ?? "") ?? sized(1_000, smoke: 20)
    let rounds = max(1, Int(ProcessInfo.processInfo.environment["SOAK_ROUNDS"] ?? "") ?? sized(30, smoke: 1))
    let daemon = Process()
    daemon.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        .deletingLastPathComponent().appendingPathComponent("mainspring-daemon")
    daemon.arguments = ["--port", "0", "--output-limit", "262144"]
    let output = Foundation.Pipe()
    daemon.standardOutput = output
    daemon.standardError = FileHandle.nullDevice
    try daemon.run()
    defer {
        daemon.terminate()
        daemon.waitUntilExit()
    }
    let banner = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
    guard let port = banner.split(separator: " ").dropFirst(2).first?.split(separator: ":").last.flatMap({ UInt16($0) }) else {
        throw BenchError.usage("the daemon printed no port: \(banner)")
    }
    let pid = daemon.processIdentifier
    let startRSS = residentBytes(of: pid)
    let peakRSS = Guarded(startRSS)
    let stop = Guarded(false)
    let sampler = Thread {
        while !stop.withLock({ $0 }) {
            let now = residentBytes(of: pid)
            peakRSS.withLock { $0 = max($0, now) }
            usleep(100_000)
        }
    }
    sampler.start()

    // The client that never reads: it asks for 4 KB replies until its socket is full.
    let slow = BenchClient(port: port)
    if let slow {
        _ = fcntl(slow.fd, F_SETFL, fcntl(slow.fd, F_GETFL) | O_NONBLOCK)
        let request = Array(("ECHO " + String(repeating: "z", count: 4_000) + "\n").utf8)
        for _ in 0..<50_000 {
            let n = request.withUnsafeBytes { send(slow.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { break }
        }
    }

    let tally = Guarded<(lost: Int, reordered: Int, replies: Int, latencies: [Double], cycles: Int)>((0, 0, 0, [], 0))
    let start = nowNanoseconds()
    var afterFirstRound = 0
    for round in 0..<rounds {
    let workers = DispatchGroup()
    for c in 0..<connections {
        workers.enter()
        Thread {
            defer { workers.leave() }
            guard let client = BenchClient(port: port) else {
                tally.withLock { $0.lost += lines }
                return
            }
            var latencies: [Double] = []
            var lost = 0, reordered = 0, replies = 0
            let window = 100
            var next = 0
            while next < lines {
                let count = min(window, lines - next)
                var request = ""
                for i in next..<(next + count) { request += "ECHO \(c):\(i)\n" }
                let sent = nowNanoseconds()
                client.send(request)
                for i in next..<(next + count) {
                    guard let reply = client.readLine() else {
                        lost += next + count - i
                        break
                    }
                    latencies.append(Double(nowNanoseconds() - sent) / 1e6)
                    replies += 1
                    if reply != "\(c):\(i)" { reordered += 1 }
                }
                next += count
            }
            tally.withLock {
                $0.lost += lost
                $0.reordered += reordered
                $0.replies += replies
                $0.latencies += latencies
            }
        }.start()
    }
    workers.enter()
    Thread {
        defer { workers.leave() }
        for i in 0..<cycles {
            guard let client = BenchClient(port: port) else { continue }
            client.send("ECHO cycle \(i)\n")
            if client.readLine() == "cycle \(i)" { tally.withLock { $0.cycles += 1 } }
        }
    }.start()
    workers.wait()
    if round == 0 { afterFirstRound = residentBytes(of: pid) }
    FileHandle.standardError.write(Data("soak round \(round + 1)/\(rounds): rss \(residentBytes(of: pid) / 1_048_576) MB\n".utf8))
    }
    let endRSS = residentBytes(of: pid)
    let seconds = Double(nowNanoseconds() - start) / 1e9
    stop.withLock { $0 = true }
    _ = slow
    let (lost, reordered, replies, latencies, completedCycles) = tally.withLock { $0 }
    let peak = peakRSS.withLock { $0 }
    var samples = Samples()
    samples.add("mainspring-daemon", [
        ("lines_per_s", Double(replies) / seconds),
        ("p99_ms", percentile(latencies, 0.99)),
        ("lost_replies", Double(lost)),
        ("reordered_replies", Double(reordered)),
        ("connect_cycles", Double(completedCycles)),
        ("rss_start_mb", Double(startRSS) / 1_048_576),
        ("rss_after_round_1_mb", Double(afterFirstRound) / 1_048_576),
        ("rss_end_mb", Double(endRSS) / 1_048_576),
        ("rss_peak_mb", Double(peak) / 1_048_576),
        ("rounds", Double(rounds)),
        ("seconds", seconds),
    ])
    return samples.records(scenario: "soak")
}

/// Resident memory of a process, in bytes.
