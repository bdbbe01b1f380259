/// A handle on a scheduled timer: `cancel()` it, or let it be (the loop keeps a timer alive
/// until it fires or is cancelled; dropping the handle does not cancel it). See `Cancellable`.
///
/// Loop-bound: use it on the loop's thread (``ScheduledTimer``, from `execute(after:_:)`, is
/// the handle any thread may cancel).
public final class TimerHandle: Cancellable {
    /// The timer, held strongly: a weak reference would give every timer a side table, which
    /// sends each of its retains and releases (several per firing) down the runtime's slow path —
    /// half of a simulated timer's cost was there. The source lets go of its closures and of
    /// this handle when it closes, and never touches its loop after that, so a handle kept
    /// longer keeps only a small closed object alive, not the loop.
    private let source: TimerSource

    init(source: TimerSource) { self.source = source }

    /// Cancels the timer: once this returns (on the loop's thread) its handler never runs again,
    /// even if it was already due. Idempotent; a no-op after a one-shot timer fired.
    @available(*, noasync, message: "loop thread only; in async code use a `ScheduledTimer` (`execute(after:_:)`), which any thread may cancel")
    public func cancel() {
        guard !source.isClosed else { return }
        source.loop.preconditionOnLoop("TimerHandle.cancel()")
        source.close()
    }

    /// Whether the timer will not fire again (cancelled, or a one-shot that already fired).
    public var isCancelled: Bool { source.isClosed }
}

@available(*, unavailable)
extension TimerHandle: Sendable {}

/// A timer of the loop's `TimerQueue` (one-shot, or repeating: re-armed after each run, from
/// its previous deadline, so it neither drifts nor re-enters its handler).
final class TimerSource: DeadlineSource {
    private let interval: UInt64?
    private var oneShot: (() -> Void)?
    private var repeating: ((TimerHandle) -> Void)?
    /// Its handle, made once (the handle holds the source too: `didClose` ends the cycle).
    private var handle: TimerHandle?

    /// - Parameter deadline: the first run's deadline (monotonic ns).
    init(loop: EventLoop, deadline: UInt64, interval: UInt64?, oneShot: (() -> Void)?,
         repeating: ((TimerHandle) -> Void)?)
    {
        self.interval = interval
        self.oneShot = oneShot
        self.repeating = repeating
        super.init(loop: loop, priority: .normal, keepsLoopBusy: interval == nil)
        arm(at: deadline)
    }

    func makeHandle() -> TimerHandle {
        if let handle { return handle }
        let made = TimerHandle(source: self)
        handle = made
        return made
    }

    override func perform(_ readiness: Readiness) {
        // The queue fires a timer only once its deadline has passed: never early.
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
        let now = withLoop { $0.monotonicNow() }
        var next = deadline
        if interval == 0 {
            next = now
        } else if next <= now {
            next &+= ((now - next) / interval + 1) * interval
        }
        arm(at: next)
    }

    override func didClose() {
        super.didClose()
        oneShot = nil
        repeating = nil
        handle = nil
    }
}

extension EventLoop {
    /// Runs `work` once on this loop after `delay` — never earlier (measured on the monotonic
    /// clock), as soon after as the loop's other work allows. `delay` is a wait: negative counts
    /// as zero.
    ///
    /// Timers run in deadline order, and timers due at the same instant run in the order they
    /// were created: timers scheduled one after another with one delay run in that order, however
    /// many fall within one clock tick (deadlines keep their nanoseconds).
    ///
    /// Loop thread only (precondition; from another thread, ``execute(after:_:)`` takes a
    /// `Sendable` closure and returns a handle any thread may cancel). Timers run at `.normal`
    /// priority; libevent's precise (timerfd) timer keeps lateness in the tens of microseconds on
    /// an idle loop. Costs one allocation and O(log n) in the loop's pending timers (the same to
    /// cancel).
    /// - Returns: a handle to cancel the timer; the loop keeps the timer alive without it.
    @available(*, noasync, message: "loop thread only; in async code use `execute(after:_:)` (any thread; at once on the loop's own) or `sleep(for:)`")
    @discardableResult
    public func schedule(after delay: Duration, _ work: @escaping () -> Void) -> TimerHandle {
        preconditionOnLoop("EventLoop.schedule(after:_:)", elsewhereUse: "execute(after:_:)")
        return makeTimer(deadline: monotonicNow() &+ delay.clampedNanoseconds, interval: nil, oneShot: work,
                         repeating: nil)
    }

