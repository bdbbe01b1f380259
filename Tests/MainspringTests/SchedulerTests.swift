import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// A clock the test advances by hand: callbacks "take" exactly the time they add.
private final class ManualClock: SchedulerClock {
    var nanoseconds: UInt64 = 1_000_000_000
    func now() -> UInt64 { nanoseconds }
    func advance(_ delta: UInt64) { nanoseconds &+= delta }
}

private let microsecond: UInt64 = 1_000
private let millisecond: UInt64 = 1_000_000

/// A loop without libevent: the scheduler, a manual clock, and the test's own "polls" between
/// passes. Every callback advances the clock by its cost and logs its name and start time.
/// One thread only (the test's); `@unchecked Sendable` so that it can stand in for work posted
/// "from another thread" (`RemoteItem` closures are `@Sendable`).
private final class SimulatedLoop: @unchecked Sendable {
    let clock = ManualClock()
    let scheduler: Scheduler
    let policy: Scheduler.Policy
    private(set) var log: [(name: String, priority: Priority, start: UInt64, stamp: UInt64)] = []
    /// The credit after each callback, to check its limits.
    private(set) var creditTrace: [Int64] = []

    init(_ configuration: EventLoop.Configuration = .init()) {
        policy = Scheduler.Policy(configuration)
        scheduler = Scheduler(policy: policy, collectsQueueWait: true, now: clock.now())
    }

    func record(_ name: String, _ priority: Priority, cost: UInt64, then: (() -> Void)? = nil) -> ReadyRecord {
        let stamp = clock.now()
        return ReadyRecord(loopWork: { [unowned self] in
            log.append((name, priority, clock.now(), stamp))
            clock.advance(cost)
            then?()
        }, stamp: stamp, priority: priority)
    }

    func post(_ name: String, _ priority: Priority, cost: UInt64 = microsecond, then: (() -> Void)? = nil) {
        scheduler.enqueue(record(name, priority, cost: cost, then: then), priority)
    }

    func postNextTurn(_ name: String, _ priority: Priority, cost: UInt64, then: (() -> Void)? = nil) {
        scheduler.enqueueNextTurn(record(name, priority, cost: cost, then: then))
    }

    /// One loop iteration after the poll: next-turn work becomes ready, then one pass.
    @discardableResult
    func turn() -> Int {
        scheduler.promoteNextTurn(clock: clock)
        return scheduler.runPass(clock: clock) { [unowned self] in
            creditTrace.append(scheduler.backgroundCredit)
            return false
        }
    }

    func runUntilIdle(maxTurns: Int = 100_000) {
        var turns = 0
        while scheduler.hasReadyWork && turns < maxTurns {
            turn()
            turns += 1
        }
    }

    var order: [String] { log.map(\.name) }

    func busyTime(_ priority: Priority) -> UInt64 {
        scheduler.counters.snapshot().busyTime[priority].map { UInt64($0.components.attoseconds / 1_000_000_000) + UInt64($0.components.seconds) * 1_000_000_000 } ?? 0
    }
}

@Suite("Scheduler policy on a manual clock (no sleeps)")
struct SchedulerTests {
    @Test("strict priority order: input, then normal, then background, FIFO within each")
    func strictPriorityOrder() {
        let loop = SimulatedLoop()
        loop.post("b1", .background)
        loop.post("n1", .normal)
        loop.post("i1", .input)
        loop.post("b2", .background)
        loop.post("n2", .normal)
        loop.post("i2", .input)
        loop.turn()
        #expect(loop.order == ["i1", "i2", "n1", "n2", "b1", "b2"])
    }

    @Test("work posted from other threads takes turns with local work of its priority")
    func localAndRemoteAlternate() {
        let loop = SimulatedLoop()
        for i in 0..<3 { loop.post("local\(i)", .normal) }
        var queue = RemoteQueue()
        for i in 0..<3 {
            let name = "remote\(i)"
            queue.append(RemoteItem(work: { [unowned loop] in
                var record = loop.record(name, .normal, cost: microsecond)
                record.run()
            }, stamp: 0), .normal, clock: loop.clock)
        }
        #expect(loop.scheduler.takeRemote(from: &queue, now: loop.clock.now()) == 3)
        #expect(queue.isEmpty)
        loop.turn()
        #expect(loop.order == ["local0", "remote0", "local1", "remote1", "local2", "remote2"])
    }

