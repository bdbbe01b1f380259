import Foundation
import Observation
import Synchronization
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore

/// An `AsyncOperation` whose work is a closure handed the operation (so it can finish it).
final class TestOperation: AsyncOperation, @unchecked Sendable {
    private let work: @Sendable (TestOperation) -> Void
    private let executions = Atomic<Int>(0)

    init(_ work: @escaping @Sendable (TestOperation) -> Void) {
        self.work = work
        super.init()
    }

    /// How many times `execute()` ran.
    var executionCount: Int { executions.load(ordering: .acquiring) }

    override func execute() {
        executions.add(1, ordering: .acquiringAndReleasing)
        work(self)
    }
}

/// Finishes `operation` from a random place: inline, a Dispatch thread (now or a little later),
/// or a brand-new thread. `done` is left once `finish()` has returned.
func finishOnRandomThread(_ operation: AsyncOperation, done: DispatchGroup) {
    done.enter()
    let finish: @Sendable () -> Void = {
        operation.finish()
        done.leave()
    }
    switch Int.random(in: 0..<4) {
    case 0: finish()
    case 1: DispatchQueue.global().async(execute: finish)
    case 2: DispatchQueue.global(qos: .utility).asyncAfter(deadline: .now() + .microseconds(Int.random(in: 0...2_000)), execute: finish)
    default: Thread.detachNewThread(finish)
    }
}

/// Collects operations as they start and, once all `expected` have, finishes them all at once
/// with `concurrentPerform` on every core: the last finishes race each other.
final class FinishBurst: Sendable {
    private let expected: Int
    private let arrived = Locked<[AsyncOperation]>([])
    private let done: DispatchGroup

    init(expected: Int, done: DispatchGroup) {
        self.expected = expected
        self.done = done
    }

    func arrive(_ operation: AsyncOperation) {
        done.enter()
        let all = arrived.withLock { arrived -> [AsyncOperation] in
            arrived.append(operation)
            guard arrived.count == expected else { return [] }
            // Hand them over and forget them: each operation's closure holds this burst.
            defer { arrived.removeAll() }
            return arrived
        }
        guard !all.isEmpty else { return }
        DispatchQueue.global().async { [done] in
            DispatchQueue.concurrentPerform(iterations: all.count) { index in
                all[index].finish()
                done.leave()
            }
        }
    }
}

/// Waits until every post made to `loop` by other threads so far has run: posts a marker from
/// another thread (cross-thread posts run in FIFO order) and spins until it ran.
func flushRemotePosts(_ loop: EventLoop) -> Bool {
    let flushed = Counter()
    startThread { loop.execute { flushed.increment() } }.wait()
    return loop.spin(until: { flushed.count == 1 }, timeout: .seconds(10))
}

@Suite("Operations: AsyncOperation, SpinningOperation, completion hooks", .serialized)
struct OperationTests {
    // MARK: Drains

    @Test("1,000 operations finishing on random threads, 8 drains (half in one burst): onDrained once per drain")
    func drainedOncePerDrain() async throws {
        let rounds = 8
        let (drains, executions, finished, foundationCount) = try await onLoopThread { loop -> (Int, [Int], Bool, Int) in
            let queue = TrackedOperationQueue()
            let drains = Counter()
            let offLoop = Counter()
            let finishers = DispatchGroup()
            queue.onDrained(on: loop) {
                if !loop.isCurrent { offLoop.increment() }
                drains.increment()
            }
            var all: [TestOperation] = []
            for round in 1...rounds {
                // Odd rounds: each operation finishes at a random moment on a random thread.
                // Even rounds: all of them finish in one burst on every core.
                let burst = FinishBurst(expected: 1_000, done: finishers)
                let batch = (0..<1_000).map { _ in
                    TestOperation { operation in
                        if round % 2 == 1 {
                            finishOnRandomThread(operation, done: finishers)
                        } else {
                            burst.arrive(operation)
                        }
                    }
                }
                all += batch
                queue.addTrackedOperations(batch)
                #expect(loop.spin(until: { drains.count >= round }, timeout: .seconds(30)), "round \(round) drained")
            }
            // Every finish() has returned, so any duplicate hook has been posted by now.
            #expect(finishers.wait(timeout: .now() + 30) == .success)
            #expect(flushRemotePosts(loop))
            #expect(offLoop.count == 0, "hooks run on their loop")
            queue.waitUntilAllOperationsAreFinished()
            return (drains.count, all.map(\.executionCount), all.allSatisfy(\.isFinished), queue.operationCount)
        }
        #expect(drains == rounds)
        #expect(executions.count == rounds * 1_000)
        #expect(executions.allSatisfy { $0 == 1 }, "each operation executed once")
        #expect(finished)
        #expect(foundationCount == 0)
    }

