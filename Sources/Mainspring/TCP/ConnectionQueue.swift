/// The accepted connections of a listener without a handler, between the loops that create
/// them and the task that takes them. One lock; the continuation is resumed outside it.
final class ConnectionQueue: Sendable {
    enum Outcome: Sendable {
        case connection(Connection)
        case end
        case wait
    }

    private struct State {
        var ready: [Connection] = []
        var first = 0
        /// Accepted and not yet taken (including those on their way to their loop).
        var pending = 0
        var waiter: UnsafeContinuation<Outcome, Never>?
        var isFinished = false
        var isClaimed = false
        var acceptIsPaused = false
        /// The consumer's task was cancelled: it never waits again.
        var isCancelled = false
    }

    private let state = Protected(State())

    func claim() {
        let claimed = state.withLock { state -> Bool in
            defer { state.isClaimed = true }
            return !state.isClaimed
        }
        requireUsage(claimed, "Mainspring: Listener.connections: the connections already have a consumer; iterate them once, from one task")
    }

    /// Acceptor thread: one more connection accepted. Returns whether accepting must pause.
    func reserve() -> Bool {
        state.withLock { state in
            state.pending += 1
            if state.pending >= Listener.maxWaitingConnections && !state.acceptIsPaused {
                state.acceptIsPaused = true
                return true
            }
            return false
        }
    }

    /// Whether the consumer's task is suspended waiting for a connection.
    var hasWaiter: Bool { state.withLock { $0.waiter != nil } }

    /// Whether accepting is paused for the consumer.
    var isAcceptPaused: Bool { state.withLock { $0.acceptIsPaused } }

    /// A reserved connection could not be made (its fd was closed). Returns whether accepting,
    /// paused for the consumer, may resume now.
    func release() -> Bool {
        let (waiter, outcome, resume) = state.withLock { state in
            state.pending -= 1
            let resume = Self.mayResumeAccepting(&state)
            let (waiter, outcome) = Self.wakeIfDone(&state)
            return (waiter, outcome, resume)
        }
        waiter?.resume(returning: outcome)
        return resume
    }

    /// A reserved connection is ready, on its loop. Returns whether accepting, paused for the
    /// consumer, may resume now: handed straight to a waiting consumer, the connection is taken
    /// at once, and no `take` will see the count go down.
    func push(_ connection: Connection) -> Bool {
        let (waiter, resume) = state.withLock { state -> (UnsafeContinuation<Outcome, Never>?, Bool) in
            guard let waiter = state.waiter else {
                state.ready.append(connection)
                return (nil, false)
            }
            state.waiter = nil
            state.pending -= 1
            return (waiter, Self.mayResumeAccepting(&state))
        }
        waiter?.resume(returning: .connection(connection))
        return resume
    }

    /// Unpauses accepting once fewer than `maxWaitingConnections` are pending; true if it did.
    private static func mayResumeAccepting(_ state: inout State) -> Bool {
        guard state.acceptIsPaused && state.pending < Listener.maxWaitingConnections else { return false }
        state.acceptIsPaused = false
        return true
    }

    /// The listener closed: the consumer ends once the pending connections are delivered.
    func finish() {
        let (waiter, outcome) = state.withLock { state -> (UnsafeContinuation<Outcome, Never>?, Outcome) in
            state.isFinished = true
            return Self.wakeIfDone(&state)
        }
        waiter?.resume(returning: outcome)
    }

    private static func wakeIfDone(_ state: inout State) -> (UnsafeContinuation<Outcome, Never>?, Outcome) {
        guard state.isFinished, state.pending == 0, let waiter = state.waiter else { return (nil, .end) }
        state.waiter = nil
        return (waiter, .end)
    }

    /// Takes a ready connection, or tells whether the iteration has ended; `resumeAccepting`
    /// when accepting was paused and may resume now.
    func take() -> (outcome: Outcome, resumeAccepting: Bool) {
        state.withLock { Self.take(&$0) }
    }

    /// `take`, or parks `continuation` until a connection arrives or the listener closes.
    func takeOrPark(_ continuation: UnsafeContinuation<Outcome, Never>) -> (outcome: Outcome, resumeAccepting: Bool) {
        let (taken, parked) = state.withLock { state -> ((outcome: Outcome, resumeAccepting: Bool), Bool) in
            let taken = Self.take(&state)
            guard case .wait = taken.outcome, !state.isCancelled else { return (taken, false) }
            state.waiter = continuation
            return (taken, true)
        }
        // Not parked: a connection, the end, or a cancelled consumer (`.wait`: its `next` throws).
        if !parked { continuation.resume(returning: taken.outcome) }
        return taken
    }

    private static func take(_ state: inout State) -> (outcome: Outcome, resumeAccepting: Bool) {
        if state.first < state.ready.count {
            let connection = state.ready[state.first]
            state.first += 1
            if state.first == state.ready.count {
                state.ready.removeAll(keepingCapacity: true)
                state.first = 0
            }
            state.pending -= 1
            return (.connection(connection), mayResumeAccepting(&state))
        }
        if state.isFinished && state.pending == 0 { return (.end, false) }
        return (.wait, false)
    }

    /// The consumer's task was cancelled: resumes it (its `next` then throws).
    func cancelWaiter() {
        let waiter = state.withLock { state -> UnsafeContinuation<Outcome, Never>? in
            state.isCancelled = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: .wait)
    }
}
