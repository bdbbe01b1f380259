import Foundation
import Testing
@testable import Mainspring

import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

/// Bytes the process has allocated with malloc and not freed (glibc's `mallinfo2`).
private func heapInUse() -> Int { Int(mallinfo2().uordblks) }

/// Runs `batch` once to warm up, then `rounds` more times, and returns the smallest heap growth
/// of a round. A leak grows every round; allocations by tests running in parallel come and go,
/// so they cannot make every round grow.
private func smallestGrowth(rounds: Int = 3, _ batch: () throws -> Void) rethrows -> Int {
    try batch()
    var smallest = Int.max
    for _ in 0..<rounds {
        let before = heapInUse()
        try batch()
        smallest = min(smallest, heapInUse() - before)
    }
    return smallest
}

@Suite("Leaks: memory stays flat", .serialized)
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

    @Test("500 loopback connections opened and closed")
    func connections() async throws {
        let growth = try await onLoopThread { loop in
            let listener = try Listener(on: loop) { connection in
                connection.readLines { event in if event == .endOfFile { connection.close() } }
            }
            defer { listener.close() }
            return try smallestGrowth {
                var closed = 0
                for _ in 0..<500 {
                    let client = try Connection.connect(to: "127.0.0.1", port: listener.port, on: loop)
                    client.onClose { _ in closed += 1 }
                    client.write("hello\n")
                    client.shutdownOutput()
                    client.readLines { event in if event == .endOfFile { client.close() } }
                }
                loop.spin(until: { closed == 500 }, timeout: .seconds(60))
                #expect(closed == 500)
                loop.spin(until: { loop.sourceCount <= 1 }, timeout: .seconds(5))
            }
        }
        // A leaked connection holds its 64 KiB read buffer: 500 would be > 30 MB.
        #expect(growth < 16 << 20, "heap grew \(growth) bytes per 500 connections")
    }
}
