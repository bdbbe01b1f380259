import Foundation
import Synchronization
import MainspringCore

/// An `Operation` whose work ends later, on any thread: subclasses override `execute()`, start
/// their asynchronous work there, and call `finish()` when it is done.
///
/// ## Lifecycle
/// `ready` → (`start()`) `executing` → (`finish()`) `finished`. `isAsynchronous` is `true`;
/// `isExecuting` and `isFinished` come from one atomic state word, so they are safe to read from
/// any thread and never both `true`.
///
/// - An operation cancelled before it starts finishes when it is started (by its queue, or by
///   you), without calling `execute()`.
/// - `finish()` is idempotent: the first call finishes the operation, later calls do nothing.
/// - `finish()` before `start()` is a programming error and stops the process with a message
///   (see `finish()` for why it is not ignored).
/// - Cancelling a running operation only sets `isCancelled`: the subclass decides how to stop
///   (check `isCancelled`, or override `cancel()`, call `super.cancel()` and wind down), and it
///   still calls `finish()`. `SpinningOperation` does this for you.
///
/// ## How it talks to `OperationQueue` on Linux
/// swift-corelibs-foundation has no KVO: `willChangeValue(forKey:)` does nothing there, and
/// `didChangeValue(forKey:)` calls the queue's bookkeeping directly. On `"isExecuting"` it marks
/// the operation running if `isExecuting` reads `true`; on `"isFinished"`, if `isFinished` reads
/// `true`, it releases dependent operations, wakes `waitUntilFinished()`, schedules
/// `completionBlock` and removes the operation from its queue — all before the call returns.
/// So this class changes its state first and announces afterwards, in the order Foundation's own
/// `Operation.start()` uses: `isExecuting` when it starts; `isExecuting` then `isFinished` when
/// it finishes. Queues, dependencies, `waitUntilFinished()` and
/// `waitUntilAllOperationsAreFinished()` work as with any operation. Override `execute()`, not
/// `main()` (which is never called) or `start()` (which is final).
///
/// - Note: Foundation runs `start()` on one of the queue's threads and that thread is free again
///   as soon as `execute()` returns. To keep the thread and run an event loop on it instead, use
///   `SpinningOperation`.
open class AsyncOperation: Operation, @unchecked Sendable {
    /// `Phase` raw values. `finishing`: `finish()` was called, the announcement is pending
    /// (immediate here; `SpinningOperation` makes its worker thread announce).
    private let phase = Atomic<UInt8>(Phase.ready.rawValue)
    private let observers = Protected(FinishObservers())

    /// Creates an operation in the ready state; `execute()` runs when a queue (or `start()`)
    /// starts it.
    public override init() {
        super.init()
    }

    // MARK: For subclasses

    /// Starts the operation's work. Override it; do not call `super` unless you want the default,
    /// which finishes at once.
    ///
    /// Called once, on the thread that started the operation (one of the queue's threads), after
    /// `isExecuting` became `true`; never called when the operation was cancelled before it
    /// started. Return as soon as the work is under way and call `finish()` when it completes,
    /// from any thread (calling it before returning is fine too).
    open func execute() {
        finish()
    }

    /// Marks the operation finished: `isExecuting` becomes `false`, `isFinished` `true`, the
    /// queue moves on, dependent operations become ready and `onFinish` hooks are posted.
    ///
    /// Any thread. Idempotent: only the first call has an effect. Cost: two atomic operations,
    /// the `onFinish` posts, and what Foundation does on finishing (a few locks; it reads the
    /// dependents' `isReady` and schedules `completionBlock` on a Dispatch thread).
    ///
    /// - Precondition: the operation has started. Finishing an operation that its queue has not
    ///   started would corrupt the queue on Linux: Foundation prints "went isFinished=YES
    ///   without being started by the queue it is in", drops it from the queue's list but not
    ///   from its ready list, and releases its dependents early. It means that `finish()` and
    ///   `execute()` disagree about which work is running — a bug to fix, not to ignore — so it
    ///   stops the process with a message naming the operation.
    public func finish() {
        let (claimed, original) = phase.compareExchange(
            expected: Phase.executing.rawValue, desired: Phase.finishing.rawValue, ordering: .acquiringAndReleasing)
        guard claimed else {
            requireUsage(
                original != Phase.ready.rawValue,
                "Mainspring: finish() was called on \(type(of: self)) before it started; call it only when the work that execute() began has completed")
            return  // Already finishing or finished: finish() is idempotent.
        }
        finishRequested()
    }

    // MARK: Operation

    /// Starts the operation: if it was cancelled first it finishes without `execute()`;
    /// otherwise it becomes executing and calls `execute()`. Its queue calls this; call it
    /// yourself only for an operation that is in no queue (then on the thread you want).
    ///
    /// - Precondition: the operation has not started yet (a finished operation returns at once,
    ///   as Foundation's does); when started by hand, its dependencies have finished.
    public final override func start() {
        let current = phase.load(ordering: .acquiring)
        if current == Phase.finished.rawValue { return }
        requireUsage(
            current == Phase.ready.rawValue,
            "Mainspring: start() was called on \(type(of: self)), which already started; an operation runs once")
        if isCancelled {
            let (began, _) = phase.compareExchange(
                expected: Phase.ready.rawValue, desired: Phase.finishing.rawValue, ordering: .acquiringAndReleasing)
            requireUsage(began, "Mainspring: \(type(of: self)) was started from two threads at once")
            announceFinished(wasExecuting: false)
            return
        }
        // A queue starts an operation only once its dependencies finished (it keeps its own
        // count, not `isReady`); check by-hand starts, as Foundation's `start()` does.
        if OperationQueue.current == nil {
            requireUsage(isReady, "Mainspring: start() was called on \(type(of: self)) before its dependencies finished")
        }
        willChangeValue(forKey: "isExecuting")
        let (began, _) = phase.compareExchange(
            expected: Phase.ready.rawValue, desired: Phase.executing.rawValue, ordering: .acquiringAndReleasing)
        requireUsage(began, "Mainspring: \(type(of: self)) was started from two threads at once")
        didChangeValue(forKey: "isExecuting")
        performExecution()
    }

