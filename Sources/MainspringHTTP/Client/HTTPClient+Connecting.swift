import Foundation
import MainspringCore
import Synchronization

/// A new connection: the resolver, the connector, the connect timeout (cut short by the
/// request's deadline) and the caller's cancellation race; the first decides.
extension HTTPClient {
    /// A connection to `target`, made by the configured connector after the resolver.
    func connect(_ target: HTTPTarget, deadline: RequestDeadline) async throws(HTTPClientError) -> Connection {
        let connector: Connector
        if target.secure {
            guard let secure = configuration.secureConnector else { throw .unsupportedScheme("https") }
            connector = secure
        } else {
            connector = configuration.connector
        }
        let race = ConnectRace(loop: loop)
        let loop = self.loop
        let options = configuration.connectionOptions
        let resolver = configuration.resolver
        // The connect's own limit, or what is left of the request's, whichever ends first.
        var limit = configuration.connectTimeout
        var timeout: @Sendable () -> HTTPClientError = { [configuration] in
            .connectTimeout(host: target.host, port: target.port, configuration.connectTimeout)
        }
        if let remaining = deadline.remaining(at: loop.clock.now), remaining <= limit {
            limit = remaining
            timeout = { deadline.failure(in: race.isResolving ? .resolving : .connecting) }
        }
        // The connect, its timeout (a timer of the loop: its clock, virtual time on a simulated
        // loop) and the task's cancellation race; the first decides. A connect that wins cancels
        // the timer; a timeout or cancellation that wins cancels the connect (a plain connect
        // aborts its half-made socket at once; a TLS one notices when its handshake ends); a
        // connect that still comes too late is closed.
        let result: Result<Connection, HTTPClientError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                race.arm(continuation)
                race.startTimer(after: limit, failure: timeout)
                // On the client's loop: the resolver's work and the connect are the loop's (and on
                // a simulated loop stay inside the simulation, where virtual time sees them).
                race.attach(Task(executorPreference: loop) {
                    do {
                        let address: String
                        do throws(HTTPClientError) {
                            address = try await resolver.resolve(target.host)
                        } catch {
                            _ = race.finish(.failure(error))
                            return
                        }
                        race.resolved()
                        if Task.isCancelled { return }
                        let connection = try await connector.connect(address, target.port, target.host, loop, options)
                        if !race.finish(.success(connection)) { connection.close() }  // too late
                    } catch {
                        _ = race.finish(.failure(Self.connectorError(error, target: target)))
                    }
                })
            }
        } onCancel: {
            _ = race.finish(.failure(.cancelled))
        }
        return try result.get()
    }

    /// What a connector threw (sorted by `Connector.Failure`), as the client reports it: a
    /// cancellation as `.cancelled`, no connection as ``connectError(_:target:)`` says, a
    /// connection not secured as `.tlsFailed`.
    private static func connectorError(_ error: any Error, target: HTTPTarget) -> HTTPClientError {
        switch Connector.Failure(error) {
        case .cancelled: return .cancelled
        case .notConnected(let error): return connectError(error, target: target)
        case .notSecured(let error): return .tlsFailed(host: target.host, port: target.port, error)
        }
    }

    /// A failed connect as the client reports it: a name that did not resolve (or not in time)
    /// is `unresolvedHost`, anything else `connectFailed`.
    private static func connectError(_ error: EventLoopError, target: HTTPTarget) -> HTTPClientError {
        switch error {
        case .hostNotFound, .resolveTimedOut: return .unresolvedHost(target.host)
        default: return .connectFailed(host: target.host, port: target.port, error)
        }
    }
}

/// The first of a connect, its timeout and the caller's cancellation.
private final class ConnectRace: @unchecked Sendable {
    typealias Waiter = CheckedContinuation<Result<Connection, HTTPClientError>, Never>
    /// The waiter, or the result that came before it did; `done` once a result is in; the
    /// connect's task until then.
    private let state = Protected<(continuation: Waiter?, early: Result<Connection, HTTPClientError>?, done: Bool,
                                    connect: Task<Void, Never>?)>((nil, nil, false, nil))
    private let loop: EventLoop
    /// The timeout's timer. Loop thread only.
    private var timer: TimerHandle?
    /// Whether the resolver has not answered yet (what a request deadline's error names).
    private let resolving = Atomic<Bool>(true)

    init(loop: EventLoop) { self.loop = loop }

    var isResolving: Bool { resolving.load(ordering: .acquiring) }

    /// The resolver answered: the connect itself is in progress.
    func resolved() { resolving.store(false, ordering: .releasing) }

    func arm(_ continuation: Waiter) {
        let early = state.withLock { state -> Result<Connection, HTTPClientError>? in
            if let early = state.early {
                state.early = nil
                return early
            }
            state.continuation = continuation
            return nil
        }
        if let early { continuation.resume(returning: early) }
    }

    /// The connect's task: cancelled if the timeout or the caller's cancellation finishes the
    /// race first (at once, if one did already).
    func attach(_ connect: Task<Void, Never>) {
        let lost = state.withLock { state -> Bool in
            guard !state.done else { return true }
            state.connect = connect
            return false
        }
        if lost { connect.cancel() }
    }

    /// Arms the timeout on the loop: `failure` unless something else finished first.
    func startTimer(after limit: Duration, failure: @escaping @Sendable () -> HTTPClientError) {
        loop.execute { [self] in
            guard !state.withLock({ $0.done }) else { return }
            timer = loop.schedule(after: limit) { [self] in
                timer = nil
                _ = finish(.failure(failure()))
            }
        }
    }

    /// Resumes the waiter with `result` if nothing did yet; false if it came too late.
    func finish(_ result: Result<Connection, HTTPClientError>) -> Bool {
        let (first, continuation, connect) = state.withLock { state -> (Bool, Waiter?, Task<Void, Never>?) in
            guard !state.done else { return (false, nil, nil) }
            state.done = true
            let connect = state.connect
            state.connect = nil
            guard let continuation = state.continuation else {
                state.early = result
                return (true, nil, connect)
            }
            state.continuation = nil
            return (true, continuation, connect)
        }
        guard first else { return false }
        continuation?.resume(returning: result)
        // The connect lost (a timeout, the caller's cancellation): it ends now, its socket with it.
        if case .failure = result { connect?.cancel() }
        loop.execute { [self] in
            timer?.cancel()
            timer = nil
        }
        return true
    }
}
