import ExampleServices
import Foundation

/// kv: `mainspring-kv` (the release build next to this executable; one loop, and two loops as
/// `mainspring-loops2`) against Debian's `redis-server` on the same machine, persistence off,
/// side by side in one run:
/// - `redis-benchmark -q -c 50 -P 16` and `-P 1` per command of the list below: requests/s
///   (`<command>_requests_per_s`, `<command>_p1_requests_per_s`). Requests per test:
///   `KV_BENCH_REQUESTS` (default 1,000,000) with -P 16, a fifth of that with -P 1.
/// - The ★ figure: the p99 and max of PING round trips (one client, one PING a millisecond)
///   while another client runs `KEYS *` over 1,000,000 keys (5 times), and while it runs
///   `DEL` of a 1,000,000-element list (3 times; sampled until the value is freed).
/// - Memory (RSS deltas, measured first, in the fresh server): bytes per idle client (10,000
///   connections) and per key (1,000,000 keys made by `DEBUG POPULATE`, small strings).
/// `KV_BENCH_KEYS`, `KV_BENCH_CLIENTS` change the sizes; `KV_BENCH_PARTS` (`throughput,slow,memory`)
/// chooses the figures. A smoke run: 1,000 requests (200 with -P 1), 1,000 keys, 100 clients, one
/// round of each slow command, a tenth of each pause.
let kvScenario = Scenario(
    name: "kv",
    summary: "mainspring-kv vs redis-server: redis-benchmark -P 16 / -P 1, PING p99 during KEYS/DEL, memory"
) { runs in
    guard let benchmark = findExecutable("redis-benchmark"), let redisServer = findExecutable("redis-server") else {
        FileHandle.standardError.write(Data(
            "kv: redis-server or redis-benchmark is missing (make bench installs them): every variant is skipped\n".utf8))
        return []
    }
    let kv = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
        .appendingPathComponent("mainspring-kv").path
    guard FileManager.default.isExecutableFile(atPath: kv) else {
        throw BenchError.usage("the kv scenario needs mainspring-kv next to mainspring-bench (make bench builds it)")
    }
    let environment = ProcessInfo.processInfo.environment
    let requests = Int(environment["KV_BENCH_REQUESTS"] ?? "") ?? sized(1_000_000, smoke: 1_000)
    let oneAtATime = max(sized(10_000, smoke: 200), requests / 5)  // with -P 1
    let keys = Int(environment["KV_BENCH_KEYS"] ?? "") ?? sized(1_000_000, smoke: 1_000)
    let clients = Int(environment["KV_BENCH_CLIENTS"] ?? "") ?? sized(10_000, smoke: 100)
    // Which figures: any of throughput, slow, memory (comma-separated; all by default).
    let parts = (environment["KV_BENCH_PARTS"] ?? "throughput,slow,memory").split(separator: ",").map(String.init)
    raiseDescriptorLimit(to: clients + 1_000)  // Connections.swift's
    // The command line that reproduces the run (on stderr: stdout may be --json).
    FileHandle.standardError.write(Data(("$ KV_BENCH_REQUESTS=\(requests) KV_BENCH_KEYS=\(keys) KV_BENCH_CLIENTS=\(clients) "
        + "make bench ARGS=\"kv --runs \(runs)\(sized("", smoke: " --smoke"))\"   # redis-benchmark -q -n \(requests) (-n \(oneAtATime) with -P 1) "
        + "-c 50 -P 16 -t \(kvBenchTests)\n").utf8))
    var samples = Samples()
    for _ in 0..<runs {
        for variant in ["mainspring", "mainspring-loops2", "redis-server"] where variantEnabled(variant) {
            let server: BenchServer
            switch variant {
            case "mainspring": server = try BenchServer(kv: kv, loops: 1)
            case "mainspring-loops2": server = try BenchServer(kv: kv, loops: 2)
            default: server = try BenchServer(redis: redisServer)
            }
            defer { server.stop() }
            var figures: [(String, Double)] = []
            // Memory first, in the fresh process: memory freed later (by FLUSHALL) stays in the
            // allocator and would be reused by what is measured after it.
            if variant != "mainspring-loops2" && parts.contains("memory") {
                figures += measureMemory(server: server, keys: keys, clients: clients)
            }
            if parts.contains("throughput") {
                for (pipeline, suffix, count) in [(16, "", requests), (1, "_p1", oneAtATime)] {
                    for (name, rate) in runRedisBenchmark(benchmark, port: server.port, requests: count, pipeline: pipeline) {
                        figures.append(("\(name)\(suffix)_requests_per_s", rate))
                    }
                }
            }
            if variant != "mainspring-loops2" && parts.contains("slow") {
                figures += measureSlowCommands(port: server.port, keys: keys, variantLabel: variant)
            }
            samples.add(variant, figures)
        }
    }
    return samples.records(scenario: "kv")
}

