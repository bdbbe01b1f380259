import Foundation
import Testing
@testable import Mainspring

@Suite("Input first: polling under a flood of work", .serialized)
struct PriorityTests {
    @Test("input waits at most about one poll interval of loop work behind a flood of 1 ms callbacks")
    func inputNotStuckBehindFlood() async throws {
        let latencies = try await onLoopThread { loop -> [UInt64] in
            let pipe = Pipe()
            nonisolated(unsafe) var latencies: [UInt64] = []
            nonisolated(unsafe) var remaining = 400
            // 400 callbacks of 1 ms each, all posted at once (the naive flood).
            for _ in 0..<400 {
                loop.execute {
                    let end = ContinuousClock.now + .milliseconds(1)
                    while ContinuousClock.now < end {}
                    remaining -= 1
                }
            }
            // The latency is measured in the loop thread's CPU time, not wall time: on a loaded
            // 2-core machine the OS may deschedule the loop thread for tens of milliseconds, but
            // what the loop controls is how much work it does before it serves the input. Each
            // input event carries the loop thread's CPU clock at the time of the write.
            var clock = clockid_t()
            pthread_getcpuclockid(pthread_self(), &clock)
            let loopClock = clock
            @Sendable func cpuNanoseconds(_ clock: clockid_t) -> UInt64 {
                var ts = timespec()
                clock_gettime(clock, &ts)
                return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
            }
            var record = [UInt8](repeating: 0, count: 8)
            let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in
                let n = record.withUnsafeMutableBytes { read(pipe.readEnd, $0.baseAddress, 8) }
                guard n == 8 else { return }
                let written = record.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
                latencies.append(cpuNanoseconds(CLOCK_THREAD_CPUTIME_ID) &- written)
            }
            let writer = startThread {
                for _ in 0..<10 {
                    usleep(20_000)
                    withUnsafeBytes(of: cpuNanoseconds(loopClock)) { pipe.write(Array($0)) }
                }
            }
            loop.spin(until: { remaining == 0 && latencies.count == 10 }, timeout: .seconds(60))
            writer.wait()
            watcher.cancel()
            return latencies
        }
        #expect(latencies.count == 10)
        // Poll interval 2 ms + one 1 ms callback in progress, with a generous margin.
        for latency in latencies { #expect(latency < 15_000_000, "input waited \(Double(latency) / 1e6) ms of loop work") }
    }

    @Test("background work still runs while input keeps the loop busy")
    func backgroundNotStarved() async throws {
        let (share, longestGap) = try await onLoopThread { loop -> (Double, Duration) in
            // When each background item ran, in the loop thread's CPU time: the loop work that
            // went by between two of them. Wall time would also count the loop's thread being
            // descheduled (a loaded machine), which no priority rule can help.
            nonisolated(unsafe) var backgroundRuns: [Duration] = []
            nonisolated(unsafe) var inputBusy = true
            // A chain of 0.5 ms background items, and a chain of 0.5 ms input items that keeps
            // the loop saturated for 300 ms.
            @Sendable func background() {
                backgroundRuns.append(threadCPUTime())
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
        #expect(longestGap < .milliseconds(150), "background waited \(longestGap) of loop work")
    }
}
