import Synchronization

/// A timer scheduled from any thread (``EventLoop/execute(after:_:)``,
/// ``EventLoop/execute(every:_:)``): the `Sendable` counterpart of `TimerHandle`.
///
/// `cancel()` works from any thread and follows `Cancellable`'s rules: once it returns, the work
/// never starts again (a run already in progress on the loop's thread finishes). Dropping the
/// handle does not cancel the timer. A cancel from another thread is one post to the loop,
/// which frees the loop's timer there; the work is held back at once by a flag the run checks.
public final class ScheduledTimer: Cancellable, Sendable {
    /// The loop the work runs on.
    public let loop: EventLoop
    private let over = Atomic<Bool>(false)
    /// The loop's timer once the loop has made it. Only the loop's thread reads or writes it
    /// (the post that makes the timer, the timer's own runs, the post that cancels it), and
    /// those run one after another on that thread.
    nonisolated(unsafe) private var timer: TimerHandle?

    init(loop: EventLoop) { self.loop = loop }

    /// Cancels the timer: once this returns (on any thread) the work is never started again,
    /// even if it was already due; a run already in progress on the loop's thread finishes.
    /// Idempotent; a no-op after a one-shot timer's work has started. Any thread: on the loop's
    /// thread it frees the timer at once, elsewhere it posts that to the loop.
    public func cancel() {
        guard !over.exchange(true, ordering: .acquiringAndReleasing) else { return }
        loop.executeNowOrPost({ self.freeTimer() }, orElse: {})
    }

    /// Whether the work will not start again: cancelled, or a one-shot whose work has started.
    /// Any thread.
    public var isCancelled: Bool { over.load(ordering: .acquiring) }

    /// Arms the loop's timer (on the loop's thread) unless the handle was cancelled first.
    fileprivate func arm(_ make: () -> TimerHandle) {
        guard !isCancelled else { return }
        timer = make()
    }

    /// Claims a one-shot's single run: false when `cancel()` came first.
    fileprivate func claimOneShotRun() -> Bool {
        !over.exchange(true, ordering: .acquiringAndReleasing)
    }

    /// The loop's thread: frees the timer (a repeating one's next runs, and its closure).
    fileprivate func freeTimer() {
        timer?.cancel()
        timer = nil
    }
}

extension EventLoop {
    /// Runs `work` once on this loop after `delay`, from any thread: ``schedule(after:_:)`` for
    /// code that is not on the loop (a plain thread, a task elsewhere), with a `Sendable` closure
    /// and a `Sendable` handle. Never earlier than `delay` after this call (the deadline is taken
    /// here, on the loop's clock: virtual time on a simulated loop); `delay` is a wait, negative
    /// counts as zero.
    ///
    /// On the loop's thread it is `schedule(after:)` with a handle that can be cancelled from
    /// anywhere; elsewhere it costs one post to the loop (as `execute(_:)`) beside the timer's
    /// allocation and O(log n). The work does not run, and the handle's `cancel()` does nothing
    /// beyond its flag, if the loop is shut down first. Timers run at `.normal` priority, in
    /// deadline order; two scheduled from one thread with one delay run in the order they were
    /// scheduled.
    /// - Returns: a handle to cancel the work from any thread; the loop keeps the timer without it.
    @discardableResult
    public func execute(after delay: Duration, _ work: @escaping @Sendable () -> Void) -> ScheduledTimer {
        let deadline = monotonicNow() &+ delay.clampedNanoseconds
        let scheduled = ScheduledTimer(loop: self)
        executeNowOrPost({
            scheduled.arm {
                self.schedule(atMonotonicNanoseconds: deadline) {
                    if scheduled.claimOneShotRun() { work() }
                }
            }
        }, orElse: {})
        return scheduled
    }

    /// Runs `work` every `interval` on this loop until the returned handle is cancelled, from any
    /// thread: ``schedule(every:_:)`` for code that is not on the loop, with a `Sendable`
    /// closure (it gets the handle, so it can cancel itself). The first run is one interval
    /// after this call; later runs keep `schedule(every:)`'s grid (no drift, missed ticks
    /// skipped, never re-entered).
    ///
    /// `interval` must be positive: zero or negative stops the program with a message, on the
    /// calling thread; one shorter than ``minimumRepeatInterval`` is raised to it. Costs as
    /// ``execute(after:_:)``.
    @discardableResult
    public func execute(every interval: Duration, _ work: @escaping @Sendable (ScheduledTimer) -> Void)
        -> ScheduledTimer
    {
        let nanoseconds = max(requirePositive(interval, "EventLoop.execute(every:_:)'s interval"),
                              Self.minimumRepeatInterval.clampedNanoseconds)
        let first = monotonicNow() &+ nanoseconds
        let scheduled = ScheduledTimer(loop: self)
        executeNowOrPost({
            scheduled.arm {
                self.makeRepeatingTimer(firstDeadline: first, interval: nanoseconds) { _ in
                    guard !scheduled.isCancelled else { return scheduled.freeTimer() }
                    work(scheduled)
                }
            }
        }, orElse: {})
        return scheduled
    }
}