/// Sleeps `microseconds` (a tenth of that in a smoke run): the pauses that let a server settle.
private func settle(_ microseconds: UInt32) {
    usleep(sized(microseconds, smoke: microseconds / 10))
}

private let kvBenchTests = "ping_inline,ping_mbulk,set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,lrange_100,mset"

/// A server under test, in a child process.
private final class BenchServer {
    let process = Process()
    let port: UInt16

    /// `mainspring-kv --port 0 --loops N`: the port from its banner.
    init(kv path: String, loops: Int) throws {
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = ["--port", "0", "--loops", "\(loops)", "--maxclients", "20000"]
        let output = Foundation.Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let banner = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
        guard let port = banner.split(separator: "\n").first?.split(separator: ":").last.flatMap({ UInt16($0) }) else {
            process.terminate()
            throw BenchError.usage("mainspring-kv printed no port: \(banner)")
        }
        self.port = port
    }

    /// `redis-server` on a free port outside the ephemeral range, persistence off.
    init(redis path: String) throws {
        for _ in 0..<20 {
            let port = UInt16.random(in: 20_000...30_000)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: path)
            process.arguments = ["--port", "\(port)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--protected-mode", "no", "--maxclients", "20000", "--enable-debug-command", "yes"]
            let output = Foundation.Pipe()
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
            var log = ""
            let deadline = Date().addingTimeInterval(10)
            while Date() < deadline && !log.contains("Ready to accept") && !log.contains("Address already in use") {
                log += String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
            }
            if log.contains("Ready to accept") {
                self.process.executableURL = process.executableURL
                self.port = port
                self.redis = process
                return
            }
            process.terminate()
            process.waitUntilExit()
        }
        throw BenchError.usage("redis-server did not start")
    }

    private var redis: Process?
    var pid: Int32 { redis?.processIdentifier ?? process.processIdentifier }

    func stop() {
        let running = redis ?? process
        running.terminate()
        running.waitUntilExit()
    }
}

/// Runs redis-benchmark; the requests/s of each test, by lowercase name (`lrange_100`).
private func runRedisBenchmark(_ path: String, port: UInt16, requests: Int, pipeline: Int) -> [(String, Double)] {
    let arguments = ["-p", "\(port)", "-q", "-n", "\(requests)", "-c", "50", "-P", "\(pipeline)", "-t", kvBenchTests]
    guard let text = standardOutput(of: path, arguments) else { return [] }
    var figures: [(String, Double)] = []
    // "SET: 123456.79 requests per second, p50=0.191 msec" (progress lines end with \r).
    for line in text.split(whereSeparator: { $0 == "\n" || $0 == "\r" }) {
        guard let colon = line.firstIndex(of: ":"), line.contains("requests per second") else { continue }
        let name = line[..<colon].split(separator: " ").first.map { $0.lowercased() } ?? ""
        if name == "lpush" && line.contains("needed to benchmark") { continue }
        let rest = line[line.index(after: colon)...].split(separator: " ")
        if let rate = rest.first.flatMap({ Double($0) }) { figures.append((name, rate)) }
    }
    return figures
}

