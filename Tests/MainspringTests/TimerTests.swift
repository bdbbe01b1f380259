import Foundation
import Testing
@testable import Mainspring

@Suite("Timers", .serialized)
struct TimerTests {
    @Test("a timer never fires before its deadline")
    func neverEarly() async throws {
        let lateness = try await onLoopThread { loop -> [Duration] in
            nonisolated(unsafe) var lateness: [Duration] = []
            for ms in [0, 1, 2, 5, 10, 20, 35, 50] {
                let start = ContinuousClock.now
                let delay = Duration.milliseconds(ms)
                loop.schedule(after: delay) { lateness.append(ContinuousClock.now - start - delay) }
            }
            loop.spin(until: { lateness.count == 8 }, timeout: .seconds(10))
            return lateness
        }
        #expect(lateness.count == 8)
        for late in lateness { #expect(late >= .zero, "fired \(late) early") }
    }

    @Test("a cancelled timer never fires, even when it is already due")
    func cancelWorks() async throws {
        let fired = try await onLoopThread { loop -> [String] in
            nonisolated(unsafe) var fired: [String] = []
            let a = loop.schedule(after: .milliseconds(10)) { fired.append("a") }
            loop.schedule(after: .milliseconds(30)) { fired.append("b") }
            a.cancel()
            #expect(a.isCancelled)
            // Both timers due together; the first handler cancels the second one.
            var second: TimerHandle?
            loop.schedule(after: .milliseconds(5)) {
                fired.append("c")
                second?.cancel()
            }
            second = loop.schedule(after: .milliseconds(5)) { fired.append("d") }
            // Let both become due before the loop runs them.
            usleep(20_000)
            loop.spin(until: { fired.contains("b") }, timeout: .seconds(5))
            a.cancel()  // idempotent
            return fired
        }
        #expect(fired == ["c", "b"])
    }

    @Test("a 10 ms repeating timer fires about 50 times in 500 ms and can cancel itself")
    func repeatingCount() async throws {
        let (count, elapsed) = try await onLoopThread { loop -> (Int, Duration) in
            nonisolated(unsafe) var count = 0
            let start = ContinuousClock.now
            let timer = loop.schedule(every: .milliseconds(10)) { _ in count += 1 }
            loop.spin(until: { false }, timeout: .milliseconds(500))
            timer.cancel()
            let elapsed = ContinuousClock.now - start
            // And one that cancels itself on its third tick.
            nonisolated(unsafe) var ticks = 0
            loop.schedule(every: .milliseconds(1)) { handle in
                ticks += 1
                if ticks == 3 { handle.cancel() }
            }
            loop.spin(until: { false }, timeout: .milliseconds(30))
            #expect(ticks == 3)
            return (count, elapsed)
        }
        // On the grid: floor(elapsed / 10 ms) ticks, minus the odd one lost to a heavy load.
        let expected = Int(elapsed.milliseconds / 10)
        #expect(count <= expected)
        #expect(count >= 40, "only \(count) ticks in \(elapsed)")
    }

    @Test("a repeating timer skips missed ticks instead of bursting, and stays on its grid")
    func noBurstNoDrift() async throws {
        let times = try await onLoopThread { loop -> [Duration] in
            let start = ContinuousClock.now
            nonisolated(unsafe) var times: [Duration] = []
            let timer = loop.schedule(every: .milliseconds(20)) { _ in
                times.append(ContinuousClock.now - start)
                if times.count == 2 { usleep(70_000) }  // miss three ticks
            }
            loop.spin(until: { times.count == 5 }, timeout: .seconds(5))
            timer.cancel()
            return times
        }
        #expect(times.count == 5)
        // Tick 2 at ~40 ms blocks until ~110 ms: ticks at 60/80/100 are skipped, next is 120.
        #expect(times[2] >= .milliseconds(120))
        #expect(times[3] >= .milliseconds(140))
        #expect(times[3] - times[2] >= .milliseconds(15), "burst: \(times)")
        // Deadlines stay on the 20 ms grid: no accumulated drift.
        #expect(times[4] < .milliseconds(160) + .milliseconds(40), "drifted: \(times)")
    }

    @Test("negative delays count as zero")
    func negativeDelay() async throws {
        let fired = try await onLoopThread { loop -> Bool in
            nonisolated(unsafe) var fired = false
            loop.schedule(after: .milliseconds(-5)) { fired = true }
            return loop.spin(until: { fired }, timeout: .seconds(2))
        }
        #expect(fired)
    }

    @Test("a fired one-shot timer leaves no source behind")
    func oneShotCleansUp() async throws {
        let counts = try await onLoopThread { loop -> (Int, Int) in
            let before = loop.sourceCount
            nonisolated(unsafe) var n = 0
            for _ in 0..<100 { loop.schedule(after: .zero) { n += 1 } }
            loop.spin(until: { n == 100 }, timeout: .seconds(5))
            return (before, loop.sourceCount)
        }
        #expect(counts.0 == counts.1)
    }
}
