import Foundation
import MainspringCore

/// An `OperationQueue` that counts every operation and barrier block added to it, so that it can
/// tell you when it has drained: `onDrained(on:_:)` runs a hook on an event loop each time all its
/// work has finished, and `QueueActivity` publishes the counts through Observation. This is the
/// Linux replacement for observing `operationCount` with KVO, which swift-corelibs-foundation
/// does not have.
///
/// ```swift
/// let queue = TrackedOperationQueue()
/// queue.onDrained(on: .main) { print("all saved") }
/// queue.addOperations(saves, waitUntilFinished: false)   // Foundation's own methods count
/// queue.addOperation { cleanUp() }
/// ```
///
/// ## Why a subclass
/// Foundation on Linux tells nobody when an operation is added or removed: no KVO, no
/// notification. So the queue itself has to count, and it can only count what passes through its
/// own methods. This class overrides every way in — `addOperation(_:)`,
/// `addOperations(_:waitUntilFinished:)`, `addOperation(_:)` with a block and
/// `addBarrierBlock(_:)`, all `open` in Foundation — so ordinary Foundation code, a library that
/// takes an `OperationQueue`, or an operation that reaches its queue through
/// `OperationQueue.current` all add counted work. The class is `final` so that
/// no override can bypass the count. On a plain `OperationQueue`, `onDrained` and
/// `QueueActivity(of:)` are deprecated (their warning names this class): such a queue can take
/// work the hooks never see.
///
/// ## What counts
/// - Each operation counts once from the moment it is added — before Foundation can start it —
///   until it has finished: completed, or cancelled and finished. An operation that adds more
///   work from its `main()` (or `execute()`) adds it before it finishes itself, so the queue does
///   not drain in between. The same operation is never counted twice, whatever Foundation's add
///   methods call internally.
/// - Each barrier block counts as one unit, until the block has returned. `cancelAllOperations()`
///   cancels every operation but leaves barrier blocks in place: a barrier block still runs once
///   the operations before it have finished (cancelled ones finish at once). Foundation's own
///   `cancelAllOperations()` cancels barriers too, and on Linux that goes wrong twice: the
///   block is dropped without a trace (so no count could know whether it will ever run), and
///   the cancelled barrier is freed while the operations before it still point at it, which
///   crashes the process when they finish (swift-corelibs-foundation 6.3: a suspended queue
///   with operations and a barrier, `cancelAllOperations()`, resume).
///
/// Foundation's `operationCount` and `operations` are unchanged: they list the operations still
/// in the queue and leave out barrier blocks. Around a finish the two counts may differ for a
/// moment: an operation is counted out just after Foundation has taken it off its list (a
/// moment later still for an operation that is not an `AsyncOperation`; see `AsyncOperation`
/// for the rare reverse order).
///
/// Cost per operation, on top of Foundation's: one mutex-protected insertion when it is added;
/// when it finishes, one mutex-protected decrement — for an `AsyncOperation` on the finishing
/// thread, for any other operation in one hidden hook operation on a private queue (see
/// `Operation.onFinish(on:_:)`). All methods work from any thread.
public final class TrackedOperationQueue: OperationQueue, @unchecked Sendable {
    /// The count and the hooks. Owned by the queue; a `QueueActivity` or `DrainHook` keeps it
    /// alive after the queue is gone.
    let tracker = QueueTracker()

    /// Creates an empty queue, with Foundation's defaults (no limit on concurrent operations,
    /// not suspended).
    public override init() {
        super.init()
    }

    // MARK: Foundation's add methods, counted

    /// Adds `operation` and counts it until it has finished. Any thread.
    /// - Precondition: as for any `OperationQueue`: the operation is not finished, executing or
    ///   in a queue already (Foundation stops the process otherwise).
    public override func addOperation(_ operation: Operation) {
        track([operation])
        super.addOperation(operation)
    }