// MARK: The ★ figure

/// A blocking RESP client: commands out, replies read to their end (nested arrays included).
private final class RESPBenchClient {
    let fd: Int32
    private var buffer: [UInt8] = []
    private var position = 0

    init?(port: UInt16) {
        guard let fd = connectLoopback(port: port) else { return nil }
        self.fd = fd
    }

    deinit { close(fd) }

    func send(_ arguments: [String]) {
        var out = Array("*\(arguments.count)\r\n".utf8)
        for argument in arguments { out += Array("$\(argument.utf8.count)\r\n\(argument)\r\n".utf8) }
        sendRaw(out)
    }

    func sendRaw(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            offset += n
        }
    }

    private func fill() -> Bool {
        if position == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            position = 0
        }
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { return false }
        buffer += chunk[0..<n]
        return true
    }

    private func line() -> [UInt8]? {
        while true {
            if let cr = buffer[position...].firstIndex(of: 13), cr + 1 < buffer.count {
                let text = Array(buffer[position..<cr])
                position = cr + 2
                return text
            }
            guard fill() else { return nil }
        }
    }

    /// Reads one reply; returns its first line (`+PONG`, `:1`, `*1000001`…), nil on EOF.
    @discardableResult
    func read() -> String? {
        guard let header = line() else { return nil }
        let text = String(decoding: header, as: UTF8.self)
        switch header.first {
        case UInt8(ascii: "$"):
            let count = Int(text.dropFirst()) ?? -1
            if count >= 0 {
                while buffer.count - position < count + 2 { guard fill() else { return nil } }
                position += count + 2
            }
        case UInt8(ascii: "*"):
            for _ in 0..<max(0, Int(text.dropFirst()) ?? 0) { guard read() != nil else { return nil } }
        default:
            break
        }
        return text
    }

    func readLineText() -> String? { line().map { String(decoding: $0, as: UTF8.self) } }

    func readText(_ count: Int) -> String? {
        while buffer.count - position < count + 2 { guard fill() else { return nil } }
        let text = String(decoding: buffer[position..<(position + count)], as: UTF8.self)
        position += count + 2
        return text
    }

    @discardableResult
    func call(_ arguments: String...) -> String? {
        send(arguments)
        return read()
    }
}

