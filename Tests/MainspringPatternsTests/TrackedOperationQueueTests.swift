import Foundation
import Synchronization
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore

/// Where a drain hook ran, and how much work had completed when it did.
struct DrainSighting: Sendable, Equatable {
    var completed: Int
    var onLoop: Bool
    var onLoopThread: Bool
    var onQueueThread: Bool
}

/// Records each run of a drain hook.
final class DrainLog: Sendable {
    private let sightings = Locked<[DrainSighting]>([])
    private let loopThread = pthread_self()

    /// Call on the loop's thread: that thread is the one the hook must run on.
    init() {}

    func record(completed: Int, loop: EventLoop) {
        let sighting = DrainSighting(
            completed: completed,
            onLoop: loop.isCurrent,
            onLoopThread: pthread_equal(pthread_self(), loopThread) != 0,
            onQueueThread: OperationQueue.current != nil)
        sightings.withLock { $0.append(sighting) }
    }

    var count: Int { sightings.value.count }
    var all: [DrainSighting] { sightings.value }
}

/// Spins `loop` (at most 30 s) until `queue` has counted out `finished` operations and barrier
/// blocks and the hook logged in `log` has run for every drain counted so far; returns the
/// counts. Once all the work is counted out no further drain can happen, and a hook runs once
/// per counted drain, so the numbers are then final. The caller checks `finished` (and
/// `pending == 0`): on a time-out they show what was missing.
func settle(_ queue: TrackedOperationQueue, finished: Int, log: DrainLog, loop: EventLoop) -> QueueTracker.Snapshot {
    loop.spin(until: {
        let counts = queue.tracker.snapshot
        return counts.finished == finished && log.count >= counts.drains
    }, timeout: .seconds(30))
    return queue.tracker.snapshot
}

@Suite("TrackedOperationQueue: drain hooks that see Foundation's own adds", .serialized)
struct TrackedOperationQueueTests {
    @Test("fed only through Foundation's four add methods, several drains in a row: onDrained once per drain, on the loop's thread")
    func foundationAddsDrainOncePerDrain() async throws {
        let rounds = 6
        let (sightings, expectedCompleted, counts, foundationCount, finishersDone) = try await onLoopThread {
            loop -> ([DrainSighting], [Int], QueueTracker.Snapshot, Int, Bool) in
            let queue = TrackedOperationQueue()
            queue.maxConcurrentOperationCount = 4
            let log = DrainLog()
            let completed = Counter()
            let finishers = DispatchGroup()
            queue.onDrained(on: loop) { log.record(completed: completed.count, loop: loop) }

            func asyncWork() -> TestOperation {
                TestOperation { operation in
                    completed.increment()
                    finishOnRandomThread(operation, done: finishers)
                }
            }
            func blockWork() -> BlockOperation {
                BlockOperation { completed.increment() }
            }

            var added = 0
            var expectedCompleted: [Int] = []
            for round in 1...rounds {
                // The gate keeps the round from draining before all of it was added.
                let gate = DispatchSemaphore(value: 0)
                queue.addOperation {
                    gate.wait()
                    completed.increment()
                }
                for _ in 0..<10 { queue.addOperation(asyncWork()) }
                for _ in 0..<10 { queue.addOperation(blockWork()) }
                for _ in 0..<10 { queue.addOperation { completed.increment() } }
                queue.addOperations((0..<10).map { $0 % 2 == 0 ? asyncWork() : blockWork() }, waitUntilFinished: false)
                queue.addBarrierBlock { completed.increment() }
                added += 1 + 10 + 10 + 10 + 10 + 1
                expectedCompleted.append(added)
                gate.signal()
                loop.spin(until: { log.count >= round }, timeout: .seconds(30))
            }
            // One more drain, through the waiting form: the batch is counted before any of it
            // starts, so it cannot drain before it is complete.
            queue.addOperations((0..<20).map { $0 % 2 == 0 ? asyncWork() : blockWork() }, waitUntilFinished: true)
            added += 20
            expectedCompleted.append(added)
            loop.spin(until: { log.count >= rounds + 1 }, timeout: .seconds(30))

            let counts = settle(queue, finished: added, log: log, loop: loop)
            let finishersDone = finishers.wait(timeout: .now() + 30) == .success
            queue.waitUntilAllOperationsAreFinished()
            return (log.all, expectedCompleted, counts, queue.operationCount, finishersDone)
        }
        #expect(finishersDone)
        #expect(counts.finished == expectedCompleted.last, "every operation and barrier block counted out once")
        #expect(counts.pending == 0)
        #expect(counts.drains == rounds + 1, "one drain per round")
        #expect(sightings.count == rounds + 1, "the hook ran once per drain: \(sightings)")
        #expect(sightings.map(\.completed) == expectedCompleted, "each drain came after all of its work")
        #expect(sightings.allSatisfy { $0.onLoop && $0.onLoopThread }, "on the chosen loop's thread")
        #expect(sightings.allSatisfy { !$0.onQueueThread }, "never on one of the queue's threads")
        #expect(foundationCount == 0)
    }

