import MainspringCore
import Synchronization

/// The deadline of one whole request (``HTTPClient/Configuration/requestTimeout``, or the
/// request's own `timeout` or `deadline`): an instant on the client's loop's clock that the pool
/// wait, the connect, the send and every read of the response are held to.
struct RequestDeadline: Sendable {
    /// The instant (the loop's monotonic ns); `.max`: none.
    let instant: UInt64
    /// What the errors name: the timeout the deadline came from.
    let limit: Duration

    /// No deadline.
    static let none = RequestDeadline(instant: .max, limit: .zero)

    init(instant: UInt64, limit: Duration) {
        self.instant = instant
        self.limit = limit
    }

    /// The request's deadline: its own absolute `deadline`, else `timeout` from `now`.
    init(timeout: Duration?, deadline: LoopClock.Instant?, now: LoopClock.Instant) {
        if let deadline {
            self.init(instant: deadline.nanoseconds, limit: deadline > now ? now.duration(to: deadline) : .zero)
        } else if let timeout {
            self.init(instant: now.advanced(by: max(timeout, .zero)).nanoseconds, limit: max(timeout, .zero))
        } else {
            self = .none
        }
    }

    /// How long is left at `now` (zero once it passed); nil without a deadline.
    func remaining(at now: LoopClock.Instant) -> Duration? {
        guard instant != .max else { return nil }
        return instant > now.nanoseconds ? .nanoseconds(Int64(clamping: instant - now.nanoseconds)) : .zero
    }

    /// The failure of a request whose deadline passed in `phase`.
    func failure(in phase: HTTPClientError.RequestPhase) -> HTTPClientError { .requestTimeout(limit, phase: phase) }
}

/// The timeouts of one exchange — the response timeout of each phase and the request's
/// deadline — on one timer of the client's loop, armed when the request is first sent and
/// cancelled when the exchange settles, whatever the number of reads in between.
///
/// A phase (queueing the request, the head, or one read of the body) sets the instant by which
/// it must end — an atomic store, from any thread: the response timeout from now (none while the
/// request waits for room in the connection's output), or the request's deadline if that comes
/// first. The timer, when it fires, compares:
/// earlier than that instant it sleeps again (never longer than one response timeout, nor past
/// the request's deadline, so that a later phase's end is never missed); at or past it, it closes
/// the connection (which ends the read in progress) and records which limit ran out. Between
/// phases (a streamed body whose consumer is busy) nothing is timed; a phase that begins after
/// the request's deadline fails at once. The cost of a request is therefore one loop timer (an
/// allocation, O(log n) to arm and to cancel), not a task and a global-executor timer per read;
/// from a task off the loop, arming and cancelling are one post each.
///
/// Times are the loop's clock's (virtual time on a simulated loop).
final class ResponseDeadline: @unchecked Sendable {
    private let loop: EventLoop
    private let limit: Duration
    private let request: RequestDeadline
    /// What a limit that runs out ends: an HTTP/1.1 exchange's connection, or an HTTP/2
    /// exchange's stream (the connection serves the others).
    private let connection: Connection?
    /// Weak: the stream holds its deadline (set once, in `init`).
    private weak var stream: HTTP2ClientStream?
    /// The loop-clock instant (ns) by which the current phase must end; `idle` between phases,
    /// `settled` once the exchange has ended (the timer is then cancelled or fires for nothing).
    private let deadline = Atomic<UInt64>(ResponseDeadline.idle)
    /// The current phase (`RequestPhase`'s index), for the error of a request deadline.
    private let phase = Atomic<Int>(0)
    /// Whether the timer has been asked for (set once, by the first phase).
    private let requested = Atomic<Bool>(false)
    /// What ran out: 0 nothing, 1 the response timeout, 2 the request's deadline.
    private let firedKind = Atomic<Int>(0)
    /// The phase the request's deadline ran out in.
    private let firedPhase = Atomic<Int>(0)
    /// The loop's timer. Loop thread only.
    private var timer: TimerHandle?

    private static let idle: UInt64 = 0
    private static let settled: UInt64 = .max - 1

    convenience init(loop: EventLoop, limit: Duration, request: RequestDeadline, connection: Connection) {
        self.init(loop: loop, limit: limit, request: request, connection: connection, stream: nil)
    }

    convenience init(loop: EventLoop, limit: Duration, request: RequestDeadline, stream: HTTP2ClientStream) {
        self.init(loop: loop, limit: limit, request: request, connection: nil, stream: stream)
    }