    /// Always `true`: the work outlives `start()`.
    public final override var isAsynchronous: Bool { true }

    /// Whether `start()` ran and the operation has not finished yet. Any thread.
    public final override var isExecuting: Bool {
        let current = phase.load(ordering: .acquiring)
        return current == Phase.executing.rawValue || current == Phase.finishing.rawValue
    }

    /// Whether the operation finished (its work completed, or it was cancelled before it
    /// started). Any thread.
    public final override var isFinished: Bool {
        phase.load(ordering: .acquiring) == Phase.finished.rawValue
    }

    // MARK: Internals shared with SpinningOperation and the hooks

    /// Whether `finish()` was called (the operation may not be announced as finished yet).
    var isFinishRequested: Bool {
        phase.load(ordering: .acquiring) >= Phase.finishing.rawValue
    }

    /// Runs the work once the operation is executing. `SpinningOperation` spins a loop around it.
    func performExecution() {
        execute()
    }

    /// Called exactly once, by the `finish()` call that moved the state to `finishing`.
    func finishRequested() {
        announceFinished(wasExecuting: true)
    }

    /// Moves `executing` to `finishing` if `finish()` has not done so (a cancelled spin).
    func claimFinishing() {
        _ = phase.compareExchange(
            expected: Phase.executing.rawValue, desired: Phase.finishing.rawValue, ordering: .acquiringAndReleasing)
    }

    /// Makes the operation finished and tells Foundation, exactly once per operation (only the
    /// thread that moved the state to `finishing` gets here).
    ///
    /// Order: the state flips (so hooks see `isFinished == true`); early observers (the
    /// `onFinish` posts) run; then the Foundation announcements, which release dependents and
    /// waiters and remove the operation from its queue; then late observers (the drained-hook
    /// counters).
    ///
    /// One race is Foundation's and cannot be closed from here: after `start()` returns, the
    /// queue's thread checks `isFinished` once and, if it reads `true` before this thread has
    /// taken the operation's lock inside `didChangeValue`, does the same bookkeeping itself (the
    /// lock makes one of the two do it, the other returns). Then waiters may wake before the
    /// early observers ran, and the late observers may run before the queue's list is updated.
    /// It takes a `finish()` on another thread within the few hundred nanoseconds after
    /// `start()` returned; `SpinningOperation` never hits it (its worker thread announces before
    /// `start()` returns). Hook counting is unaffected: each observer list runs exactly once.
    final func announceFinished(wasExecuting: Bool) {
        if wasExecuting { willChangeValue(forKey: "isExecuting") }
        willChangeValue(forKey: "isFinished")
        phase.store(Phase.finished.rawValue, ordering: .releasing)
        for body in observers.withLock({ $0.takeEarly() }) { body() }
        if wasExecuting { didChangeValue(forKey: "isExecuting") }
        didChangeValue(forKey: "isFinished")
        for body in observers.withLock({ $0.takeLate() }) { body() }
    }

    /// Runs `body` once when the operation has finished (at once, on this thread, if it already
    /// has), on the finishing thread. `body` must be quick and must not block: it runs inside
    /// `finish()`.
    func whenFinished(_ timing: FinishTiming, _ body: @escaping @Sendable () -> Void) {
        let runNow = observers.withLock { $0.add(body, timing) }
        if runNow { body() }
    }
}

/// When an internal finish observer runs relative to Foundation's announcement.
enum FinishTiming {
    /// After `isFinished` reads `true`, before dependents and queue waiters are released.
    case beforeAnnouncement
    /// After the queue has taken the operation off its list.
    case afterAnnouncement
}

private enum Phase: UInt8 {
    case ready = 0, executing, finishing, finished
}

/// The observers of one operation's finishing, and which of them already ran.
private struct FinishObservers {
    var early: [@Sendable () -> Void] = []
    var late: [@Sendable () -> Void] = []
    var earlyDone = false
    var lateDone = false

    /// Appends `body`, or returns `true` when its moment has passed (the caller runs it).
    mutating func add(_ body: @escaping @Sendable () -> Void, _ timing: FinishTiming) -> Bool {
        switch timing {
        case .beforeAnnouncement:
            if earlyDone { return true }
            early.append(body)
        case .afterAnnouncement:
            if lateDone { return true }
            late.append(body)
        }
        return false
    }

    mutating func takeEarly() -> [@Sendable () -> Void] {
        earlyDone = true
        defer { early = [] }
        return early
    }

    mutating func takeLate() -> [@Sendable () -> Void] {
        lateDone = true
        defer { late = [] }
        return late
    }
}