    @Test("a hook added while operations are in flight fires once, at the end of that drain; one added to an idle queue waits for new work")
    func hookAddedInFlight() async throws {
        let (first, later, counts, quietWhileIdle, heldStarted) = try await onLoopThread {
            loop -> ([DrainSighting], [DrainSighting], QueueTracker.Snapshot, Bool, Bool) in
            let queue = TrackedOperationQueue()
            let completed = Counter()
            let started = DispatchSemaphore(value: 0)
            let held = TestOperation { _ in started.signal() }
            queue.addOperation(held)
            queue.addOperation { completed.increment() }
            queue.addOperations([BlockOperation { completed.increment() }], waitUntilFinished: false)
            queue.addBarrierBlock { completed.increment() }
            // Required: finish() on an operation the queue has not started would trap.
            let heldStarted = started.wait(timeout: .now() + 30) == .success
            try #require(heldStarted, "the queue started the held operation")

            // `held` is executing: the hook joins a drain already under way.
            let log = DrainLog()
            queue.onDrained(on: loop) { log.record(completed: completed.count, loop: loop) }
            completed.increment()
            held.finish()
            _ = settle(queue, finished: 4, log: log, loop: loop)

            // Added to an idle queue: the drain that already happened is not reported to it.
            let later = DrainLog()
            queue.onDrained(on: loop) { later.record(completed: completed.count, loop: loop) }
            let quietWhileIdle = flushRemotePosts(loop) && later.count == 0
            queue.addOperation { completed.increment() }
            loop.spin(until: { later.count >= 1 }, timeout: .seconds(30))
            let counts = settle(queue, finished: 5, log: log, loop: loop)
            return (log.all, later.all, counts, quietWhileIdle, heldStarted)
        }
        #expect(heldStarted)
        #expect(counts.finished == 5)
        #expect(counts.drains == 2)
        #expect(quietWhileIdle, "a hook added to an idle queue is not told about the drain before it")
        #expect(first.map(\.completed) == [4, 5], "the first drain came after all four units: \(first)")
        #expect(later.map(\.completed) == [5])
        #expect((first + later).allSatisfy { $0.onLoopThread && !$0.onQueueThread })
    }

    @Test("cancelled operations count as finished: cancelled before adding, by cancelAllOperations, or while running")
    func cancelledOperationsCount() async throws {
        final class Spin: SpinningOperation, @unchecked Sendable {
            let started = DispatchSemaphore(value: 0)
            override func execute() { started.signal() }  // spins until finished or cancelled
        }
        let result = try await onLoopThread {
            loop -> (sightings: [DrainSighting], counts: QueueTracker.Snapshot, total: Int, executed: Int, barriers: Int,
                     allCancelled: Bool, spinStarted: Bool, spinEnded: Bool, quietUntilResumed: Bool) in
            let queue = TrackedOperationQueue()
            let log = DrainLog()
            let executed = Counter()
            let barriers = Counter()
            queue.onDrained(on: loop) { log.record(completed: barriers.count, loop: loop) }

            let spin = Spin()
            queue.addOperation(spin)
            let spinStarted = spin.started.wait(timeout: .now() + 10) == .success

            // Held by the suspension: nothing below can start before it is cancelled.
            queue.isSuspended = true
            let early = TestOperation { _ in executed.increment() }
            early.cancel()
            queue.addOperation(early)
            var operations: [Operation] = [early, spin]
            let batch: [Operation] = (0..<10).map { index in
                index % 2 == 0
                    ? TestOperation { operation in
                        executed.increment()
                        operation.finish()
                    }
                    : BlockOperation { executed.increment() }
            }
            queue.addOperations(batch, waitUntilFinished: false)
            operations += batch
            for _ in 0..<5 { queue.addOperation { executed.increment() } }
            queue.addBarrierBlock { barriers.increment() }
            // The queue's BlockOperations made by addOperation(_:) with a block.
            operations += queue.operations.filter { candidate in !operations.contains { $0 === candidate } }

            queue.cancelAllOperations()
            // The running operation winds down.
            let spinEnded = startThread { spin.waitUntilFinished() }.wait(timeout: .now() + 10) == .success
            // The rest is still held: nothing can have drained yet.
            let quietUntilResumed = flushRemotePosts(loop) && log.count == 0
            queue.isSuspended = false

            let total = operations.count + 1  // and the barrier block
            let counts = settle(queue, finished: total, log: log, loop: loop)
            queue.waitUntilAllOperationsAreFinished()
            return (log.all, counts, total, executed.count, barriers.count,
                    operations.allSatisfy { $0.isCancelled && $0.isFinished }, spinStarted, spinEnded, quietUntilResumed)
        }
        #expect(result.spinStarted && result.spinEnded, "the running operation was cancelled and wound down")
        #expect(result.total == 1 + 1 + 10 + 5 + 1, "every operation of the queue is in the list")
        #expect(result.counts.finished == result.total, "every cancelled operation counted as finished")
        #expect(result.counts.pending == 0)
        #expect(result.quietUntilResumed)
        #expect(result.counts.drains == 1)
        #expect(result.sightings.count == 1, "one drain: \(result.sightings)")
        #expect(result.sightings.first?.completed == 1, "the barrier block ran before the drain")
        #expect(result.sightings.allSatisfy { $0.onLoopThread && !$0.onQueueThread })
        #expect(result.executed == 0, "no cancelled operation ran its work")
        #expect(result.barriers == 1, "cancelAllOperations() leaves barrier blocks to run")
        #expect(result.allCancelled)
    }

