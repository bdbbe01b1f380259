import MainspringCore
import Synchronization

/// A pool's key: scheme, host and port.
struct PoolKey: Sendable, Hashable {
    let secure: Bool
    let host: String
    let port: UInt16

    init(_ target: HTTPTarget) {
        secure = target.secure
        host = target.host.lowercased()
        port = target.port
    }
}

/// The client's keep-alive connections: per key at most `limit` open (busy and idle), waiters
/// served in order. Any thread; the lock is held only for the bookkeeping.
final class ConnectionPool: Sendable {
    enum Grant: Sendable {
        /// An idle connection (check it before use; `discard` if it is unusable).
        case idle(Connection)
        /// Room for a new connection (`discard` if it cannot be made).
        case newSlot
    }

    private struct Idle {
        let connection: Connection
        let since: LoopClock.Instant
    }

    private typealias Waiter = (id: UInt64, continuation: CheckedContinuation<Result<Grant, HTTPClientError>, Never>)

    private struct Host {
        var open = 0
        var idle: [Idle] = []
        var waiters: [Waiter] = []
    }

    private struct State {
        var hosts: [PoolKey: Host] = [:]
        var isShutDown = false
        var nextWaiterID: UInt64 = 0
    }

    private let state = Protected(State())
    let limit: Int
    let idleTimeout: Duration
    /// The client's loop's clock: idle times are the loop's time (virtual on a simulated loop).
    let clock: LoopClock

    init(limit: Int, idleTimeout: Duration, clock: LoopClock) {
        self.limit = limit
        self.idleTimeout = idleTimeout
        self.clock = clock
    }

    /// An idle connection (the most recent), room for a new one, or a wait for either — which
    /// fails with the request's timeout at `deadline` (a timer of `loop`).
    func acquire(_ key: PoolKey, deadline: RequestDeadline = .none, loop: EventLoop? = nil) async throws(HTTPClientError)
        -> Grant
    {
        enum Immediate { case grant(Grant), wait, closed }
        var stale: [Connection] = []
        let now = clock.now
        let immediate = state.withLock { state -> Immediate in
            if state.isShutDown { return .closed }
            var host = state.hosts[key, default: Host()]
            defer { state.hosts[key] = host }
            while let last = host.idle.popLast() {
                if last.since.duration(to: now) < idleTimeout { return .grant(.idle(last.connection)) }
                stale.append(last.connection)
                host.open -= 1
            }
            if host.open < limit {
                host.open += 1
                return .grant(.newSlot)
            }
            return .wait
        }
        for connection in stale { connection.close() }
        switch immediate {
        case .grant(let grant): return grant
        case .closed: throw .clientClosed
        case .wait: break
        }
        // A wait the calling task's cancellation ends: its waiter is taken out of the queue and
        // fails with `.cancelled` (a grant that came first is kept: the caller sees it, checks
        // for cancellation and gives it back).
        let id = state.withLock { state -> UInt64 in
            state.nextWaiterID += 1
            return state.nextWaiterID
        }
        let expiry = Protected<ScheduledTimer?>(nil)
        defer { expiry.withLock { $0 }?.cancel() }
        let result: Result<Grant, HTTPClientError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let resumeNow = state.withLock { state -> Result<Grant, HTTPClientError>? in
                    if state.isShutDown { return .failure(.clientClosed) }
                    var host = state.hosts[key, default: Host()]
                    defer { state.hosts[key] = host }
                    if let last = host.idle.popLast() { return .success(.idle(last.connection)) }
                    if host.open < limit {
                        host.open += 1
                        return .success(.newSlot)
                    }
                    // Checked under the lock: a cancellation handler that ran before this found
                    // no waiter to take out.
                    if Task.isCancelled { return .failure(.cancelled) }
                    if let remaining = deadline.remaining(at: clock.now), remaining == .zero {
                        return .failure(deadline.failure(in: .waitingForConnection))
                    }
                    host.waiters.append((id, continuation))
                    return nil
                }
                if let resumeNow {
                    continuation.resume(returning: resumeNow)
                } else if let loop, let remaining = deadline.remaining(at: clock.now) {
                    // Armed once the waiter is in the queue, so that it finds it there.
                    let timer = loop.execute(after: remaining) { [self] in
                        takeWaiter(id, of: key)?.continuation.resume(returning: .failure(deadline.failure(in: .waitingForConnection)))
                    }
                    expiry.withLock { $0 = timer }
                }
            }
        } onCancel: {
            takeWaiter(id, of: key)?.continuation.resume(returning: .failure(.cancelled))
        }
        return try result.get()
    }

    /// Takes waiter `id` out of `key`'s queue, if it is still there (not granted, cancelled or
    /// timed out already).
    private func takeWaiter(_ id: UInt64, of key: PoolKey) -> Waiter? {
        state.withLock { state -> Waiter? in
            guard let index = state.hosts[key]?.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.hosts[key]!.waiters.remove(at: index)
        }
    }

    /// A response done on `connection`, which stays open: to the next waiter, or idle.
    func release(_ key: PoolKey, connection: Connection) {
        let waiter = state.withLock { state -> Waiter? in
            guard var host = state.hosts[key] else { return nil }
            defer { state.hosts[key] = host }
            if !host.waiters.isEmpty { return host.waiters.removeFirst() }
            host.idle.append(Idle(connection: connection, since: clock.now))
            return nil
        }
        if let waiter {
            waiter.continuation.resume(returning: .success(.idle(connection)))
        } else if state.withLock({ $0.isShutDown }) {
            connection.close()
        }
    }

    /// A connection closed (or never made): its room goes to the next waiter.
    func discard(_ key: PoolKey) {
        let waiter = state.withLock { state -> Waiter? in
            guard var host = state.hosts[key] else { return nil }
            defer { state.hosts[key] = host }
            if !host.waiters.isEmpty { return host.waiters.removeFirst() }  // the room passes on
            host.open -= 1
            return nil
        }
        waiter?.continuation.resume(returning: .success(.newSlot))
    }

    /// Busy and idle connections of `key`.
    func counts(for key: PoolKey) -> (busy: Int, idle: Int) {
        state.withLock { state in
            let host = state.hosts[key] ?? Host()
            return (host.open - host.idle.count, host.idle.count)
        }
    }

    /// Requests waiting for a connection of `key`.
    func waiterCount(for key: PoolKey) -> Int {
        state.withLock { $0.hosts[key]?.waiters.count ?? 0 }
    }

    /// Ends the pool: returns the idle connections (to close) and fails the waiters.
    func shutdown() -> [Connection] {
        let (idle, waiters) = state.withLock { state in
            state.isShutDown = true
            var idle: [Connection] = []
            var waiters: [Waiter] = []
            for key in state.hosts.keys {
                idle += state.hosts[key]!.idle.map(\.connection)
                waiters += state.hosts[key]!.waiters
                state.hosts[key]!.open -= state.hosts[key]!.idle.count
                state.hosts[key]!.idle = []
                state.hosts[key]!.waiters = []
            }
            return (idle, waiters)
        }
        for waiter in waiters { waiter.continuation.resume(returning: .failure(.clientClosed)) }
        return idle
    }
}