/// PING p99/max (ms) while `KEYS *` runs over `keys` keys, and while `DEL` frees a list of as
/// many elements.
private func measureSlowCommands(port: UInt16, keys: Int, variantLabel: String) -> [(String, Double)] {
    guard let worker = RESPBenchClient(port: port), let pinger = RESPBenchClient(port: port) else { return [] }
    _ = worker.call("FLUSHALL")
    _ = worker.call("DEBUG", "POPULATE", "\(keys)")
    var figures: [(String, Double)] = []
    // The client that runs the slow command (this thread, which also reads KEYS' 20 MB reply)
    // runs at the lowest priority, so that on two cores it does not take the pinger's CPU: the
    // PINGs measure the server, not the benchmark's own threads.
    // (On Linux a nice value belongs to a thread: `who` 0 is the calling thread.)
    setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 19)
    defer { setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 0) }
    for (name, rounds) in [("keys", sized(5, smoke: 1)), ("del", sized(3, smoke: 1))] {
        let stop = Guarded(false)
        // Each sample: a PING's round trip, sent to answered.
        let rtts = Guarded<[Double]>([])
        // The pinger's client is this thread's until the pinger thread starts, then only its.
        nonisolated(unsafe) let pinger = pinger
        let thread = Thread {
            while !stop.withLock({ $0 }) {
                let start = nowNanoseconds()
                guard pinger.call("PING") != nil else { break }
                let rtt = Double(nowNanoseconds() - start) / 1e6
                rtts.withLock { $0.append(rtt) }
                usleep(1_000)
            }
        }
        thread.start()
        for _ in 0..<rounds {
            if name == "del" {
                // Build the list first (pipelined), then sample only around the DEL.
                var commands = 0
                var start = 0
                while start < keys {
                    let end = min(keys, start + 10_000)
                    worker.send(["RPUSH", "biglist"] + (start..<end).map { "e\($0)" })
                    commands += 1
                    start = end
                }
                for _ in 0..<commands { worker.read() }
            }
            settle(50_000)
            rtts.withLock { $0.removeAll() }  // the sampler is warm: count from here
            if name == "keys" {
                worker.call("KEYS", "*")
            } else {
                worker.call("DEL", "biglist")
                // mainspring-kv frees the list in slices after the reply: sample through it.
                for _ in 0..<300 {
                    guard infoHasPending(worker) else { break }
                    usleep(5_000)
                }
            }
            settle(50_000)
            let round = rtts.withLock { $0 }
            figures.append(("ping_p99_ms_during_\(name)", percentile(round, 0.99)))
            figures.append(("ping_max_ms_during_\(name)", round.max() ?? .nan))
            // Each round on stderr: the table keeps only the median, min and max of the rounds,
            // and a target "in every round" needs them all.
            let p99 = String(format: "%.2f", percentile(round, 0.99))
            let max = String(format: "%.2f", round.max() ?? .nan)
            FileHandle.standardError.write(Data(
                "kv \(variantLabel) round: \(name), \(round.count) PINGs, p99 \(p99) ms, max \(max) ms\n".utf8))
        }
        stop.withLock { $0 = true }
        while !thread.isFinished { usleep(1_000) }
    }
    _ = worker.call("FLUSHALL")
    return figures
}

/// Whether `INFO mainspring` says freeing is still going on (always false on redis-server).
private func infoHasPending(_ client: RESPBenchClient) -> Bool {
    client.send(["INFO", "mainspring"])
    guard let header = client.readBulk() else { return false }
    return header.contains("reclamation_pending:1")
}

extension RESPBenchClient {
    /// Reads a bulk reply's text.
    fileprivate func readBulk() -> String? {
        guard let first = readLineText(), first.hasPrefix("$"), let count = Int(first.dropFirst()), count >= 0 else {
            return nil
        }
        return readText(count)
    }
}

// MARK: Memory

/// Bytes of RSS per idle client (`clients` connections) and per key (`keys` small strings).
private func measureMemory(server: BenchServer, keys: Int, clients: Int) -> [(String, Double)] {
    guard let admin = RESPBenchClient(port: server.port) else { return [] }
    _ = admin.call("FLUSHALL")
    settle(300_000)
    let before = residentBytes(of: server.pid)
    var connections: [RESPBenchClient] = []
    connections.reserveCapacity(clients)
    for _ in 0..<clients {
        guard let connection = RESPBenchClient(port: server.port) else { break }
        connections.append(connection)
    }
    // Wait until the server has accepted them all.
    for _ in 0..<500 {
        admin.send(["INFO", "clients"])
        if let text = admin.readBulk(), text.contains("connected_clients:\(connections.count + 1)") { break }
        usleep(10_000)
    }
    settle(300_000)
    let withClients = residentBytes(of: server.pid)
    let perClient = connections.count < clients ? Double.nan : Double(withClients - before) / Double(connections.count)
    connections.removeAll()
    settle(500_000)
    let beforeKeys = residentBytes(of: server.pid)
    _ = admin.call("DEBUG", "POPULATE", "\(keys)")
    settle(300_000)
    let withKeys = residentBytes(of: server.pid)
    _ = admin.call("FLUSHALL")
    return [("bytes_per_client", perClient), ("bytes_per_key", Double(withKeys - beforeKeys) / Double(keys))]
}