    @Test("work added from inside a running operation, by every add method, keeps the queue from draining early")
    func refillFromInside() async throws {
        let steps = 40
        let (sightings, counts, lostCurrent) = try await onLoopThread { loop -> ([DrainSighting], QueueTracker.Snapshot, Int) in
            let queue = TrackedOperationQueue()
            queue.maxConcurrentOperationCount = 2
            let log = DrainLog()
            let completed = Counter()
            let lostCurrent = Counter()
            let finishers = DispatchGroup()
            queue.onDrained(on: loop) { log.record(completed: completed.count, loop: loop) }

            // Step `index` completes its work, then adds step `index + 1` through one of the four
            // methods — reaching the queue as a plain `OperationQueue`, the way Foundation code
            // that was handed the queue, or `OperationQueue.current`, would — and only then
            // finishes.
            @Sendable func addStep(_ index: Int, to target: OperationQueue) {
                guard index <= steps else { return }
                @Sendable func next() {
                    completed.increment()
                    guard let current = OperationQueue.current else {
                        lostCurrent.increment()
                        return
                    }
                    addStep(index + 1, to: current)
                }
                switch index % 4 {
                case 0:
                    target.addOperation(TestOperation { operation in
                        next()
                        finishOnRandomThread(operation, done: finishers)
                    })
                case 1:
                    target.addOperation { next() }
                case 2:
                    target.addOperations([BlockOperation { next() }], waitUntilFinished: false)
                default:
                    target.addBarrierBlock { next() }
                }
            }
            let plain: OperationQueue = queue
            addStep(1, to: plain)
            let counts = settle(queue, finished: steps, log: log, loop: loop)
            _ = finishers.wait(timeout: .now() + 30)
            return (log.all, counts, lostCurrent.count)
        }
        #expect(lostCurrent == 0, "every step ran with OperationQueue.current set")
        #expect(counts.finished == steps)
        #expect(counts.pending == 0)
        #expect(counts.drains == 1)
        #expect(sightings.map(\.completed) == [steps], "one drain, after the last step: \(sightings)")
        #expect(sightings.allSatisfy { $0.onLoopThread && !$0.onQueueThread })
    }

    @Test("a queue and its drain hook's handle, both dropped, free the tracker (the hook does not keep it alive)")
    func hookDoesNotKeepTrackerAlive() {
        weak var tracker: QueueTracker?
        weak var handle: DrainHook?
        do {
            let queue = TrackedOperationQueue()
            let hook = queue.onDrained(on: .main) {}
            queue.addOperation {}
            queue.waitUntilAllOperationsAreFinished()
            tracker = queue.tracker
            handle = hook
            #expect(tracker != nil && handle != nil)
        }
        // A finished operation's hidden finish hook may still hold the tracker for a moment.
        let deadline = ContinuousClock.now + .seconds(10)
        while tracker != nil && ContinuousClock.now < deadline { usleep(5_000) }
        #expect(tracker == nil, "the tracker outlived its queue and its hook's handle")
        #expect(handle == nil)
    }
}
