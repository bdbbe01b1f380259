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
    /// What the timer's closures hold: not the handle, which holds the loop (a pending timer
    /// that held its loop through its own closure would keep a loop nobody runs alive).
    fileprivate let state: ScheduledTimerState

    init(loop: EventLoop, state: ScheduledTimerState = ScheduledTimerState()) {
        self.loop = loop
        self.state = state
    }

    /// Cancels the timer: once this returns (on any thread) the work is never started again,
    /// even if it was already due; a run already in progress on the loop's thread finishes.
    /// Idempotent; a no-op after a one-shot timer's work has started. Any thread: on the loop's
    /// thread it frees the timer at once, elsewhere it posts that to the loop. The handle a
    /// repeating timer's work gets is another handle on the same timer: either cancels it.
    public func cancel() {
        guard state.markOver() else { return }
        let state = state
        loop.executeNowOrPost({ state.freeTimer() }, orElse: {})
    }

    /// Whether the work will not start again: cancelled, a one-shot whose work has started, or
    /// a timer whose loop had shut down before it could be armed. Any thread. (A timer the
    /// loop's shutdown closes after it was armed never runs again either, but is not marked
    /// here.)
    public var isCancelled: Bool { state.isOver }
}

/// A `ScheduledTimer`'s flag and the loop's timer, shared with the timer's closures.
final class ScheduledTimerState: Sendable {
    private let over = Atomic<Bool>(false)
    /// The loop's timer once the loop has made it. Only the loop's thread reads or writes it
    /// (the post that makes the timer, the timer's own runs, the post that cancels it), and
    /// those run one after another on that thread.
    nonisolated(unsafe) private var timer: TimerHandle?

    var isOver: Bool { over.load(ordering: .acquiring) }

    /// Marks the work over; false when it already was (cancelled, or a one-shot's run claimed).
    func markOver() -> Bool { !over.exchange(true, ordering: .acquiringAndReleasing) }

    /// Arms the loop's timer (on the loop's thread) unless the work is over already.
    func arm(_ make: () -> TimerHandle) {
        guard !isOver else { return }
        timer = make()
    }

    /// The loop's thread: frees the timer (a repeating one's next runs, and its closure).
    func freeTimer() {
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
        let state = scheduled.state
        executeNowOrPost({
            state.arm {
                self.schedule(atMonotonicNanoseconds: deadline) {
                    if state.markOver() { work() }
                }
            }
        }, orElse: { _ = state.markOver() })
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
        let state = scheduled.state
        // The timer's closure holds neither the loop nor the returned handle (which holds the
        // loop): the loop holds its timers, and a loop nobody runs must still be freed. Each run
        // gets a handle of its own over the same state (one small allocation a tick).
        executeNowOrPost({
            state.arm {
                self.makeRepeatingTimer(firstDeadline: first, interval: nanoseconds) { [unowned self] _ in
                    guard !state.isOver else { return state.freeTimer() }
                    work(ScheduledTimer(loop: self, state: state))
                }
            }
        }, orElse: { _ = state.markOver() })
        return scheduled
    }
}
