/// What the consumer of a listener's queue gets: an element, the end, or nothing yet.
enum AcceptOutcome<Element> {
    case element(Element)
    case end
    case wait
}

extension AcceptOutcome: Sendable where Element: Sendable {}

/// The state of a listener's queue of accepted connections, as a value: accepted elements on
/// their way (`pending`), those ready to be taken, the one consumer (none yet, idle, waiting,
/// cancelled), whether accepting is paused for the consumer, whether the listener has closed.
/// Every event returns what to do — resume the waiting consumer with an outcome, resume
/// accepting — which the caller does after releasing its lock. Generic over the element and
/// the waiter, so that the transitions are tested without sockets or tasks
/// (`AcceptQueueStateTests`).
///
/// Accepting pauses once `limit` accepted elements are pending (accepted and not yet taken,
/// including those still on their way to their loop) and resumes as soon as fewer are — by
/// whichever event brings the count down: a take, a hand-off straight to the waiting consumer,
/// or an element that failed on its way.
struct AcceptQueueState<Element, Waiter> {
    typealias Outcome = AcceptOutcome<Element>

    enum Consumer {
        /// Nobody iterates yet.
        case unclaimed
        /// The consumer iterates and is not waiting.
        case idle
        /// The consumer is suspended until an element arrives or the listener closes.
        case waiting(Waiter)
        /// The consumer's task was cancelled: it never waits again.
        case cancelled
    }

    /// A waiting consumer to resume, and with what.
    struct Wake {
        let waiter: Waiter
        let outcome: Outcome
    }

    let limit: Int
    private var ready: [Element] = []
    private var first = 0
    /// Accepted and not yet taken (including those on their way to their loop).
    private(set) var pending = 0
    private(set) var consumer: Consumer = .unclaimed
    private(set) var isAcceptPaused = false
    /// The listener closed: the consumer ends once the pending elements are delivered.
    private(set) var isFinished = false

    init(limit: Int) { self.limit = limit }

    var hasWaiter: Bool {
        if case .waiting = consumer { return true }
        return false
    }

    /// The consumer starts iterating. Returns false if there was one already.
    mutating func claim() -> Bool {
        guard case .unclaimed = consumer else { return false }
        consumer = .idle
        return true
    }

    /// One more element accepted. Returns whether accepting must pause now.
    mutating func reserve() -> Bool {
        pending += 1
        guard pending >= limit, !isAcceptPaused else { return false }
        isAcceptPaused = true
        return true
    }

    /// A reserved element could not be made (its socket was closed on the way).
    mutating func release() -> (wake: Wake?, resumeAccepting: Bool) {
        pending -= 1
        let resume = mayResumeAccepting()
        return (wakeIfDone(), resume)
    }

    /// A reserved element is ready: handed straight to a waiting consumer (which takes it at
    /// once, so no `take` will see the count go down: this event resumes accepting), or kept.
    mutating func push(_ element: Element) -> (wake: Wake?, resumeAccepting: Bool) {
        guard case .waiting(let waiter) = consumer else {
            ready.append(element)
            return (nil, false)
        }
        consumer = .idle
        pending -= 1
        return (Wake(waiter: waiter, outcome: .element(element)), mayResumeAccepting())
    }

    /// The listener closed.
    mutating func finish() -> Wake? {
        isFinished = true
        return wakeIfDone()
    }

    /// Takes a ready element, or says that the iteration ended (`.end`) or must wait.
    mutating func take() -> (outcome: Outcome, resumeAccepting: Bool) {
        if first < ready.count {
            let element = ready[first]
            first += 1
            if first == ready.count {
                ready.removeAll(keepingCapacity: true)
                first = 0
            }
            pending -= 1
            return (.element(element), mayResumeAccepting())
        }
        if isFinished && pending == 0 { return (.end, false) }
        return (.wait, false)
    }

