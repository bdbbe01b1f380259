import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore
import MainspringTesting

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

    @Test("a 10 ms repeating timer fires 50 times in 500 ms, each on its grid point, and can cancel itself")
    func repeatingCount() throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        var ticks: [Duration] = []
        let timer = loop.schedule(every: .milliseconds(10)) { _ in ticks.append(simulation.now) }
        simulation.advance(by: .milliseconds(505))
        timer.cancel()
        #expect(ticks == (1...50).map { Duration.milliseconds(10 * $0) })
        // And one that cancels itself on its third tick: twenty more intervals, no fourth.
        var own = 0
        loop.schedule(every: .milliseconds(1)) { handle in
            own += 1
            if own == 3 { handle.cancel() }
        }
        simulation.advance(by: .milliseconds(23))
        #expect(own == 3)
    }

    @Test("a repeating timer skips missed ticks instead of bursting, and stays on its grid")
    func noBurstNoDrift() throws {
        let simulation = try Simulation()
        var times: [Duration] = []
        let timer = simulation.loop.schedule(every: .milliseconds(20)) { _ in
            times.append(simulation.now)
            if times.count == 2 { simulation.consume(.milliseconds(70)) }  // miss three ticks
        }
        simulation.advance(by: .milliseconds(170))
        timer.cancel()
        // Tick 2 at 40 ms computes until 110 ms: the ticks at 60, 80 and 100 are skipped (not
        // burst at 110), and the grid holds: 120, 140, 160.
        #expect(times == [.milliseconds(20), .milliseconds(40), .milliseconds(120), .milliseconds(140),
                          .milliseconds(160)])
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

/// Timers due at the same instant fire in the order they were scheduled. libevent keeps timer
/// deadlines in microseconds in a heap that is not stable for equal keys, and an optimised build
/// schedules several timers within one microsecond: these tests matter most in release builds
/// (`make test-release`).
@Suite("Timer order", .serialized)
struct TimerOrderTests {
    @Test("timers scheduled back to back with one delay fire in creation order (batches of 1 to 1,000)")
    func sameDelayFiresInCreationOrder() async throws {
        let failures = try await onLoopThread { loop -> [String] in
            var failures: [String] = []
            for round in 0..<20 {
                for batch in [1, 2, 3, 10, 100, 1_000] {
                    nonisolated(unsafe) var fired: [Int] = []
                    fired.reserveCapacity(batch)
                    let delay = Duration.milliseconds(2)
                    for index in 0..<batch { loop.schedule(after: delay) { fired.append(index) } }
                    loop.spin(until: { fired.count == batch }, timeout: .seconds(10))
                    if fired != Array(0..<batch) {
                        failures.append("round \(round), batch \(batch): \(fired.prefix(20))…")
                    }
                }
            }
            return failures
        }
        #expect(failures.count == 0, "batches out of order: \(failures.prefix(5))")
    }

    @Test("timers with non-decreasing delays, scheduled back to back, fire in creation order")
    func nonDecreasingDelaysFireInOrder() async throws {
        let failures = try await onLoopThread { loop -> [String] in
            var failures: [String] = []
            for round in 0..<20 {
                let batch = 500
                nonisolated(unsafe) var fired: [Int] = []
                fired.reserveCapacity(batch)
                // Runs of equal delays, a few nanoseconds to microseconds apart.
                for index in 0..<batch {
                    let delay = Duration.milliseconds(2) + .nanoseconds(index / 7 * (round % 2 == 0 ? 3 : 700))
                    loop.schedule(after: delay) { fired.append(index) }
                }
                loop.spin(until: { fired.count == batch }, timeout: .seconds(10))
                if fired != Array(0..<batch) { failures.append("round \(round): \(fired.prefix(20))…") }
            }
            return failures
        }
        #expect(failures.count == 0, "batches out of order: \(failures.prefix(5))")
    }

    @Test("repeating timers created back to back with one interval tick in creation order")
    func repeatingTimersTickInCreationOrder() async throws {
        let failures = try await onLoopThread { loop -> [String] in
            var failures: [String] = []
            for round in 0..<10 {
                for batch in [2, 10, 100, 1_000] {
                    nonisolated(unsafe) var fired: [Int] = []
                    let handles = (0..<batch).map { index in
                        loop.schedule(every: .milliseconds(5)) { _ in fired.append(index) }
                    }
                    // Block the loop past two ticks: every timer's first tick is due when it polls,
                    // so the first batch comes from one poll, in deadline order.
                    usleep(12_000)
                    loop.spin(until: { fired.count >= batch }, timeout: .seconds(10))
                    for handle in handles { handle.cancel() }
                    if Array(fired.prefix(batch)) != Array(0..<batch) {
                        failures.append("round \(round), batch \(batch): \(fired.prefix(20))…")
                    }
                }
            }
            return failures
        }
        #expect(failures.count == 0, "ticks out of order: \(failures.prefix(5))")
    }

    @Test("sleep(for:) with one duration, called in order, resumes in that order")
    func sleepsResumeInOrder() async throws {
        let failures = try await onLoopThread { loop -> [String] in
            // Tasks that prefer the loop as their executor run `sleep(for:)` (a nonisolated async
            // function) on the loop's thread, one after another in creation order, and resume
            // there in the order their timers fire.
            let executor = LoopTaskExecutor(loop: loop)
            var failures: [String] = []
            for round in 0..<5 {
                for batch in [2, 10, 100, 500] {
                    let resumed = Locked<[Int]>([])
                    for index in 0..<batch {
                        Task(executorPreference: executor) {
                            try await loop.sleep(for: .milliseconds(2))
                            resumed.withLock { $0.append(index) }
                        }
                    }
                    if !loop.spin(until: { resumed.value.count == batch }, timeout: .seconds(10)) {
                        failures.append("round \(round), batch \(batch): timed out")
                    } else if resumed.value != Array(0..<batch) {
                        failures.append("round \(round), batch \(batch): \(resumed.value.prefix(20))…")
                    }
                }
            }
            return failures
        }
        #expect(failures.count == 0, "sleeps resumed out of order: \(failures.prefix(5))")
    }

    @Test("timelines started back to back with one frame rate deliver their first frames in start order")
    func timelineFramesInStartOrder() async throws {
        let failures = try await onLoopThread { loop -> [String] in
            var failures: [String] = []
            for round in 0..<10 {
                for count in [2, 10, 100] {
                    nonisolated(unsafe) var firstUpdates: [Int] = []
                    nonisolated(unsafe) var seen = Set<Int>()
                    nonisolated(unsafe) var finished = 0
                    for index in 0..<count {
                        let timeline = Timeline(loop: loop, framesPerSecond: 500)
                        timeline.step(duration: .milliseconds(10), curve: .linear) { _ in
                            if seen.insert(index).inserted { firstUpdates.append(index) }
                        }
                        timeline.start { _ in finished += 1 }
                    }
                    loop.spin(until: { finished == count }, timeout: .seconds(10))
                    if firstUpdates != Array(0..<count) {
                        failures.append("round \(round), \(count) timelines: \(firstUpdates.prefix(20))…")
                    }
                }
            }
            return failures
        }
        #expect(failures.count == 0, "first frames out of order: \(failures.prefix(5))")
    }
}

/// Runs a task's jobs on a loop, in FIFO order (`execute`): with it as the task's executor
/// preference, nonisolated async code runs on the loop's thread.
private final class LoopTaskExecutor: TaskExecutor {
    let loop: EventLoop

    init(loop: EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        loop.execute { job.runSynchronously(on: executor) }
    }
}
