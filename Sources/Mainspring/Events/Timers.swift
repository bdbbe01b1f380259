/// A handle on a scheduled timer: `cancel()` it, or let it be (the loop keeps a timer alive
/// until it fires or is cancelled; dropping the handle does not cancel it). See `Cancellable`.
///
/// Loop-bound: use it on the loop's thread.
public final class TimerHandle: Cancellable {
    private let reference: SourceReference

    init(source: TimerSource) { reference = SourceReference(source) }

    /// Cancels the timer: once this returns (on the loop's thread) its handler never runs again,
    /// even if it was already due. Idempotent; a no-op after a one-shot timer fired.
    public func cancel() { reference.cancel("TimerHandle.cancel()") }

    /// Whether the timer will not fire again (cancelled, or a one-shot that already fired).
    public var isCancelled: Bool { reference.isCancelled }
}

@available(*, unavailable)
extension TimerHandle: Sendable {}

/// A libevent timer (one-shot; a repeating timer is re-armed after each run, from its previous
/// deadline, so it neither drifts nor re-enters its handler).
final class TimerSource: Source {
    private var deadline: UInt64
    private let interval: UInt64?
    private var oneShot: (() -> Void)?
    private var repeating: ((TimerHandle) -> Void)?
    private var handle: TimerHandle?

    init(loop: EventLoop, delay: UInt64, interval: UInt64?, oneShot: (() -> Void)?,
         repeating: ((TimerHandle) -> Void)?) throws(EventLoopError)
    {
        self.deadline = monotonicNanoseconds() &+ delay
        self.interval = interval
        self.oneShot = oneShot
        self.repeating = repeating
        super.init(loop: loop, priority: .normal, keepsLoopBusy: interval == nil)
        do {
            native = try NativeEvent(timerOn: loop.base, target: self)
            try native?.add(timeoutNanoseconds: delay)
        } catch {
            close()
            throw error
        }
    }

    func makeHandle() -> TimerHandle {
        if let handle { return handle }
        let made = TimerHandle(source: self)
        handle = made
        return made
    }

    override func perform(_ readiness: Readiness) {
        let now = monotonicNanoseconds()
        if now < deadline {
            // Never early: libevent fired before our clock reached the deadline; wait the rest.
            try? native?.add(timeoutNanoseconds: deadline - now)
            return
        }
        if let oneShot {
            close()
            oneShot()
            return
        }
        if let repeating {
            repeating(makeHandle())
        }
    }

    override func didRun() {
        // Re-arm a repeating timer at the first deadline after now on its original grid:
        // missed ticks are skipped, not burst.
        guard let interval else { return }
        let now = monotonicNanoseconds()
        if interval == 0 {
            deadline = now
        } else if deadline <= now {
            deadline &+= ((now - deadline) / interval + 1) * interval
        }
        try? native?.add(timeoutNanoseconds: deadline > now ? deadline - now : 0)
    }

    override func didClose() {
        oneShot = nil
        repeating = nil
        handle = nil
    }
}

extension EventLoop {
    /// Runs `work` once on this loop after `delay` — never earlier (measured on the monotonic
    /// clock), as soon after as the loop's other work allows. A negative delay counts as zero.
    ///
    /// Loop thread only (precondition). Timers run at `.normal` priority; libevent's precise
    /// (timerfd) timers keep lateness in the tens of microseconds on an idle loop.
    /// - Returns: a handle to cancel the timer; the loop keeps the timer alive without it.
    @discardableResult
    public func schedule(after delay: Duration, _ work: @escaping () -> Void) -> TimerHandle {
        preconditionOnLoop("EventLoop.schedule(after:_:)")
        return makeTimer(delay: delay.clampedNanoseconds, interval: nil, oneShot: work, repeating: nil)
    }

    /// Runs `work` every `interval` on this loop until the timer is cancelled (`work` gets the
    /// handle, so it can cancel itself). The first run is one interval from now.
    ///
    /// Deadlines stay on the grid `start + k × interval`: a late run does not shift the next one,
    /// and ticks missed while the loop was busy are skipped rather than run in a burst. The
    /// handler is never re-entered. An interval of zero or less fires once per loop iteration.
    /// Loop thread only (precondition).
    @discardableResult
    public func schedule(every interval: Duration, _ work: @escaping (TimerHandle) -> Void) -> TimerHandle {
        preconditionOnLoop("EventLoop.schedule(every:_:)")
        let nanoseconds = interval.clampedNanoseconds
        return makeTimer(delay: nanoseconds, interval: nanoseconds, oneShot: nil, repeating: work)
    }

    private func makeTimer(delay: UInt64, interval: UInt64?, oneShot: (() -> Void)?,
                           repeating: ((TimerHandle) -> Void)?) -> TimerHandle
    {
        do {
            let source = try TimerSource(loop: self, delay: delay, interval: interval, oneShot: oneShot,
                                         repeating: repeating)
            return source.makeHandle()
        } catch {
            // event_new/event_add only fail when memory runs out; there is no sane way on.
            fatalError("Mainspring: cannot create a timer: \(error)")
        }
    }
}