    @Test("a naive flood of work yields to the poll within one poll interval (plus the callback in progress)")
    func floodYieldsWithinPollInterval() {
        let loop = SimulatedLoop(.init(pollInterval: .milliseconds(2)))
        for i in 0..<1_000 { loop.post("w\(i)", .normal, cost: 300 * microsecond) }
        var passes = 0
        while loop.scheduler.hasReadyWork {
            let start = loop.clock.now()
            let ran = loop.turn()
            let elapsed = loop.clock.now() - start
            // 2 ms of 0.3 ms callbacks: the 7th crosses the deadline and ends the pass.
            #expect(ran == 7 || !loop.scheduler.hasReadyWork)
            #expect(elapsed < 2 * millisecond + 300 * microsecond)
            passes += 1
        }
        #expect(passes == 143)  // ceil(1,000 / 7)
        #expect(loop.order.count == 1_000)
    }

    @Test("input that arrives during a flood runs first after the next poll")
    func inputFirstAfterPoll() {
        let loop = SimulatedLoop()
        for i in 0..<100 { loop.post("w\(i)", .normal, cost: 500 * microsecond) }
        loop.turn()
        let before = loop.log.count
        loop.post("input", .input)  // "polled": input became ready
        loop.turn()
        #expect(loop.log[before].name == "input")
    }

    @Test("background work keeps its guaranteed share under an input flood")
    func backgroundShareUnderInputFlood() {
        // Input arrives faster than it can be served (one every 100 µs, costing 150 µs), so
        // input is always waiting. A fed job queues a 200 µs slice for the next turn after each
        // slice, as `Feeder` does.
        let loop = SimulatedLoop(.init(pollInterval: .milliseconds(2), backgroundShare: 0.25))
        // The next slice, still queued at the end, holds `feed` and so the loop: drop it, or the
        // loop, its scheduler and every record left in it leak (LeakSanitizer reports them).
        defer { _ = loop.scheduler.removeAll() }
        var slices = 0
        func feed() {
            loop.postNextTurn("slice", .background, cost: 200 * microsecond) {
                slices += 1
                feed()
            }
        }
        feed()
        let start = loop.clock.now()
        let end = start + 1_000 * millisecond
        var nextArrival = start
        var inputs = 0
        while loop.clock.now() < end {
            // The poll: every input that arrived since the last one is ready now.
            while nextArrival <= loop.clock.now() {
                loop.post("input", .input, cost: 150 * microsecond)
                nextArrival += 100 * microsecond
                inputs += 1
            }
            loop.turn()
        }
        let background = Double(loop.busyTime(.background))
        let input = Double(loop.busyTime(.input))
        let share = background / (background + input)
        #expect(share > 0.22 && share < 0.3, "background share \(share)")
        #expect(slices > 1_000, "\(slices) slices")
        #expect(inputs > 9_000)
    }

    @Test("without a share, a waiting background record still runs within maxStarvation")
    func starvationBound() {
        let loop = SimulatedLoop(.init(pollInterval: .milliseconds(2), backgroundShare: 0,
                                       maxStarvation: .milliseconds(50)))
        loop.post("background", .background, cost: 100 * microsecond)
        var turns = 0
        while !loop.order.contains("background") && turns < 10_000 {
            for _ in 0..<5 { loop.post("input", .input, cost: 500 * microsecond) }
            loop.turn()
            turns += 1
        }
        let entry = try! #require(loop.log.first { $0.name == "background" })
        let waited = entry.start - entry.stamp
        #expect(waited >= 50 * millisecond)
        #expect(waited <= 50 * millisecond + 500 * microsecond, "waited \(waited) ns")
    }

