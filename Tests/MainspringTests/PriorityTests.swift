import Foundation
import Testing
@testable import Mainspring

@Suite("Input first: polling under a flood of work", .serialized)
struct PriorityTests {
    @Test("input waits at most about one poll interval behind a flood of 1 ms normal callbacks")
    func inputNotStuckBehindFlood() async throws {
        let latencies = try await onLoopThread { loop -> [Duration] in
            let pipe = Pipe()
            nonisolated(unsafe) var latencies: [Duration] = []
            nonisolated(unsafe) var writtenAt = ContinuousClock.now
            nonisolated(unsafe) var remaining = 400
            // 400 callbacks of 1 ms each, all posted at once (the naive flood).
            for _ in 0..<400 {
                loop.execute {
                    let end = ContinuousClock.now + .milliseconds(1)
                    while ContinuousClock.now < end {}
                    remaining -= 1
                }
            }
            var buffer = [UInt8](repeating: 0, count: 16)
            let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in
                _ = buffer.withUnsafeMutableBytes { read(pipe.readEnd, $0.baseAddress, $0.count) }
                latencies.append(ContinuousClock.now - writtenAt)
            }
            // Input arrives every 20 ms while the flood runs; written from the loop itself (a
            // timer at .normal would queue behind the flood, so use another thread).
            let writer = startThread {
                for _ in 0..<10 {
                    usleep(20_000)
                    loop.execute(priority: .input) { writtenAt = ContinuousClock.now; pipe.write("x") }
                }
            }
            loop.spin(until: { remaining == 0 && latencies.count == 10 }, timeout: .seconds(30))
            writer.wait()
            watcher.cancel()
            return latencies
        }
        #expect(latencies.count == 10)
        // Default poll interval 2 ms + one 1 ms callback in progress; generous for a loaded CI box.
        for latency in latencies { #expect(latency < .milliseconds(25), "input waited \(latency)") }
    }

    @Test("background work still runs while input keeps the loop busy")
    func backgroundNotStarved() async throws {
        let (share, longestGap) = try await onLoopThread { loop -> (Double, Duration) in
            nonisolated(unsafe) var backgroundRuns: [ContinuousClock.Instant] = []
            nonisolated(unsafe) var inputBusy = true
            // A chain of 0.5 ms background items, and a chain of 0.5 ms input items that keeps
            // the loop saturated for 300 ms.
            @Sendable func background() {
                backgroundRuns.append(.now)
                let end = ContinuousClock.now + .microseconds(500)
                while ContinuousClock.now < end {}
                if inputBusy { loop.execute(priority: .background, background) }
            }
            let stopAt = ContinuousClock.now + .milliseconds(300)
            @Sendable func input() {
                let end = ContinuousClock.now + .microseconds(500)
                while ContinuousClock.now < end {}
                if ContinuousClock.now < stopAt { loop.execute(priority: .input, input) } else { inputBusy = false }
            }
            let before = loop.metrics
            loop.execute(priority: .input, input)
            loop.execute(priority: .background, background)
            loop.spin(until: { !inputBusy }, timeout: .seconds(10))
            let after = loop.metrics
            let bg = (after.busyTime[.background]! - before.busyTime[.background]!).milliseconds
            let all = (after.totalBusyTime - before.totalBusyTime).milliseconds
            var gap = Duration.zero
            for (a, b) in zip(backgroundRuns, backgroundRuns.dropFirst()) { gap = max(gap, b - a) }
            return (bg / all, gap)
        }
        // Configured share 0.25 and max starvation 100 ms; generous bounds.
        #expect(share > 0.15, "background got \(share) of the busy time")
        #expect(longestGap < .milliseconds(150), "background waited \(longestGap)")
    }
}
