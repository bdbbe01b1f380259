/// The one timer a running `Timeline` (`MainspringPatterns`) re-arms for its delays and its frames: absolute deadlines
/// on the monotonic clock (the timers' clock), never early, at `.normal` priority (so it runs
/// ahead of `.background` fed work). A deadline source of the loop's timer queue, re-armed in
/// place: no allocation per frame. Frames of several timelines due at the same instant come in
/// the order the timelines started.
///
/// A `Source`, so its handler is never re-entered: if an `update` spins the loop, the frame
/// timer waits for it. `MainspringPatterns` holds it through ``FrameTimer``.
final class FrameTimerSource: DeadlineSource {
    private var handler: ((UInt64) -> Void)?

    /// - Parameter handler: called on the loop's thread with the monotonic time (ns) it was
    ///   called at, which is never before the armed deadline. Arm the timer with `arm(at:)`.
    init(loop: EventLoop, handler: @escaping (UInt64) -> Void) {
        self.handler = handler
        super.init(loop: loop, priority: .normal)
    }

    override func perform(_ readiness: Readiness) {
        // Re-armed after it fired and before it ran: the new deadline decides.
        guard !isArmed else { return }
        handler?(withLoop { $0.monotonicNow() })
    }

    override func didClose() {
        super.didClose()
        handler = nil
    }
}

/// A re-armable timer on absolute monotonic deadlines, for `Timeline` (in `MainspringPatterns`):
/// the package's handle on a `FrameTimerSource` (a deadline source cannot be subclassed outside
/// this module). Every call is for the loop's thread.
package final class FrameTimer {
    private let source: FrameTimerSource

    /// - Parameter handler: called on the loop's thread with the monotonic time (ns) it was
    ///   called at, never before the armed deadline.
    package init(loop: EventLoop, handler: @escaping (UInt64) -> Void) {
        source = FrameTimerSource(loop: loop, handler: handler)
    }

    /// Arms (or re-arms) the timer for `deadline`, monotonic nanoseconds.
    package func arm(at deadline: UInt64) { source.arm(at: deadline) }

    /// Stops the timer for good and drops its handler.
    package func close() { source.close() }
}