    @Test("short bursts of input never wait behind background work (credit below a quantum)")
    func shortBurstsNeverWait() {
        let loop = SimulatedLoop(.init(pollInterval: .milliseconds(2), backgroundShare: 0.25))
        loop.post("background", .background, cost: 5 * millisecond)
        loop.post("input", .input, cost: 100 * microsecond)
        loop.turn()
        #expect(loop.order == ["input", "background"])
        // 100 µs of input while background waited earned 33 µs of credit: below the 1 ms quantum.
        #expect(loop.scheduler.backgroundCredit == 0)  // background then ran on an idle loop
    }

    @Test("credit is capped at maxStarvation and debt at two poll intervals")
    func creditAndDebtLimits() {
        let loop = SimulatedLoop(.init(pollInterval: .milliseconds(2), backgroundShare: 0.5,
                                       maxStarvation: .milliseconds(100)))
        // 1 s of input while background waits: 1 s of credit earned, capped at 100 ms.
        loop.post("background", .background, cost: 50 * millisecond)
        loop.post("long input", .input, cost: 1_000 * millisecond)
        loop.post("more input", .input, cost: microsecond)
        _ = loop.scheduler.runPass(clock: loop.clock) { true }  // just the long input callback
        #expect(loop.scheduler.backgroundCredit == Int64(loop.policy.maxBackgroundCredit))
        // Background (50 ms) runs next on credit while input waits: spends it, down to no less
        // than the debt limit.
        for _ in 0..<3 {
            loop.post("background", .background, cost: 150 * millisecond)
            loop.post("input", .input, cost: microsecond)
        }
        loop.runUntilIdle()
        #expect(loop.creditTrace.allSatisfy { $0 >= -loop.policy.maxBackgroundDebt && $0 <= loop.policy.maxBackgroundCredit })
        #expect(loop.creditTrace.contains(-loop.policy.maxBackgroundDebt))
    }

    @Test("afterInput runs once a pass's input records have run and lower-priority work is next, and again after more input; its time is no callback's")
    func afterInputBeforeLowerPriority() {
        let loop = SimulatedLoop()
        var flushes: [Int] = []  // how many callbacks had run at each call
        func pass() {
            _ = loop.scheduler.runPass(clock: loop.clock, afterInput: { flushes.append(loop.order.count) }) { false }
        }
        // Input only, then lower-priority work only: no call.
        loop.post("i1", .input)
        pass()
        loop.post("n1", .normal)
        loop.post("b1", .background)
        pass()
        #expect(flushes.isEmpty)
        // Input, then normal work, which posts input, then more normal work: a call before each
        // lower-priority record that follows input.
        loop.post("i2", .input)
        loop.post("i3", .input)
        loop.post("n2", .normal) { loop.post("i4", .input) }
        loop.post("n3", .normal)
        pass()
        #expect(loop.order == ["i1", "n1", "b1", "i2", "i3", "n2", "i4", "n3"])
        #expect(flushes == [5, 7])
        // The call's time is nobody's callback time, and counts against the pass: 5 ms of it
        // end the pass (poll interval 2 ms) before n4.
        loop.post("i5", .input)
        loop.post("n4", .normal, cost: microsecond)
        _ = loop.scheduler.runPass(clock: loop.clock, afterInput: { loop.clock.advance(5 * millisecond) }) { false }
        #expect(loop.order.last == "i5")
        loop.turn()
        #expect(loop.order.suffix(2) == ["i5", "n4"])
        #expect(loop.scheduler.counters.snapshot().longestCallback < .milliseconds(1))
    }

    @Test("next-turn work becomes ready only after the following poll")
    func nextTurnWaitsForPoll() {
        let loop = SimulatedLoop()
        loop.postNextTurn("later", .normal, cost: microsecond)
        loop.post("now", .normal)
        _ = loop.scheduler.runPass(clock: loop.clock) { false }
        #expect(loop.order == ["now"])
        loop.turn()
        #expect(loop.order == ["now", "later"])
    }

    @Test("queue waits are measured from when a record became ready")
    func queueWaitMeasured() {
        let loop = SimulatedLoop()
        loop.post("first", .normal, cost: 3 * millisecond)
        loop.post("second", .normal, cost: microsecond)
        loop.runUntilIdle()
        let wait = loop.scheduler.counters.snapshot().queueWait[.normal]
        #expect(wait?.count == 2)
        #expect(wait?.max == .milliseconds(3))
    }
}