    /// Runs `work` once on this loop at `deadline` (monotonic ns, `monotonicNanoseconds()`) or
    /// later: `schedule(after:)` for a deadline computed earlier, possibly on another thread
    /// (`sleep(for:)`, `Queue.after`), so that it keeps its nanoseconds. Loop thread only.
    /// `package`: `Queue.after` (MainspringPatterns) schedules with it.
    @discardableResult
    package func schedule(atMonotonicNanoseconds deadline: UInt64, _ work: @escaping () -> Void) -> TimerHandle {
        preconditionOnLoop("EventLoop.schedule(atMonotonicNanoseconds:_:)")
        return makeTimer(deadline: deadline, interval: nil, oneShot: work, repeating: nil)
    }

    /// Runs `work` every `interval` on this loop until the timer is cancelled (`work` gets the
    /// handle, so it can cancel itself). The first run is one interval from now.
    ///
    /// Deadlines stay on the grid `start + k × interval`: a late run does not shift the next one,
    /// and ticks missed while the loop was busy are skipped rather than run in a burst. The
    /// handler is never re-entered. Ticks due at the same instant as other timers run in creation
    /// order, like one-shot timers. Loop thread only (precondition; from another thread,
    /// ``execute(every:_:)``).
    ///
    /// `interval` is a period: it must be positive (zero or negative stops the program with a
    /// message), and one shorter than ``minimumRepeatInterval`` is raised to it, so that no
    /// repeating timer can keep its loop from sleeping.
    @available(*, noasync, message: "loop thread only; in async code use `execute(every:_:)` (any thread; at once on the loop's own)")
    @discardableResult
    public func schedule(every interval: Duration, _ work: @escaping (TimerHandle) -> Void) -> TimerHandle {
        preconditionOnLoop("EventLoop.schedule(every:_:)", elsewhereUse: "execute(every:_:)")
        let nanoseconds = max(requirePositive(interval, "EventLoop.schedule(every:_:)'s interval"),
                              Self.minimumRepeatInterval.clampedNanoseconds)
        return makeRepeatingTimer(firstDeadline: monotonicNow() &+ nanoseconds, interval: nanoseconds, work)
    }

    /// A repeating timer whose first run is at `firstDeadline` (monotonic ns) and then every
    /// `interval` ns (already checked and raised to the minimum). Loop thread only.
    func makeRepeatingTimer(firstDeadline: UInt64, interval: UInt64, _ work: @escaping (TimerHandle) -> Void)
        -> TimerHandle
    {
        makeTimer(deadline: firstDeadline, interval: interval, oneShot: nil, repeating: work)
    }

    /// The shortest interval of a repeating timer (100 µs): `schedule(every:)` raises shorter
    /// ones to it. At most 10,000 ticks a second, with the loop polling between them.
    public static let minimumRepeatInterval: Duration = .microseconds(100)

    private func makeTimer(deadline: UInt64, interval: UInt64?, oneShot: (() -> Void)?,
                           repeating: ((TimerHandle) -> Void)?) -> TimerHandle
    {
        // The loop keeps the source while it is registered; the handle holds it too (see TimerHandle).
        let source = TimerSource(loop: self, deadline: deadline, interval: interval, oneShot: oneShot,
                                 repeating: repeating)
        return source.makeHandle()
    }
}
