import Foundation
import MainspringCore

extension Operation {
    /// Runs `body` on `loop` once the operation has finished — completed, or cancelled and
    /// finished: the hop back to the main thread that Darwin code does by observing `isFinished`
    /// with KVO, which swift-corelibs-foundation does not have.
    ///
    /// Any thread; register before or after the operation finished (afterwards, `body` is
    /// posted at once). `body` runs exactly once, on `loop`'s thread, posted with
    /// `loop.execute`; check `isCancelled` inside if it matters. Unlike `completionBlock` (one
    /// slot, run on an anonymous Dispatch thread) any number of hooks can be added, and none
    /// replaces another.
    ///
    /// - For an `AsyncOperation`, `body` is posted by the thread that finishes it, as soon as
    ///   `isFinished` reads `true` and normally before the queue is told (dependents released,
    ///   waiters woken); see `AsyncOperation` for the one narrow exception. The queue's
    ///   `operationCount` may still include the operation when `body` runs.
    /// - For any other operation (a `BlockOperation`, say), the hook is a small `BlockOperation`
    ///   on a private queue that depends on this one — Foundation's own dependency machinery
    ///   tells it when the operation finished. It costs one extra operation and one Dispatch hop,
    ///   and is posted shortly after the operation finished, with no ordering promise relative
    ///   to the queue's waiters.
    ///
    /// An operation that never finishes (never started, or an `AsyncOperation` that never calls
    /// `finish()`) never runs its hooks; they stay allocated with it.
    public func onFinish(on loop: EventLoop = .main, _ body: @escaping @Sendable () -> Void) {
        observeFinish(of: self, .beforeAnnouncement) {
            loop.execute(body)
        }
    }
}

/// Calls `body` once when `operation` has finished, on the finishing thread (an
/// `AsyncOperation`) or a private hook queue's thread (any other operation). Quick, non-blocking
/// bodies only.
func observeFinish(of operation: Operation, _ timing: FinishTiming, _ body: @escaping @Sendable () -> Void) {
    if let operation = operation as? AsyncOperation {
        operation.whenFinished(timing, body)
    } else {
        FinishHookQueue.attach(to: operation, body)
    }
}

/// Finish hooks for operations that are not `AsyncOperation`s: a `BlockOperation` per hook that
/// depends on the watched operation, on a private queue. Foundation releases a dependent exactly
/// once when its dependency finishes (cancelled or not, and at once when it already has), under
/// the dependency's lock, so a hook is neither lost nor doubled however the operation finishes.
enum FinishHookQueue {
    static let queue: OperationQueue = {
        let queue = OperationQueue()
        queue.name = "Mainspring finish hooks"
        return queue
    }()

    static func attach(to operation: Operation, _ body: @escaping @Sendable () -> Void) {
        let hook = BlockOperation(block: body)
        hook.addDependency(operation)
        queue.addOperation(hook)
    }
}
