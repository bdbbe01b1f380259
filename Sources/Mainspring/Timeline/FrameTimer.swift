/// The one libevent timer a running `Timeline` re-arms for its delays and its frames: absolute
/// deadlines on the monotonic clock (the timers' clock), never early, at `.normal` priority (so
/// it runs ahead of `.background` fed work). One native event per timeline, re-armed in place:
/// no allocation per frame.
///
/// A `Source`, so its handler is never re-entered: if an `update` spins the loop, the frame
/// timer waits for it.
final class FrameTimer: Source {
    private var deadline: UInt64 = 0
    private var handler: ((UInt64) -> Void)?

    /// - Parameter handler: called on the loop's thread with the monotonic time (ns) it was
    ///   called at, which is never before the armed deadline.
    init(loop: EventLoop, handler: @escaping (UInt64) -> Void) throws(EventLoopError) {
        self.handler = handler
        super.init(loop: loop, priority: .normal)
        do {
            native = try NativeEvent(timerOn: loop.base, target: self)
        } catch {
            close()
            throw error
        }
    }

    /// Arms the timer for `deadline` (monotonic ns), replacing any earlier deadline. A deadline
    /// in the past fires at the next poll.
    func arm(at deadline: UInt64) {
        self.deadline = deadline
        let now = monotonicNanoseconds()
        // event_add fails only when libevent runs out of memory; like TimerSource, go on.
        try? native?.add(timeoutNanoseconds: deadline > now ? deadline - now : 0)
    }

    override func perform(_ readiness: Readiness) {
        let now = monotonicNanoseconds()
        if now < deadline {
            // Never early: libevent fired before our clock reached the deadline; wait the rest.
            try? native?.add(timeoutNanoseconds: deadline - now)
            return
        }
        handler?(now)
    }

    override func didClose() {
        handler = nil
    }
}
