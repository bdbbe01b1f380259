import Foundation
import MainspringCore

extension OperationQueue {
    /// The tracker behind this queue's hooks: the queue's own when it is a
    /// `TrackedOperationQueue`, otherwise one made for the queue on first use, which counts only
    /// `addTrackedOperation(s)`.
    var drainTracker: QueueTracker {
        (self as? TrackedOperationQueue)?.tracker ?? QueueTracker.ofPlainQueue(self)
    }

    // MARK: Waiting without deadlock

    /// Waits until the queue has no operations left — while spinning `loop`, so everything
    /// delivered to that loop meanwhile (completions, `onFinish` hooks, timers, input) still runs.
    ///
    /// When operations deliver their completions to the main thread, a plain
    /// `waitUntilAllOperationsAreFinished()` on the main thread blocks the very thread those
    /// completions need, and never returns. Here, call it on the loop's thread (`EventLoop.main`
    /// on the main thread) and the completions run inside the wait.
    ///
    /// It works on any `OperationQueue` (a `TrackedOperationQueue` or not) and sees every
    /// operation in it, including those added while it waits: a helper thread makes
    /// Foundation's own blocking wait and then wakes the loop, so the loop sleeps in epoll
    /// meanwhile — no polling. When it returns `true`, everything that
    /// was posted to `loop` before the last `finish()` call (the completions that called
    /// `finish()`, results they posted) has run; `onFinish` hooks posted by the finishing are
    /// normally done too, but not promised (they may be queued right behind).
    ///
    /// Loop thread only (precondition). Cost: one short-lived thread per call that has to wait.
    /// - Parameters:
    ///   - loop: the loop to keep running while waiting: the calling thread's.
    ///   - timeout: the longest to wait; `nil` for no limit; negative counts as zero.
    /// - Returns: `true` when the queue drained; `false` after the timeout or a `stop()` of the
    ///   loop (the helper thread then keeps waiting for the queue and exits when it drains).
    @available(*, noasync, message: "it blocks the calling thread; await the work instead, or call it on a loop's thread")
    @discardableResult
    public func waitUntilAllOperationsAreFinished(spinning loop: EventLoop, timeout: Duration? = nil) -> Bool {
        loop.preconditionOnLoop("OperationQueue.waitUntilAllOperationsAreFinished(spinning:)")
        if operationCount == 0 { return true }
        let drained = SharedFlag()
        let waiter = Thread { [self] in
            waitUntilAllOperationsAreFinished()
            // Two hops: this one runs after everything other threads posted before the queue
            // drained; its local post then runs after what the loop's own thread posted.
            loop.execute {
                loop.execute { drained.set() }
            }
        }
        waiter.name = "Mainspring queue waiter"
        waiter.start()
        return loop.spin(until: { drained.isSet }, timeout: timeout)
    }
}

/// The drain-hook methods of a plain `OperationQueue`, kept for existing code and deprecated:
/// such a queue tells nobody when Foundation's own methods add work (on Linux: no KVO, no
/// notification), so its hooks see only the work added with `addTrackedOperation(s)` and would
/// never fire for the rest. `TrackedOperationQueue` declares the same methods without the
/// deprecation, counting every add; called on one (whatever the static type of the reference),
/// these use its tracker too.
///
/// `OperationQueue` is the only type meant to conform.
public protocol OperationQueueDrainHooks: OperationQueue {}

extension OperationQueue: OperationQueueDrainHooks {}

extension OperationQueueDrainHooks {
    // A plain OperationQueue tells nobody that an operation was added (on Linux: no KVO, no
    // notification), so drain hooks on it see only the work added with `addTrackedOperation(s)`
    // and would never fire for work added with Foundation's own methods. These entry points are
    // kept so existing code compiles and behaves as before, but are deprecated, and the compiler's
    // warning names the class to use instead. On a `TrackedOperationQueue` (whatever the static
    // type of the reference) they use its tracker, which counts every add.

    /// Adds `operations` without waiting and counts them for `onDrained(on:_:)` and
    /// `QueueActivity`. Any thread.
    ///
    /// Deprecated on a plain `OperationQueue`: work added there with Foundation's own methods is
    /// not counted, so a drain hook could silently never fire. Make the queue a
    /// `TrackedOperationQueue`, which counts every add.
    @available(*, deprecated, message: "a plain OperationQueue cannot count what its own addOperation(_:) takes; make the queue a TrackedOperationQueue, which counts every add")
    public func addTrackedOperations(_ operations: [Operation]) {
        if let tracked = self as? TrackedOperationQueue {
            tracked.addTrackedOperations(operations)
            return
        }
        drainTracker.track(operations)
        addOperations(operations, waitUntilFinished: false)
    }

    /// Adds `operation`, counted; see `addTrackedOperations(_:)`. Deprecated on a plain
    /// `OperationQueue`: use a `TrackedOperationQueue`.
    @available(*, deprecated, message: "a plain OperationQueue cannot count what its own addOperation(_:) takes; make the queue a TrackedOperationQueue, which counts every add")
    public func addTrackedOperation(_ operation: Operation) {
        addTrackedOperations([operation])
    }

    /// Adds a `BlockOperation` running `block`, counted; see `addTrackedOperations(_:)`.
    /// Deprecated on a plain `OperationQueue`: use a `TrackedOperationQueue`.
    @available(*, deprecated, message: "a plain OperationQueue cannot count what its own addOperation(_:) takes; make the queue a TrackedOperationQueue, which counts every add")
    public func addTrackedOperation(_ block: @escaping @Sendable () -> Void) {
        addTrackedOperations([BlockOperation(block: block)])
    }

    /// Runs `body` on `loop` each time the queue's counted work has all finished; see
    /// `TrackedOperationQueue.onDrained(on:_:)` for the promises.
    ///
    /// Deprecated on a plain `OperationQueue`: there only work added with
    /// `addTrackedOperation(s)` is counted, so work added with Foundation's own methods never
    /// makes the hook fire. Make the queue a `TrackedOperationQueue` (on one, this calls its
    /// `onDrained`, which counts every add).
    @available(*, deprecated, message: "a plain OperationQueue cannot see the operations added with its own addOperation(_:); make the queue a TrackedOperationQueue, which counts every add")
    @discardableResult
    public func onDrained(on loop: EventLoop = .main, _ body: @escaping @Sendable () -> Void) -> DrainHook {
        drainTracker.addHook(on: loop, body)
    }
}
