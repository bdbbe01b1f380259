import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A reader of the room's broadcast on its own thread: checks that the sequence numbers come in
/// order, one after the other, and counts them.
private final class SequenceReader: @unchecked Sendable {
    let client: TestClient
    private final class Progress: Sendable {
        let state = Mutex<(received: Int, problem: String?)>((0, nil))
    }

    private let progress = Progress()
    private let done = DispatchSemaphore(value: 0)

    init(port: UInt16, expecting count: Int) throws {
        client = try TestClient(port: port)
        let client = self.client
        let progress = self.progress
        let done = self.done
        Thread {
            var next = 0
            while next < count, let line = client.readLine() {
                guard line.hasPrefix("seq "), let number = Int(line.dropFirst(4).prefix(9)) else { continue }
                if number != next {
                    progress.state.withLock { $0.problem = "expected seq \(next), got \(number)" }
                    break
                }
                next += 1
                if next % 1_000 == 0 { progress.state.withLock { $0.received = next } }
            }
            progress.state.withLock { $0.received = next }
            done.signal()
        }.start()
    }

    var received: Int { progress.state.withLock { $0.received } }
    var problem: String? { progress.state.withLock { $0.problem } }
    func wait(timeout: Duration) -> Bool {
        done.wait(timeout: .now() + .milliseconds(Int(timeout.components.seconds * 1_000))) == .success
    }
}

@Suite("Bounded fan-out: the chat example with a slow consumer (subprocess)", .serialized)
struct ChatTests {
    /// Under the sanitizers everything is several times slower: a smaller flood proves the same.
    static let floodBytes = ProcessInfo.processInfo.environment["MAINSPRING_SANITIZER"] == nil ? 100 << 20 : 20 << 20

    @Test("a 100 MB broadcast with one client that never reads: the server's memory stays bounded, every other client gets everything in order")
    func slowConsumer() async throws {
        let chat = try startExecutable("mainspring-chat", arguments: [
            "--port", "0", "--loops", "2", "--slow-consumer", "drop", "--grace-ms", "5000", "--output-limit", "262144",
        ])
        defer { chat.send(SIGKILL) }
        let banner = try #require(chat.readLine(timeout: .seconds(30)), "no banner")
        let port = try #require(banner.split(separator: ":").last.flatMap { UInt16($0) }, "no port in '\(banner)'")

        let lineLength = 1_000
        let count = Self.floodBytes / lineLength
        let readers = try (0..<3).map { _ in try SequenceReader(port: port, expecting: count) }
        let slow = try TestClient(port: port)  // never reads
        let sender = try TestClient(port: port)
        // Everyone has joined once a query says so (it goes to the sender alone).
        var joined = false
        for _ in 0..<200 where !joined {
            sender.send("/stats\n")
            joined = sender.readLine()?.contains("members=5") == true
            if !joined { usleep(20_000) }
        }
        try #require(joined, "the five clients never all joined")

        let baseline = residentBytes(of: chat.pid)
        let sampler = MemorySampler(pid: chat.pid, baseline: baseline)
        let padding = String(repeating: "x", count: lineLength - 15)
        let start = ContinuousClock.now
        var batch = ""
        for sequence in 0..<count {
            batch += "seq " + String(sequence).leftPadded(to: 9) + " " + padding + "\n"
            if batch.utf8.count >= 64 << 10 || sequence == count - 1 {
                sender.send(batch)
                batch = ""
            }
        }
        for reader in readers { #expect(reader.wait(timeout: .seconds(300)), "a reader stalled at \(reader.received)") }
        let elapsed = ContinuousClock.now - start
        let peak = sampler.stop()
        sender.send("/stats\n")
        let stats = sender.readLine() ?? ""
        let growth = peak - baseline

        for reader in readers {
            #expect(reader.problem == nil, "\(reader.problem ?? "")")
            #expect(reader.received == count)
        }
        // The slow client's share is bounded by its output limit (about twice 256 KiB, while
        // in flight) plus what the kernel buffers for it; every reader's likewise. The unbounded
        // form (writeLine to everyone) grew by ~190 MB in this flood.
        #expect(growth < 32 << 20, "RSS grew by \(growth >> 20) MB during a \(Self.floodBytes >> 20) MB flood (\(elapsed)); \(stats)")
        #expect(stats.contains("disconnected=0"), "\(stats)")
        let dropped = Int(stats.split(separator: " ").first { $0.hasPrefix("dropped=") }?.dropFirst(8) ?? "") ?? 0
        #expect(dropped > 0, "the client that never reads had messages dropped: \(stats)")
        #expect(dropped < count, "only the slow client's messages: \(stats)")
        _ = slow
        chat.send(SIGTERM)
        let result = chat.waitForExit(timeout: .seconds(30))
        #expect(result.status == 0, "\(result.summary)")
    }

    @Test("with the disconnect policy the client that never reads is closed and counted; the others go on")
    func disconnectPolicy() async throws {
        let chat = try startExecutable("mainspring-chat", arguments: [
            "--port", "0", "--loops", "2", "--slow-consumer", "disconnect", "--grace-ms", "3000", "--output-limit", "65536",
        ])
        defer { chat.send(SIGKILL) }
        let banner = try #require(chat.readLine(timeout: .seconds(30)), "no banner")
        let port = try #require(banner.split(separator: ":").last.flatMap { UInt16($0) }, "no port in '\(banner)'")
        let count = 20_000  // 20 MB of 1,000-byte lines
        let reader = try SequenceReader(port: port, expecting: count)
        let slow = try TestClient(port: port)
        let sender = try TestClient(port: port)
        var joined = false
        for _ in 0..<200 where !joined {
            sender.send("/stats\n")
            joined = sender.readLine()?.contains("members=3") == true
            if !joined { usleep(20_000) }
        }
        try #require(joined)
        let padding = String(repeating: "y", count: 985)
        var batch = ""
        for sequence in 0..<count {
            batch += "seq " + String(sequence).leftPadded(to: 9) + " " + padding + "\n"
            if batch.utf8.count >= 64 << 10 || sequence == count - 1 {
                sender.send(batch)
                batch = ""
            }
        }
        #expect(reader.wait(timeout: .seconds(300)), "the reader stalled at \(reader.received)")
        #expect(reader.problem == nil && reader.received == count, "\(reader.problem ?? "") \(reader.received)")
        sender.send("/stats\n")
        let stats = sender.readLine() ?? ""
        #expect(stats.contains("disconnected=1") && stats.contains("members=2"), "\(stats)")
        // The slow client sees its connection end once it reads what it was sent.
        _ = slow.readToEnd()
        chat.send(SIGTERM)
        #expect(chat.waitForExit(timeout: .seconds(30)).status == 0)
    }
}

/// Samples a process's resident memory every 20 ms on a thread of its own; `stop` returns the peak.
private final class MemorySampler: Sendable {
    private let peak: Mutex<Int>
    private let running = Atomic<Bool>(true)
    private let stopped = DispatchSemaphore(value: 0)

    init(pid: pid_t, baseline: Int) {
        peak = Mutex(baseline)
        Thread { [self] in
            while running.load(ordering: .relaxed) {
                let now = residentBytes(of: pid)
                peak.withLock { $0 = max($0, now) }
                usleep(20_000)
            }
            stopped.signal()
        }.start()
    }

    func stop() -> Int {
        running.store(false, ordering: .relaxed)
        stopped.wait()
        return peak.withLock { $0 }
    }
}

private extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
