import Foundation
import Synchronization

extension OperationQueue {
    // MARK: Drain hooks: on TrackedOperationQueue only

    // A plain OperationQueue tells nobody that an operation was added (on Linux: no KVO, no
    // notification), so drain hooks on it would miss every operation added with Foundation's
    // own methods and never fire, without an error. These entry points therefore exist only on
    // `TrackedOperationQueue`, which counts every add; on a plain queue they do not compile, and
    // the compiler's message names the class to use.

    /// Unavailable: use `TrackedOperationQueue.onDrained(on:_:)`. A plain `OperationQueue`
    /// cannot see what its own add methods take, so the hook could silently never fire.
    @available(*, unavailable, message: "a plain OperationQueue cannot see the operations added with its own addOperation(_:); make the queue a TrackedOperationQueue, which counts every add")
    public func onDrained(on loop: EventLoop = .main, _ body: @escaping @Sendable () -> Void) -> DrainHook {
        fatalError("unavailable")
    }

    /// Unavailable: use a `TrackedOperationQueue`, whose every add is counted (its
    /// `addTrackedOperations(_:)` is `addOperations(_:waitUntilFinished: false)`).
    @available(*, unavailable, message: "make the queue a TrackedOperationQueue: it counts every add, Foundation's addOperations(_:waitUntilFinished:) included")
    public func addTrackedOperations(_ operations: [Operation]) {
        fatalError("unavailable")
    }

    /// Unavailable: use a `TrackedOperationQueue`, whose every add is counted.
    @available(*, unavailable, message: "make the queue a TrackedOperationQueue: it counts every add, Foundation's addOperation(_:) included")
    public func addTrackedOperation(_ operation: Operation) {
        fatalError("unavailable")
    }

    /// Unavailable: use a `TrackedOperationQueue`, whose every add is counted.
    @available(*, unavailable, message: "make the queue a TrackedOperationQueue: it counts every add, Foundation's addOperation(_:) included")
    public func addTrackedOperation(_ block: @escaping @Sendable () -> Void) {
        fatalError("unavailable")
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
    /// - Parameter timeout: the longest to wait; `nil` for no limit; negative counts as zero.
    /// - Returns: `true` when the queue drained; `false` after the timeout or a `stop()` of the
    ///   loop (the helper thread then keeps waiting for the queue and exits when it drains).
    @available(*, noasync, message: "it blocks the calling thread; await the work instead, or call it on a loop's thread")
    @discardableResult
    public func waitUntilAllOperationsAreFinished(spinning loop: EventLoop, timeout: Duration? = nil) -> Bool {
        loop.preconditionOnLoop("OperationQueue.waitUntilAllOperationsAreFinished(spinning:)")
        if operationCount == 0 { return true }
        let drained = DrainedFlag()
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

/// A flag set on a loop's thread and read by its spin condition.
private final class DrainedFlag: Sendable {
    private let value = Atomic<Bool>(false)
    func set() { value.store(true, ordering: .releasing) }
    var isSet: Bool { value.load(ordering: .acquiring) }
}