    private init(loop: EventLoop, limit: Duration, request: RequestDeadline, connection: Connection?,
                 stream: HTTP2ClientStream?)
    {
        self.stream = stream
        self.loop = loop
        self.limit = limit
        self.request = request
        self.connection = connection
    }

    /// Whether a phase ran over a limit (and the connection was closed for it).
    var fired: Bool { firedKind.load(ordering: .acquiring) != 0 }

    /// The error of the limit that ran out (nil if none did).
    var timeoutError: HTTPClientError? {
        switch firedKind.load(ordering: .acquiring) {
        case 1: return .responseTimeout(limit)
        case 2: return request.failure(in: HTTPClientError.RequestPhase(index: firedPhase.load(ordering: .relaxed)))
        default: return nil
        }
    }

    /// A phase begins: it must end within the response timeout from now (none while the
    /// request's bytes wait for room in the connection's output), and by the request's
    /// deadline. Any thread.
    func beginPhase(_ current: HTTPClientError.RequestPhase, timed: Bool = true) {
        let now = loop.clock.now
        let byLimit = timed ? now.advanced(by: limit).nanoseconds : UInt64.max
        let end = min(byLimit, request.instant)
        phase.store(current.index, ordering: .relaxed)
        if request.instant <= now.nanoseconds {
            // Past the request's deadline already (a streamed body read late): over at once.
            fire(kind: 2)
            return
        }
        deadline.store(max(end, 1), ordering: .releasing)
        guard !requested.exchange(true, ordering: .relaxed) else { return }
        if loop.isCurrent {
            armIfUnsettled()
        } else {
            loop.execute { self.armIfUnsettled() }
        }
    }

    /// The phase ended in time: nothing is timed until the next one. Any thread.
    func endPhase() {
        // Not over a settle: a settled exchange stays settled.
        var current = deadline.load(ordering: .relaxed)
        while current != Self.settled {
            let (exchanged, original) = deadline.compareExchange(expected: current, desired: Self.idle,
                                                                  ordering: .relaxed)
            if exchanged { return }
            current = original
        }
    }

    /// The exchange has ended (read to its end, abandoned, failed): the timer is cancelled.
    /// Any thread; idempotent.
    func settle() {
        guard deadline.exchange(Self.settled, ordering: .acquiringAndReleasing) != Self.settled else { return }
        guard requested.load(ordering: .relaxed) else { return }
        if loop.isCurrent {
            cancelTimer()
        } else {
            loop.execute { self.cancelTimer() }
        }
    }

    // MARK: On the loop

    private func armIfUnsettled() {
        guard deadline.load(ordering: .acquiring) != Self.settled else { return }
        sleep(from: loop.clock.now.nanoseconds, until: deadline.load(ordering: .acquiring))
    }

    /// Sleeps until `end` (a phase's), or for one response timeout between phases — never past
    /// the request's deadline.
    private func sleep(from now: UInt64, until end: UInt64) {
        var wake = now &+ UInt64(clamping: limit.clampedNanoseconds)
        if end != Self.idle { wake = min(wake, end) }
        wake = min(wake, request.instant)
        if wake <= now {
            // Between phases past the request's deadline: the next phase fails as it begins.
            return
        }
        timer = loop.schedule(after: .nanoseconds(Int64(clamping: wake - now))) { [self] in expire() }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
    }

    /// The timer fired: the phase ran over, or it sleeps again.
    private func expire() {
        timer = nil
        let end = deadline.load(ordering: .acquiring)
        let now = loop.clock.now.nanoseconds
        switch end {
        case Self.settled:
            return
        case Self.idle:
            sleep(from: now, until: end)
        default:
            if now < end {
                sleep(from: now, until: end)
                return
            }
            fire(kind: end >= request.instant ? 2 : 1)
        }
    }

    /// A limit ran out: recorded, and the connection closed (the read in progress ends), or
    /// the HTTP/2 stream reset.
    private func fire(kind: Int) {
        firedPhase.store(phase.load(ordering: .relaxed), ordering: .relaxed)
        firedKind.store(kind, ordering: .releasing)
        connection?.close()
        stream?.timedOut()
    }
}

extension HTTPClientError.RequestPhase {
    /// The phase as a small number (an atomic's value).
    var index: Int {
        switch self {
        case .waitingForConnection: 0
        case .resolving: 1
        case .connecting: 2
        case .awaitingResponse: 3
        case .readingBody: 4
        }
    }

    init(index: Int) {
        self = switch index {
        case 0: .waitingForConnection
        case 1: .resolving
        case 2: .connecting
        case 3: .awaitingResponse
        default: .readingBody
        }
    }
}