    @Test("BlockOperations are tracked too: one drain per batch; a cancelled hook never runs again")
    func blockOperationsAndCancelledHook() async throws {
        let (kept, cancelled, ran) = try await onLoopThread { loop -> (Int, Int, Int) in
            let queue = TrackedOperationQueue()
            let kept = Counter()
            let cancelled = Counter()
            let ran = Counter()
            queue.onDrained(on: loop) { kept.increment() }
            let hook = queue.onDrained(on: loop) { cancelled.increment() }
            for round in 1...3 {
                if round == 2 {
                    hook.cancel()
                    #expect(hook.isCancelled)
                }
                let batch = (0..<200).map { _ in
                    BlockOperation {
                        usleep(UInt32.random(in: 0...200))
                        ran.increment()
                    }
                }
                queue.addTrackedOperations(batch)
                #expect(loop.spin(until: { kept.count >= round && cancelled.count >= 1 }, timeout: .seconds(30)))
            }
            queue.waitUntilAllOperationsAreFinished()
            #expect(flushRemotePosts(loop))
            return (kept.count, cancelled.count, ran.count)
        }
        #expect(kept == 3)
        #expect(cancelled == 1, "the cancelled hook ran for the first drain only")
        #expect(ran == 600)
    }

    // MARK: Dependencies and waiting