    /// Adds `operations` and counts each until it has finished; the whole batch is counted
    /// before any of it can start, so the queue cannot drain in the middle of a batch. With
    /// `waitUntilFinished: true` it then blocks the calling thread until all of them finished.
    /// Any thread (not from async code: use `addTrackedOperations(_:)` there).
    /// - Precondition: as for any `OperationQueue`: no operation is finished, executing or in a
    ///   queue already (Foundation stops the process otherwise).
    @available(*, noasync, message: "it can block; use addTrackedOperations(_:), which never waits")
    public override func addOperations(_ operations: [Operation], waitUntilFinished wait: Bool) {
        track(operations)
        super.addOperations(operations, waitUntilFinished: wait)
    }

    /// Adds a `BlockOperation` running `block` (with the queue's quality of service, if one was
    /// set) and counts it until it has finished. Any thread.
    public override func addOperation(_ block: @escaping @Sendable () -> Void) {
        // Foundation's version makes the same operation and passes it to `addOperation(_:)`;
        // doing it here counts it through that one method without relying on how Foundation's
        // version reaches it.
        let operation = BlockOperation(block: block)
        let quality = qualityOfService
        if quality != .default { operation.qualityOfService = quality }
        addOperation(operation)
    }

    /// Adds `barrier`, which runs once every operation added before it has finished, while the
    /// operations added after it wait; it counts as one unit until it has returned. Any thread.
    ///
    /// `cancelAllOperations()` does not cancel it (see the class's notes).
    public override func addBarrierBlock(_ barrier: @escaping @Sendable () -> Void) {
        let tracker = self.tracker
        tracker.willAddBarrier()
        super.addBarrierBlock {
            barrier()
            tracker.didFinish(nil)
        }
    }

    /// Cancels every operation in the queue (each still counts until it has finished, which a
    /// cancelled operation does as soon as the queue starts it, or — an executing one — when it
    /// winds down). Barrier blocks are not cancelled: each still runs once the operations before
    /// it have finished. Any thread.
    public override func cancelAllOperations() {
        // `operations` leaves out Foundation's barrier operations, which Foundation's own
        // `cancelAllOperations()` would cancel, losing their blocks and their counts (and, when
        // operations before them are still pending, crashing: see the class's notes). A
        // barrier that runs removes itself from the operations it waited for.
        for operation in operations {
            operation.cancel()
        }
    }

    // MARK: Adds without waiting, from any context

    /// Adds `operations` without waiting: the same as `addOperations(operations,
    /// waitUntilFinished: false)`, and available from async code (Foundation marks that method
    /// `noasync` because of its waiting form). Any thread.
    public func addTrackedOperations(_ operations: [Operation]) {
        addOperations(operations, waitUntilFinished: false)
    }

    /// Adds `operation`: the same as `addOperation(_:)`. Any thread.
    public func addTrackedOperation(_ operation: Operation) {
        addOperation(operation)
    }

    /// Adds a `BlockOperation` running `block`: the same as `addOperation(_:)` with a block.
    /// Any thread.
    public func addTrackedOperation(_ block: @escaping @Sendable () -> Void) {
        addOperation(block)
    }

    // MARK: Drain hooks

    /// Runs `body` on `loop` each time the queue has drained: every time the number of its
    /// unfinished operations and barrier blocks falls to 0 after work was added, however it was
    /// added.
    ///
    /// Any thread. `body` runs on `loop`'s thread, posted with `loop.execute` — never on one of
    /// the queue's threads — exactly once per drain, also when the last operations finish at the
    /// same moment on many threads (see `QueueTracker` for why). A hook added while work is in
    /// flight fires at the end of that drain; one added to an idle queue waits for the next work.
    /// Several hooks fire in the order they were added, each on its own loop. When `body` runs,
    /// new work may already have been added.
    ///
    /// Cost: one `loop.execute` per hook per drain.
    /// - Returns: a handle whose `cancel()` removes the hook; otherwise the hook stays as long as
    ///   the queue (dropping the handle does not remove it).
    @discardableResult
    public func onDrained(on loop: EventLoop = .main, _ body: @escaping @Sendable () -> Void) -> DrainHook {
        tracker.addHook(on: loop, body)
    }

    // MARK: Internals

    private func track(_ operations: [Operation]) { tracker.track(operations) }
}
