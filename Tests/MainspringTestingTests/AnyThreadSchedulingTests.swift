import Mainspring
import MainspringTestSupport
import MainspringTesting
import Synchronization
import Testing

/// The any-thread forms of the loop's timers and the feeder's jobs (`execute(after:)`,
/// `execute(every:)`, `Feeder.enqueue(chunks:)`, `enqueue(_:_:)`), called from a plain thread
/// and timed on virtual time: each run at its exact instant, on the loop's thread.
@Suite struct AnyThreadSchedulingTests {
    @Test func timersScheduledFromAPlainThreadRunOnTheLoopAtTheirInstants() async throws {
        let simulation = try Simulation(seed: 1)
        let loop = simulation.loop
        simulation.advance(by: .milliseconds(5))  // the deadlines count from the call, not from zero
        let runs = Locked<[String]>([])
        @Sendable func record(_ what: String) {
            runs.withLock { $0.append("\(what)@\(simulation.now)\(loop.isCurrent ? "" : " OFF THE LOOP")") }
        }
        let (once, cancelledFirst, repeating, negative) = await onPlainThread {
            #expect(!loop.isCurrent)
            let once = loop.execute(after: .milliseconds(30)) { record("once") }
            let cancelledFirst = loop.execute(after: .milliseconds(20)) { record("cancelled") }
            cancelledFirst.cancel()
            let count = Locked(0)
            let repeating = loop.execute(every: .milliseconds(10)) { timer in
                record("tick")
                if count.withLock({ $0 += 1; return $0 }) == 3 { timer.cancel() }
            }
            let negative = loop.execute(after: .seconds(-5)) { record("negative") }
            return (once, cancelledFirst, repeating, negative)
        }
        #expect(cancelledFirst.isCancelled && !once.isCancelled && !repeating.isCancelled)
        simulation.advance(by: .milliseconds(100))
        #expect(runs.value == [
            "negative@0.005 seconds",
            "tick@0.015 seconds", "tick@0.025 seconds",
            "once@0.035 seconds", "tick@0.035 seconds",
        ])
        #expect(once.isCancelled && repeating.isCancelled && negative.isCancelled)
        // Cancelled from within, the repeating timer is gone: nothing is left to run.
        simulation.advance(by: .seconds(1))
        #expect(runs.withLock { $0.count } == 5)
        try await simulation.run {}
    }

    @Test func aRepeatingTimerCancelledFromAnotherThreadStopsBeforeItsNextRun() async throws {
        let simulation = try Simulation(seed: 2)
        let loop = simulation.loop
        let ticks = Locked<[Duration]>([])
        let timer = await onPlainThread {
            loop.execute(every: .milliseconds(10)) { _ in ticks.withLock { $0.append(simulation.now) } }
        }
        simulation.advance(by: .milliseconds(25))
        await onPlainThread { timer.cancel(); timer.cancel() }  // idempotent
        #expect(timer.isCancelled)
        simulation.advance(by: .milliseconds(100))
        #expect(ticks.value == [.milliseconds(10), .milliseconds(20)])
    }

    @Test func onTheLoopTheyAreTheLoopOnlyFormsWithAHandleForAnyThread() async throws {
        let simulation = try Simulation(seed: 3)
        let loop = simulation.loop
        let times = try await simulation.run { () async throws -> [Duration] in
            let runs = Locked<[Duration]>([])
            // The loop-only form from a synchronous function on the loop (the compiler refuses it
            // in async code); the any-thread form beside it.
            func loopOnly() { loop.schedule(after: .milliseconds(7)) { runs.withLock { $0.append(simulation.now) } } }
            loopOnly()
            let handle = loop.execute(after: .milliseconds(7)) { runs.withLock { $0.append(simulation.now) } }
            let cancelled = loop.execute(after: .milliseconds(3)) { runs.withLock { $0.append(.seconds(-1)) } }
            cancelled.cancel()
            try await loop.sleep(for: .milliseconds(10))
            #expect(handle.isCancelled)  // a one-shot that ran
            return runs.value
        }
        #expect(times == [.milliseconds(7), .milliseconds(7)])
    }

    @Test func feederJobsEnqueuedFromAPlainThreadRunInOrderOnTheLoop() async throws {
        let simulation = try Simulation(seed: 4)
        let loop = simulation.loop
        let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
        let seen = Locked<[String]>([])
        let (counted, listed, empty) = await onPlainThread {
            let counted = feeder.enqueue(chunks: 3) { index in
                seen.withLock { $0.append("c\(index)\(loop.isCurrent ? "" : "!")") }
            }
            let listed = feeder.enqueue(["a", "b"]) { item in
                seen.withLock { $0.append("\(item)\(loop.isCurrent ? "" : "!")") }
            }
            let empty = feeder.enqueue(chunks: -4) { _ in seen.withLock { $0.append("never") } }
            return (counted, listed, empty)
        }
        #expect(listed.progress.total == 2 && empty.progress.total == 0)
        simulation.runUntilIdle()
        #expect(seen.value == ["c0", "c1", "c2", "a", "b"])
        #expect(await counted.outcome == .completed)
        #expect(await listed.outcome == .completed)
        #expect(await empty.outcome == .completed)
        #expect(counted.progress.completed == 3 && listed.progress.completed == 2)
    }
}