    @Test("dependencies are honoured; waitUntilFinished and the plain queue wait work")
    func dependencies() throws {
        let log = Locked<[String]>([])
        let queue = OperationQueue()
        let done = DispatchGroup()
        func step(_ name: String) -> TestOperation {
            TestOperation { operation in
                log.withLock { $0.append("start \(name)") }
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int.random(in: 1...20))) {
                    log.withLock { $0.append("end \(name)") }
                    finishOnRandomThread(operation, done: done)
                }
            }
        }
        // a → b → c, and d waits for a, b and c; e (a BlockOperation) waits for d.
        let a = step("a"), b = step("b"), c = step("c"), d = step("d")
        b.addDependency(a)
        c.addDependency(b)
        for dependency in [a, b, c] { d.addDependency(dependency) }
        let e = BlockOperation { log.withLock { $0.append("start e") } }
        e.addDependency(d)
        queue.addOperations([e, d, c, b, a], waitUntilFinished: false)
        let waited = startThread { e.waitUntilFinished() }
        #expect(waited.wait(timeout: .now() + 20) == .success, "waitUntilFinished returned")
        queue.waitUntilAllOperationsAreFinished()
        let entries = log.value
        func index(_ entry: String) -> Int { entries.firstIndex(of: entry) ?? -1 }
        #expect(entries.count == 9)
        #expect(index("end a") < index("start b"))
        #expect(index("end b") < index("start c"))
        for name in ["a", "b", "c"] { #expect(index("end \(name)") < index("start d")) }
        #expect(index("end d") < index("start e"))
        #expect([a, b, c, d, e].allSatisfy { $0.isFinished && !$0.isExecuting })
    }

    @Test("waitUntilAllOperationsAreFinished(spinning:) runs completions delivered to the waiting loop")
    func spinningWait() async throws {
        let (before, after, hooks, waited, onLoop) = try await onLoopThread { loop -> (Int, Int, Int, Bool, Bool) in
            let queue = OperationQueue()
            queue.maxConcurrentOperationCount = 3
            let completions = Counter()
            let hooks = Counter()
            let offLoop = Counter()
            let operations = (0..<50).map { _ in
                TestOperation { operation in
                    // The callback is delivered on the waiting thread.
                    DispatchQueue.global().async {
                        loop.execute {
                            if !loop.isCurrent { offLoop.increment() }
                            completions.increment()
                            operation.finish()
                        }
                    }
                }
            }
            for operation in operations { operation.onFinish(on: loop) { hooks.increment() } }
            queue.addOperations(operations, waitUntilFinished: false)
            // No completion can have run yet: they all need this thread, which a plain
            // waitUntilAllOperationsAreFinished() would block for good.
            let before = completions.count
            let waited = queue.waitUntilAllOperationsAreFinished(spinning: loop, timeout: .seconds(30))
            let after = completions.count
            loop.spin(until: { hooks.count == 50 }, timeout: .seconds(10))
            return (before, after, hooks.count, waited, offLoop.count == 0)
        }
        #expect(before == 0)
        #expect(waited)
        #expect(after == 50)
        #expect(hooks == 50, "onFinish hooks ran on the waiting loop")
        #expect(onLoop)
    }

    @Test("waitUntilAllOperationsAreFinished(spinning:) times out, then succeeds once the work ends")
    func spinningWaitTimeout() async throws {
        let (first, elapsed, second, empty) = try await onLoopThread { loop -> (Bool, Duration, Bool, Bool) in
            let queue = OperationQueue()
            // Its execute() posts to the loop, so the waits below see that it started (on a
            // loaded machine the queue may start it after the first wait has timed out).
            let started = Counter()
            let stuck = TestOperation { _ in loop.execute { started.increment() } }
            queue.addOperation(stuck)
            let start = ContinuousClock.now
            let first = queue.waitUntilAllOperationsAreFinished(spinning: loop, timeout: .milliseconds(100))
            let elapsed = ContinuousClock.now - start
            // finish() only once the queue has started it (finishing an operation that was not
            // started is a precondition failure, which would end the whole test run).
            // Required: without the start, finish() below would trap.
            try #require(loop.spin(until: { started.count == 1 }, timeout: .seconds(30)), "the queue started the operation")
            loop.schedule(after: .milliseconds(20)) { stuck.finish() }
            let second = queue.waitUntilAllOperationsAreFinished(spinning: loop, timeout: .seconds(20))
            let empty = OperationQueue().waitUntilAllOperationsAreFinished(spinning: loop, timeout: .zero)
            return (first, elapsed, second, empty)
        }
        #expect(!first)
        #expect(elapsed >= .milliseconds(100))
        #expect(elapsed < .seconds(5))
        #expect(second)
        #expect(empty, "an empty queue returns true at once")
    }

    // MARK: Cancellation and finishing

    @Test("an operation cancelled before it starts finishes without execute(), with its hooks")
    func cancelledBeforeStart() async throws {
        let (executions, finished, hookRan, drained) = try await onLoopThread { loop -> (Int, Bool, Bool, Bool) in
            let queue = TrackedOperationQueue()
            let operation = TestOperation { $0.finish() }
            let hook = Counter()
            let drains = Counter()
            operation.onFinish(on: loop) { hook.increment() }
            queue.onDrained(on: loop) { drains.increment() }
            operation.cancel()
            queue.addTrackedOperation(operation)
            operation.waitUntilFinished()
            let ran = loop.spin(until: { hook.count == 1 && drains.count == 1 }, timeout: .seconds(10))
            return (operation.executionCount, operation.isFinished && !operation.isExecuting, ran, drains.count == 1)
        }
        #expect(executions == 0)
        #expect(finished)
        #expect(hookRan)
        #expect(drained)
    }

    @Test("a cancelled operation started by hand finishes at once; start() on a finished one is a no-op")
    func cancelledManualStart() {
        let operation = TestOperation { $0.finish() }
        operation.cancel()
        operation.start()
        #expect(operation.isFinished)
        #expect(operation.executionCount == 0)
        operation.start()
        #expect(operation.executionCount == 0)
    }

    @Test("cancelling an executing AsyncOperation leaves it to the subclass; dependents run after finish()")
    func cancelWhileExecuting() throws {
        let queue = OperationQueue()
        let started = DispatchSemaphore(value: 0)
        let operation = TestOperation { _ in started.signal() }
        let dependentRan = Counter()
        let dependent = BlockOperation { dependentRan.increment() }
        dependent.addDependency(operation)
        queue.addOperations([operation, dependent], waitUntilFinished: false)
        // Required: finish() on an operation the queue has not started would trap.
        try #require(started.wait(timeout: .now() + 30) == .success, "the queue started the operation")
        operation.cancel()
        #expect(operation.isCancelled)
        #expect(operation.isExecuting, "still executing: only the subclass knows how to stop its work")
        #expect(!operation.isFinished)
        #expect(dependentRan.count == 0)
        operation.finish()
        dependent.waitUntilFinished()
        #expect(operation.isFinished && !operation.isExecuting)
        #expect(dependentRan.count == 1)
    }

    @Test("finish() is idempotent: racing calls finish once, hooks and drain fire once")
    func finishIdempotent() async throws {
        let (hooks, drains, completionBlocks) = try await onLoopThread { loop -> (Int, Int, Int) in
            let queue = TrackedOperationQueue()
            let hooks = Counter()
            let drains = Counter()
            let completionBlocks = Counter()
            let racers = DispatchGroup()
            queue.onDrained(on: loop) { drains.increment() }
            let operations = (0..<100).map { _ in
                TestOperation { operation in
                    for _ in 0..<4 { finishOnRandomThread(operation, done: racers) }
                }
            }
            for operation in operations {
                operation.onFinish(on: loop) { hooks.increment() }
                operation.completionBlock = { completionBlocks.increment() }
            }
            queue.addTrackedOperations(operations)
            #expect(loop.spin(until: { drains.count == 1 && hooks.count == 100 }, timeout: .seconds(20)))
            #expect(racers.wait(timeout: .now() + 20) == .success)
            queue.waitUntilAllOperationsAreFinished()
            #expect(flushRemotePosts(loop))
            // completionBlock runs on a Dispatch thread; give it a bounded chance to arrive.
            let deadline = ContinuousClock.now + .seconds(10)
            while completionBlocks.count < 100 && ContinuousClock.now < deadline { usleep(1_000) }
            return (hooks.count, drains.count, completionBlocks.count)
        }
        #expect(hooks == 100)
        #expect(drains == 1)
        #expect(completionBlocks == 100, "Foundation saw each operation finish once")
    }

    @Test("finish() before start() stops the process with a message")
    func finishBeforeStart() async {
        await #expect(processExitsWith: .failure) {
            let operation = TestOperation { $0.finish() }
            operation.finish()
        }
    }

    // MARK: onFinish

    @Test("onFinish runs once on its loop, for AsyncOperations and BlockOperations, also when added late")
    func onFinishHooks() async throws {
        let results = try await onLoopThread { loop -> [String] in
            let queue = OperationQueue()
            let log = Locked<[String]>([])
            let async = TestOperation { operation in
                DispatchQueue.global().async { operation.finish() }
            }
            let block = BlockOperation {}
            async.onFinish(on: loop) {
                log.withLock { $0.append("async finished=\(async.isFinished) onLoop=\(loop.isCurrent)") }
            }
            block.onFinish(on: loop) {
                log.withLock { $0.append("block finished=\(block.isFinished) onLoop=\(loop.isCurrent)") }
            }
            queue.addOperations([async, block], waitUntilFinished: false)
            #expect(loop.spin(until: { log.value.count == 2 }, timeout: .seconds(10)))
            async.onFinish(on: loop) { log.withLock { $0.append("late async") } }
            block.onFinish(on: loop) { log.withLock { $0.append("late block") } }
            #expect(loop.spin(until: { log.value.count == 4 }, timeout: .seconds(10)))
            #expect(flushRemotePosts(loop))
            return log.value
        }
        #expect(results.count == 4, "each hook ran exactly once: \(results)")
        #expect(results.contains("async finished=true onLoop=true"))
        #expect(results.contains("block finished=true onLoop=true"))
        #expect(results.contains("late async"))
        #expect(results.contains("late block"))
    }
}

@Suite("Operations on the real main thread (subprocess)")
struct OperationMainThreadTests {
    @Test("waitUntilAllOperationsAreFinished(spinning: .main) on the main thread, completions on the main loop",
          arguments: [[], ["--dispatch-main"]])
    func mainThreadWait(arguments: [String]) async throws {
        let result = try await runFixture("operations-main-wait", arguments: arguments)
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(result.int("before") == 0, "no completion can run before the wait spins the main loop")
        #expect(result["drained"] == "true")
        #expect(result.int("completions") == 200)
        #expect(result.int("hooks") == 200)
        #expect(result.int("drains") == 1)
        #expect(result.int("off-main") == 0)
        // Fed only through Foundation's add methods, hook added while the work was in flight.
        #expect(result.int("blocks") == 1)
        #expect(result.int("barriers") == 1)
        #expect(result.int("extras-done-at-drain") == 1, "the drain hook ran after the block and the barrier")
        #expect(result.int("counted-drains") == 1)
        #expect(result.int("counted-finished") == 202)
    }
}
