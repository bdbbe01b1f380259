import MainspringCore
import Synchronization

/// The response timeout of one exchange: one timer of the client's loop, armed when the
/// response's head is first awaited and cancelled when the exchange settles, whatever the
/// number of reads in between.
///
/// A phase (the head, or one read of the body) sets the instant by which it must end — an
/// atomic store, from any thread — and the timer, when it fires, compares: earlier than that
/// instant it sleeps again until it; at or past it, it closes the connection (which ends the
/// read in progress) and marks the exchange timed out. Between phases (a streamed body whose
/// consumer is busy) nothing is timed: the timer wakes once per timeout to find that so. The
/// cost of a request is therefore one loop timer (an allocation, O(log n) to arm and to cancel),
/// not a task and a global-executor timer per read; from a task off the loop, arming and
/// cancelling are one post each.
///
/// Times are the loop's clock's (virtual time on a simulated loop).
final class ResponseDeadline: @unchecked Sendable {
    private let loop: EventLoop
    private let limit: Duration
    private let connection: Connection
    /// The loop-clock instant (ns) by which the current phase must end; `idle` between phases,
    /// `settled` once the exchange has ended (the timer is then cancelled or fires for nothing).
    private let deadline = Atomic<UInt64>(ResponseDeadline.idle)
    /// Whether the timer has been asked for (set once, by the first phase).
    private let requested = Atomic<Bool>(false)
    /// Whether the timeout fired: the connection was closed because a phase ran over.
    private let firedFlag = Atomic<Bool>(false)
    /// The loop's timer. Loop thread only.
    private var timer: TimerHandle?

    private static let idle: UInt64 = 0
    private static let settled: UInt64 = .max

    init(loop: EventLoop, limit: Duration, connection: Connection) {
        self.loop = loop
        self.limit = limit
        self.connection = connection
    }

    /// Whether a phase ran over its timeout (and the connection was closed for it).
    var fired: Bool { firedFlag.load(ordering: .acquiring) }

    /// A phase begins: it must end within the limit from now. Any thread.
    func beginPhase() {
        let end = loop.clock.now.advanced(by: limit).nanoseconds
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
        schedule(after: limit)
    }

    private func schedule(after delay: Duration) {
        timer = loop.schedule(after: delay) { [self] in expire() }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
    }

    /// The timer fired: the phase ran over, or it sleeps again until the phase's end (or, between
    /// phases, for one more timeout).
    private func expire() {
        timer = nil
        let end = deadline.load(ordering: .acquiring)
        switch end {
        case Self.settled:
            return
        case Self.idle:
            schedule(after: limit)
        default:
            let now = loop.clock.now.nanoseconds
            if now < end {
                schedule(after: .nanoseconds(Int64(clamping: end - now)))
                return
            }
            firedFlag.store(true, ordering: .releasing)
            connection.close()
        }
    }
}
