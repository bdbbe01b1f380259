import Foundation
import MainspringCore

/// An `AsyncOperation` that keeps its worker thread and runs that thread's event loop until it
/// finishes — the "spin the current run loop until the operation is done" pattern
/// (`RunLoop.current.run(mode:before:)` in a loop), done right.
///
/// `start()` (on the queue's worker thread) calls `execute()` with `EventLoop.current` being
/// the worker's own loop, then spins that loop (`spin(until:)`) until `finish()` or `cancel()`.
/// While it waits the thread sleeps in `epoll_wait`: no CPU, no polling (on Linux
/// `RunLoop.run(mode:before:)` returns at once on a thread without run-loop sources, so that
/// loop turns into a 100 % CPU busy loop). Timers, fd watchers, `readLines` and work posted
/// with `execute(_:)` on that loop just work inside `execute()`:
///
/// ```swift
/// final class Ping: SpinningOperation, @unchecked Sendable {
///     override func execute() {
///         EventLoop.current.schedule(after: .milliseconds(200)) { self.finish() }
///     }
/// }
/// ```
///
/// ## Finishing and cancelling
/// - `finish()` works from any thread; from another thread it posts a no-op to the loop to wake
///   it. The worker thread itself then ends the spin, calls `willFinish()`, and marks the
///   operation finished — so the operation is finished a moment after `finish()` returns, never
///   while the worker is still inside the spin.
/// - `cancel()` (any thread) wakes the loop too: the spin ends, `willFinish()` runs (check
///   `isCancelled` there) and the operation finishes without waiting for `finish()`.
/// - A `stop()` of the worker's loop also ends the spin; the operation is then cancelled.
/// - A worker thread that has no loop yet and cannot make one (the process is out of file
///   descriptors) does not call `execute()`: the operation is cancelled, `loopError` tells why,
///   and `willFinish()` runs as after any cancellation.
///
/// Sources you create on the loop belong to that worker thread's loop, which outlives the
/// operation (Foundation reuses its threads): cancel your timers and watchers in `willFinish()`
/// so that they cannot fire inside a later operation's spin on the same thread. Work posted to
/// the loop after the operation finished runs the next time something spins that thread's
/// loop.
///
/// Cost: one blocked queue thread per running operation (as with `RunLoop`), one eventfd write
/// per cross-thread `finish()`/`cancel()`.
open class SpinningOperation: AsyncOperation, @unchecked Sendable {
    /// The worker's loop while the operation executes (set before `execute()`, cleared after
    /// the spin): where `finish()`/`cancel()` from other threads post their wake-up.
    private let spinningLoop = Protected<EventLoop?>(nil)
    private let loopFailure = Protected<EventLoopError?>(nil)

    /// Why the operation was cancelled without executing: its worker thread had no loop and
    /// none could be made (see `EventLoop.forCurrentThread()`); `nil` otherwise. Any thread.
    public var loopError: EventLoopError? { loopFailure.withLock { $0 } }

    /// Creates a spinning operation; its `execute()` runs on the loop of the thread that starts it.
    public override init() {
        super.init()
    }

    /// Called on the worker thread, on its loop, once the spin has ended (after `finish()`, a
    /// cancellation or a `stop()`) and before the operation is marked finished: cancel the
    /// timers and watchers `execute()` created here. The default does nothing.
    open func willFinish() {}

    /// Cancels the operation (see `Operation.cancel()`); while it executes, this also ends its
    /// spin, from any thread. Subclasses that override it must call `super.cancel()`.
    open override func cancel() {
        super.cancel()
        wakeLoop()
    }

    override func performExecution() {
        let loop: EventLoop
        do {
            loop = try EventLoop.forCurrentThread()
        } catch {
            loopFailure.withLock { $0 = error }
            super.cancel()
            willFinish()
            claimFinishing()
            announceFinished(wasExecuting: true)
            return
        }
        spinningLoop.withLock { $0 = loop }
        execute()
        // `finish()` and `cancel()` from other threads change the condition first and post a
        // wake-up afterwards, so the spin cannot miss them; from this thread (inside a handler)
        // the condition is checked after every callback.
        let ended = loop.spin(until: { self.isFinishRequested || self.isCancelled })
        if !ended {
            // A stop() of this thread's loop unwound the spin.
            cancel()
        }
        spinningLoop.withLock { $0 = nil }
        willFinish()
        claimFinishing()
        announceFinished(wasExecuting: true)
    }

    override func finishRequested() {
        // The worker thread announces once its spin has ended; just wake it.
        wakeLoop()
    }

    private func wakeLoop() {
        guard let loop = spinningLoop.withLock({ $0 }), !loop.isCurrent else { return }
        loop.execute {}
    }
}
