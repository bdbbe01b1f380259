import Foundation
import Testing
@testable import Mainspring

import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

/// Bytes the process has allocated with malloc and not freed (glibc's `mallinfo2`).
private func heapInUse() -> Int { Int(mallinfo2().uordblks) }

/// Runs `batch` once to warm up, then `rounds` more times, and returns the smallest growth of
/// `measure` (heap in use by default) over a round. A leak grows every round; what tests
/// running in parallel allocate or open comes and goes, so they cannot make every round grow.
private func smallestGrowth(of measure: () -> Int = heapInUse, rounds: Int = 3, _ batch: () throws -> Void) rethrows -> Int {
    try batch()
    var smallest = Int.max
    for _ in 0..<rounds {
        let before = measure()
        try batch()
        smallest = min(smallest, measure() - before)
    }
    return smallest
}

@Suite("Leaks: memory and descriptors stay flat", .serialized)
struct LeakTests {
    @Test("10,000 loops created and freed")
    func loops() async throws {
        let growth = try await onLoopThread { _ in
            try smallestGrowth {
                for _ in 0..<10_000 {
                    let loop = try EventLoop()
                    loop.execute {}
                    loop.runOnce(blocking: false)
                }
            }
        }
        // One leaked loop is > 60 KB (its histograms): 10,000 would be 600 MB. The bound leaves
        // room for what tests running in parallel allocate meanwhile.
        #expect(growth < 64 << 20, "heap grew \(growth) bytes per 10,000 loops")
    }

    @Test("100,000 timers and 10,000 watchers created, fired or cancelled")
    func timersAndWatchers() async throws {
        let growth = try await onLoopThread { loop in
            try smallestGrowth {
                var fired = 0
                for i in 0..<100_000 {
                    let handle = loop.schedule(after: .zero) { fired += 1 }
                    if i % 2 == 0 { handle.cancel() }
                }
                loop.spin(until: { fired == 50_000 }, timeout: .seconds(30))
                let pipe = Pipe()
                for _ in 0..<10_000 {
                    let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in }
                    watcher.cancel()
                }
            }
        }
        // A leaked timer is a source, a libevent event and a closure (> 300 bytes): 100,000
        // would be > 30 MB; the bound leaves room for tests running in parallel.
        #expect(growth < 24 << 20, "heap grew \(growth) bytes per round")
    }

    @Test("500 loopback connections opened and closed leave no descriptor, no source and no registration behind")
    func connections() async throws {
        let (fdGrowth, leftAlive, made, sourcesLeft) = try await onLoopThread { loop -> (Int, Int, Int, Int) in
            // Both sides' sources of the current round, weakly: alive after the round means leaked.
            nonisolated(unsafe) var sources: [WeakSource] = []
            let listener = try Listener(on: loop) { connection in
                sources.append(WeakSource(connection.source))
                connection.readLines { event in if event == .endOfFile { connection.close() } }
            }
            defer { listener.close() }
            var leftAlive = 0
            var made = 0
            var sourcesLeft = 0
            let fdGrowth = try smallestGrowth(of: openDescriptors) {
                sources.removeAll()
                var closed = 0
                for _ in 0..<500 {
                    let client = try Connection.connect(to: "127.0.0.1", port: listener.port, on: loop)
                    sources.append(WeakSource(client.source))
                    client.onClose { _ in closed += 1 }
                    client.write("hello\n")
                    client.shutdownOutput()
                    client.readLines { event in if event == .endOfFile { client.close() } }
                }
                loop.spin(until: { closed == 500 }, timeout: .seconds(60))
                #expect(closed == 500)
                // Closed on both sides: the loop lets go of every source (only the listener stays
                // registered) and every source is freed.
                loop.spin(until: { loop.sourceCount == 1 && sources.count == 1_000 && sources.allSatisfy { $0.source == nil } },
                          timeout: .seconds(10))
                made = sources.count
                leftAlive = max(leftAlive, sources.count(where: { $0.source != nil }))
                sourcesLeft = max(sourcesLeft, loop.sourceCount - 1)
            }
            return (fdGrowth, leftAlive, made, sourcesLeft)
        }
        #expect(made == 1_000, "\(made) connection sources made for 500 connections (both sides)")
        #expect(leftAlive == 0, "\(leftAlive) of 1,000 connection sources outlived their connection in a round")
        #expect(sourcesLeft == 0, "\(sourcesLeft) sources still registered on the loop after a round")
        // Each connection is two descriptors (client and server side): a leak of either would
        // add 500 every round. Descriptors that tests running in parallel open come and go, so
        // they cannot make every round grow.
        #expect(fdGrowth < 250, "\(fdGrowth) more open descriptors after a round of 500 connections")
    }
}

/// A connection's source, held weakly.
private struct WeakSource {
    weak var source: ConnectionSource?
    init(_ source: ConnectionSource) { self.source = source }
}

/// The process's open descriptors (entries of /proc/self/fd).
private func openDescriptors() -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? 0
}
