import Foundation
import Synchronization

extension OperationQueue {
    // MARK: Tracked operations

    /// Adds `operations` to the queue and counts them for `onDrained(on:_:)` and
    /// `QueueActivity`: the Linux replacement for observing `operationCount` with KVO.
    ///
    /// The whole batch is counted before any of it can start, so the queue cannot report a drain
    /// in the middle of a batch. Each operation is then counted out exactly once when it
    /// finishes (completed or cancelled). Any thread.
    ///
    /// Operations added with Foundation's own `addOperation(_:)` are not seen by
    /// `onDrained` or `QueueActivity` — swift-corelibs-foundation offers no hook for them (no
    /// KVO, no add notification). `waitUntilAllOperationsAreFinished(spinning:)` sees every
    /// operation.
    ///
    /// Cost: for an `AsyncOperation`, one mutex-protected decrement when it finishes; for any
    /// other operation, one hidden hook operation (see `Operation.onFinish(on:_:)`).
    /// - Precondition: as for `addOperations(_:waitUntilFinished:)`, no operation is finished,
    ///   executing or already in a queue (Foundation stops the process otherwise).
    public func addTrackedOperations(_ operations: [Operation]) {
        guard !operations.isEmpty else { return }
        let tracker = QueueTracker.of(self)
        tracker.willAdd(operations.count)
        for operation in operations {
            observeFinish(of: operation, .afterAnnouncement) { tracker.didFinishOne() }
        }
        addOperations(operations, waitUntilFinished: false)
    }

    /// Adds `operation` and counts it for `onDrained(on:_:)` and `QueueActivity`; see
    /// `addTrackedOperations(_:)`. Adding a batch with that method rather than one at a time
    /// avoids reporting a drain each time the earlier ones happen to finish first.
    public func addTrackedOperation(_ operation: Operation) {
        addTrackedOperations([operation])
    }

    /// Adds a `BlockOperation` running `block`, counted for `onDrained(on:_:)` and
    /// `QueueActivity`; see `addTrackedOperations(_:)`.
    public func addTrackedOperation(_ block: @escaping @Sendable () -> Void) {
        addTrackedOperations([BlockOperation(block: block)])
    }

    // MARK: Hooks

    /// Runs `body` on `loop` each time the queue's tracked operations have all finished: every
    /// time their count falls to 0 after work was added with `addTrackedOperations(_:)` — what
    /// Darwin code gets by observing `operationCount` with KVO, which Linux does not have.
    ///
    /// Any thread. `body` runs on `loop`'s thread, posted with `loop.execute`, exactly once per
    /// drain — also when the last operations finish at the same moment on many threads (see
    /// `QueueTracker` for why). A hook added while operations are in flight fires at the end of
    /// that drain; one added to an idle queue waits for the next work. Several hooks fire in the
    /// order they were added, each on its own loop. When `body` runs, new work may already have
    /// been added; Foundation's own `operationCount` also counts untracked operations, and may
    /// lag the tracked count by a moment (see `AsyncOperation` on who does Foundation's
    /// bookkeeping).
    ///
    /// - Returns: a handle whose `cancel()` removes the hook; the hook stays while the queue's
    ///   tracker lives otherwise (dropping the handle does not remove it).
    @discardableResult
    public func onDrained(on loop: EventLoop = .main, _ body: @escaping @Sendable () -> Void) -> DrainHook {
        QueueTracker.of(self).addHook(on: loop, body)
    }

    // MARK: Waiting without deadlock

    /// Waits until the queue has no operations left — while spinning `loop`, so everything
    /// delivered to that loop meanwhile (completions, `onFinish` hooks, timers, input) still runs.
    ///
    /// This is the wait that deadlocks when done the plain way: when operations deliver their
    /// completions to the main thread, a plain `waitUntilAllOperationsAreFinished()` on the main
    /// thread blocks the very thread those completions need, and never returns. Here, call it on the
    /// loop's thread (`EventLoop.main` on the main thread) and the completions run inside the
    /// wait.
    ///
    /// It sees every operation in the queue, tracked or not, including those added while it
    /// waits: a helper thread makes Foundation's own blocking wait and then wakes the loop, so
    /// the loop sleeps in epoll meanwhile — no polling. When it returns `true`, everything that
    /// was posted to `loop` before the last `finish()` call (the completions that called
    /// `finish()`, results they posted) has run; `onFinish` hooks posted by the finishing are
    /// normally done too, but not promised (they may be queued right behind).
    ///
    /// Loop thread only (precondition). Cost: one short-lived thread per call that has to wait.
    /// - Parameters:
    ///   - loop: the loop to keep running while waiting; the caller's thread must be its thread.
    ///   - timeout: the longest to wait; `nil` for no limit; negative counts as zero.
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
