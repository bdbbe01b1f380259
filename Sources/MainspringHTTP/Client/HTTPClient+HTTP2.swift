import MainspringCore
import Synchronization

/// A client's HTTP/2 connections, one a host and port (and scheme), and the hosts whose first
/// one is being made (the requests that come meanwhile wait for it rather than make their own).
/// Any thread.
final class HTTP2Connections: Sendable {
    private struct State {
        var connections: [PoolKey: HTTP2ClientConnection] = [:]
        var connecting: [PoolKey: [CheckedContinuation<Void, Never>]] = [:]
        var isShutDown = false
    }

    private let state = Protected(State())
    /// How many connections the table holds (a lock-free look for the common case: none).
    private let held = Atomic<Int>(0)

    /// Whether the client has no HTTP/2 connection (a moment's answer): then a request needs
    /// no lookup at all.
    var isEmpty: Bool { held.load(ordering: .relaxed) == 0 }

    /// What a request finds for `key`.
    enum Lookup {
        case ready(HTTP2ClientConnection)
        /// None: the caller makes it (and calls `made` or `failed`).
        case make
        case shutDown
    }

    /// The usable connection of `key`; or, when there is none, the caller's turn to make it —
    /// after waiting for one being made by another request.
    func lookup(_ key: PoolKey) async -> Lookup {
        while true {
            enum Step { case found(Lookup), wait }
            let step = state.withLock { state -> Step in
                if state.isShutDown { return .found(.shutDown) }
                if let connection = state.connections[key], connection.isUsable { return .found(.ready(connection)) }
                if state.connecting[key] == nil {
                    state.connecting[key] = []
                    return .found(.make)
                }
                return .wait
            }
            if case .found(let lookup) = step { return lookup }
            await withCheckedContinuation { continuation in
                let waits = state.withLock { state -> Bool in
                    guard state.connecting[key] != nil else { return false }
                    state.connecting[key]!.append(continuation)
                    return true
                }
                if !waits { continuation.resume() }
            }
        }
    }

    /// The usable connection of `key`, if there is one (no waiting).
    func existing(_ key: PoolKey) -> HTTP2ClientConnection? {
        state.withLock { state in state.connections[key].flatMap { $0.isUsable ? $0 : nil } }
    }

    /// `connection` serves `key` from now on (the one it replaces, if still usable, is kept and
    /// `connection` returned to be closed). Wakes those that waited.
    func made(_ connection: HTTP2ClientConnection) -> HTTP2ClientConnection? {
        let (waiters, surplus) = state.withLock { state -> ([CheckedContinuation<Void, Never>], HTTP2ClientConnection?) in
            let waiters = state.connecting.removeValue(forKey: connection.key) ?? []
            if state.isShutDown { return (waiters, connection) }
            if let current = state.connections[connection.key], current.isUsable { return (waiters, connection) }
            if state.connections.updateValue(connection, forKey: connection.key) == nil { held.add(1, ordering: .relaxed) }
            return (waiters, nil)
        }
        for waiter in waiters { waiter.resume() }
        return surplus
    }

    /// Making `key`'s connection failed: the next waiter tries.
    func failed(_ key: PoolKey) {
        let waiters = state.withLock { $0.connecting.removeValue(forKey: key) ?? [] }
        for waiter in waiters { waiter.resume() }
    }

    /// `connection` takes no more requests: forgotten.
    func retired(_ connection: HTTP2ClientConnection) {
        state.withLock { state in
            if state.connections[connection.key] === connection {
                state.connections[connection.key] = nil
                held.subtract(1, ordering: .relaxed)
            }
        }
    }

    /// No more connections: returns those there were (to close), and wakes every waiter.
    func shutdown() -> [HTTP2ClientConnection] { end(forgettingConnections: true) }

    /// No more requests, but those in flight may finish: returns the connections.
    func shutdownGracefully() -> [HTTP2ClientConnection] { end(forgettingConnections: false) }

    /// Takes no more requests: the connections (forgotten, or kept until they are closed) and
    /// the requests waiting for one being made, woken (they find the table shut).
    private func end(forgettingConnections: Bool) -> [HTTP2ClientConnection] {
        let (connections, waiters) = state.withLock { state in
            state.isShutDown = true
            defer {
                state.connecting = [:]
                if forgettingConnections {
                    state.connections = [:]
                    held.store(0, ordering: .relaxed)
                }
            }
            return (Array(state.connections.values), state.connecting.values.flatMap { $0 })
        }
        for waiter in waiters { waiter.resume() }
        return connections
    }
}

extension HTTPClient {
    /// Whether a request may go over HTTP/2 at all: the client holds an HTTP/2 connection, or
    /// has prior knowledge. A lock-free look; false in the common HTTP/1.1 case.
    var mayUseHTTP2: Bool { !http2.isEmpty || configuration.http2PriorKnowledge }

    /// The HTTP/2 connection a request to `target` goes on: the host's, when it has one; with
    /// prior knowledge, one made now (by this request, or by another that came first); nil
    /// for HTTP/1.1 (where ALPN decides, `exchange` adopts the connection if it agreed on h2).
    /// Asked only when ``mayUseHTTP2`` (the common case, no HTTP/2 anywhere, makes no async call).
    func http2Connection(for target: HTTPTarget, deadline: RequestDeadline) async throws(HTTPClientError)
        -> HTTP2ClientConnection?
    {
        let key = PoolKey(target)
        if let existing = http2.existing(key) { return existing }
        guard configuration.http2PriorKnowledge else { return nil }
        switch await http2.lookup(key) {
        case .shutDown:
            throw .clientClosed
        case .ready(let connection):
            return connection
        case .make:
            let connection: Connection
            do throws(HTTPClientError) {
                connection = try await connect(target, deadline: deadline)
            } catch {
                http2.failed(key)
                throw error
            }
            return try await startHTTP2(on: connection, key: key)
        }
    }

    /// A connection whose TLS agreed on `h2` becomes the host's HTTP/2 connection (or, if the
    /// host has one already, is closed).
    func adoptHTTP2(_ connection: Connection, key: PoolKey) async throws(HTTPClientError) {
        if http2.existing(key) != nil {
            connection.close()
            return
        }
        _ = try await startHTTP2(on: connection, key: key)
    }

    private func startHTTP2(on connection: Connection, key: PoolKey) async throws(HTTPClientError) -> HTTP2ClientConnection {
        let registry = http2
        let made: HTTP2ClientConnection
        do throws(HTTPClientError) {
            made = try await HTTP2ClientConnection.start(on: connection, key: key, idleTimeout: configuration.idleTimeout) {
                registry.retired($0)
            }
        } catch {
            registry.failed(key)
            connection.close()
            throw error
        }
        if let surplus = registry.made(made) {
            surplus.close()
            if isShutDown { throw .clientClosed }
            return registry.existing(key) ?? made
        }
        return made
    }
}