    /// `take`, or parks `waiter` until an element arrives or the listener closes. `parked` is
    /// false when the outcome is final now — an element, the end, or `.wait` for a cancelled
    /// consumer (whose `next` then throws) — and the caller resumes `waiter` with it.
    mutating func takeOrPark(_ waiter: Waiter) -> (outcome: Outcome, parked: Bool, resumeAccepting: Bool) {
        let (outcome, resume) = take()
        guard case .wait = outcome else { return (outcome, false, resume) }
        if case .cancelled = consumer { return (.wait, false, resume) }
        consumer = .waiting(waiter)
        return (.wait, true, resume)
    }

    /// The consumer's task was cancelled: returns the waiter to resume (with `.wait`), if any.
    mutating func cancel() -> Waiter? {
        defer { consumer = .cancelled }
        if case .waiting(let waiter) = consumer { return waiter }
        return nil
    }

    /// Unpauses accepting once fewer than `limit` are pending; true if it did.
    private mutating func mayResumeAccepting() -> Bool {
        guard isAcceptPaused && pending < limit else { return false }
        isAcceptPaused = false
        return true
    }

    private mutating func wakeIfDone() -> Wake? {
        guard isFinished, pending == 0, case .waiting(let waiter) = consumer else { return nil }
        consumer = .idle
        return Wake(waiter: waiter, outcome: .end)
    }
}

/// The accepted connections of a listener without a handler, between the loops that create
/// them and the task that takes them: an `AcceptQueueState` under one lock, whose wake-ups are
/// done after the lock.
final class ConnectionQueue: Sendable {
    typealias Outcome = AcceptOutcome<Connection>
    typealias State = AcceptQueueState<Connection, UnsafeContinuation<Outcome, Never>>

    private let state = Protected(State(limit: Listener.maxWaitingConnections))

    func claim() {
        let claimed = state.withLock { $0.claim() }
        requireUsage(claimed, "Mainspring: Listener.connections: the connections already have a consumer; iterate them once, from one task")
    }

    /// Acceptor thread: one more connection accepted. Returns whether accepting must pause.
    func reserve() -> Bool { state.withLock { $0.reserve() } }

    /// Whether the consumer's task is suspended waiting for a connection.
    var hasWaiter: Bool { state.withLock { $0.hasWaiter } }

    /// Whether accepting is paused for the consumer.
    var isAcceptPaused: Bool { state.withLock { $0.isAcceptPaused } }

    /// A reserved connection could not be made (its fd was closed). Returns whether accepting,
    /// paused for the consumer, may resume now.
    func release() -> Bool {
        let (wake, resume) = state.withLock { $0.release() }
        Self.apply(wake)
        return resume
    }

    /// A reserved connection is ready, on its loop. Returns whether accepting, paused for the
    /// consumer, may resume now.
    func push(_ connection: Connection) -> Bool {
        let (wake, resume) = state.withLock { $0.push(connection) }
        Self.apply(wake)
        return resume
    }

    /// The listener closed: the consumer ends once the pending connections are delivered.
    func finish() {
        Self.apply(state.withLock { $0.finish() })
    }

    /// Takes a ready connection, or tells whether the iteration has ended; `resumeAccepting`
    /// when accepting was paused and may resume now.
    func take() -> (outcome: Outcome, resumeAccepting: Bool) {
        state.withLock { $0.take() }
    }

    /// `take`, or parks `continuation` until a connection arrives or the listener closes.
    func takeOrPark(_ continuation: UnsafeContinuation<Outcome, Never>) -> (outcome: Outcome, resumeAccepting: Bool) {
        let (outcome, parked, resume) = state.withLock { $0.takeOrPark(continuation) }
        // Not parked: a connection, the end, or a cancelled consumer (`.wait`: its `next` throws).
        if !parked { continuation.resume(returning: outcome) }
        return (outcome, resume)
    }

    /// The consumer's task was cancelled: resumes it (its `next` then throws).
    func cancelWaiter() {
        state.withLock { $0.cancel() }?.resume(returning: .wait)
    }

    private static func apply(_ wake: State.Wake?) {
        guard let wake else { return }
        wake.waiter.resume(returning: wake.outcome)
    }
}
