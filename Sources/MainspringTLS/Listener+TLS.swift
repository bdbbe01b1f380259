@_spi(Simulation) import MainspringCore

/// TLS listeners: connections are handed over once their handshake is done.
///
/// Both forms of `Listener` take a ``TLSServerContext`` as `tls:`: the callback initializer
/// (loop thread) and the async one (any task, for `connections`), on any endpoint — a TCP port,
/// a Unix path, a descriptor that already listens (socket activation). An accepted socket is handshaken on
/// the loop its connection goes to, as `.normal` work (see ``TLSServerContext``'s handshakes:
/// accepting and established connections go first); the connection reaches `accept` — or
/// `connections` — established, with `connection.tls` set. A handshake that fails (a bad
/// certificate, plaintext sent to the port, a client that stops mid-way and times out) closes
/// its socket and is counted in ``TLSServerContext/statistics``; nobody else notices.
///
/// Handshakes in progress do not count against `maxWaitingConnections` (a few slow clients
/// cannot stop a listener); each costs a socket and a session until it ends (at most the
/// configuration's `handshakeTimeout`).
extension Listener {
    /// Listens on `endpoint` (TCP, a Unix path, an adopted or activated descriptor) and hands
    /// each TLS-established connection to `accept` on its loop. Loop thread only (`loop`'s).
    /// - Throws: as `Listener(_:on:group:options:accept:)`: `EventLoopError.invalidAddress`,
    ///   `.system` (address in use, …), `.notListeningSocket`, `.wrongThread`. On a simulated
    ///   loop (`MainspringTesting`) it listens on the simulation's network, and the handshakes
    ///   run over its bytes.
    public convenience init(_ endpoint: Endpoint, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), tls: TLSServerContext,
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(endpoint, on: loop, group: group, options: options, preparer: TLSAcceptPreparer(context: tls),
                      accept: accept)
    }

    /// Listens on `endpoint` and queues the TLS-established connections for `connections`. Any
    /// task.
    public convenience init(_ endpoint: Endpoint, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), tls: TLSServerContext) async throws(EventLoopError)
    {
        try await self.init(endpoint, on: loop, group: group, options: options, preparer: TLSAcceptPreparer(context: tls))
    }

    /// Listens on `host:port` and hands each TLS-established connection to `accept` on its loop.
    /// Loop thread only (`loop`'s).
    /// - Throws: `EventLoopError.invalidAddress`, `.system` (address in use, …), `.wrongThread`.
    @available(*, deprecated, message: "use Listener(.tcp(host:port:backlog:), on:group:options:tls:accept:)")
    public convenience init(host: String = "127.0.0.1", port: UInt16 = 0, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), backlog: Int32 = 511, tls: TLSServerContext,
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(.tcp(host: host, port: port, backlog: backlog), on: loop, group: group, options: options, tls: tls,
                      accept: accept)
    }

    /// Listens on `host:port` and queues the TLS-established connections for `connections`.
    /// Any task.
    @available(*, deprecated, message: "use Listener(.tcp(host:port:backlog:), on:group:options:tls:) async")
    public convenience init(host: String = "127.0.0.1", port: UInt16 = 0, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), backlog: Int32 = 511, tls: TLSServerContext) async
        throws(EventLoopError)
    {
        try await self.init(.tcp(host: host, port: port, backlog: backlog), on: loop, group: group, options: options, tls: tls)
    }

    /// TLS on a descriptor that already listens (a socket passed by a service manager: see
    /// `ActivatedSockets`), handing each established connection to `accept`. The listener takes
    /// the descriptor over, as `init(adopting:on:group:options:accept:)` does. Loop thread only.
    @available(*, deprecated, message: "use Listener(.adopted(descriptor:), on:group:options:tls:accept:)")
    public convenience init(adopting descriptor: Int32, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), tls: TLSServerContext,
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(.adopted(descriptor: descriptor), on: loop, group: group, options: options, tls: tls, accept: accept)
    }

    /// TLS on a descriptor that already listens, for `connections`. Any task.
    @available(*, deprecated, message: "use Listener(.adopted(descriptor:), on:group:options:tls:) async")
    public convenience init(adopting descriptor: Int32, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), tls: TLSServerContext) async throws(EventLoopError)
    {
        try await self.init(.adopted(descriptor: descriptor), on: loop, group: group, options: options, tls: tls)
    }
}

extension Connection {
    /// Connects to `host:port` (an IPv4 or IPv6 literal, or a host name, resolved and tried as
    /// `Connection.connect(to:port:on:options:)` does: off the loop, Happy Eyeballs) from `loop`, runs the TLS
    /// handshake, and returns the established connection (`connection.tls` says what was
    /// agreed). The server's certificate is checked as `tls.configuration.verification` says —
    /// against `serverName` (default: `host`), which is also sent as SNI when it is a name. Any
    /// task; the handshake runs on `loop` as `.normal` work.
    /// - Throws: `TLSError.handshakeFailed(reason:)` with OpenSSL's reason (naming the
    ///   certificate check that failed) or the handshake timeout; `TLSError.connect(_:)` with
    ///   the connect's `EventLoopError` — `.system` with a literal's errno, `.hostNotFound`,
    ///   `.resolveTimedOut`, `.connectFailed` (naming every address tried), `.invalidAddress`,
    ///   `.loopClosed`; `TLSError.cancelled` when the task was cancelled before the handshake
    ///   ended (unlike the plain `connect`, which ends at once, this one sees the cancellation
    ///   once the handshake is over or has failed; the connection is then closed).
    public static func connect(to host: String, port: UInt16, on loop: EventLoop, options: Options = .init(),
                               tls: TLSClientContext, serverName: String? = nil) async throws(TLSError) -> Connection
    {
        let name = serverName ?? host
        let made: Result<Connection, TLSError> = await withUnsafeContinuation { continuation in
            let start: @Sendable () -> Void = {
                connectTLS(to: host, port: port, on: loop, options: options, tls: tls, serverName: name) {
                    continuation.resume(returning: $0)
                }
            }
            if loop.isCurrent { start() } else {
                // A loop that shut down drops the post: the caller gets `.loopClosed`, not a hang.
                loop.execute(start, orElse: { continuation.resume(returning: .failure(.connect(.loopClosed))) })
            }
        }
        if Task.isCancelled {
            // The TCP connect and the handshake run to their end (within their timeouts); a task
            // cancelled meanwhile gets `.cancelled`, and the connection is closed, not handed over.
            if case .success(let connection) = made { connection.abort() }
            throw .cancelled
        }
        return try made.get()
    }

    /// `connect(to:port:on:options:tls:serverName:)` with a callback: `completion` runs on
    /// `loop`'s thread with the established connection or the error. Loop thread only.
    public static func connect(to host: String, port: UInt16, on loop: EventLoop, options: Options = .init(),
                               tls: TLSClientContext, serverName: String? = nil,
                               completion: @escaping (Result<Connection, TLSError>) -> Void)
    {
        connectTLS(to: host, port: port, on: loop, options: options, tls: tls, serverName: serverName ?? host,
                   completion: completion)
    }
}

/// The client side: TCP connect, then the handshake, then the connection. Loop thread.
private func connectTLS(to host: String, port: UInt16, on loop: EventLoop, options: Connection.Options, tls: TLSClientContext,
                        serverName: String, completion: @escaping (Result<Connection, TLSError>) -> Void)
{
    // A simulated program's connect: the connection its handshake makes is the program's too
    // (read now: the connect's answer comes in a dispatch of the network, nobody's).
    let owner = loop.currentSimulatedOwner
    loop.connectStream(to: host, port: port, options: options) { result in
        switch result {
        case .failure(let error):
            completion(.failure(.connect(error)))
        case .success(.descriptor(let fd)):
            handshake(overSocket: fd, host: host, port: port, on: loop, options: options, tls: tls,
                      serverName: serverName, completion: completion)
        case .success(.simulated(let end)):
            handshake(overSimulated: end, owner: owner, host: host, port: port, on: loop, options: options, tls: tls,
                      serverName: serverName, completion: completion)
        }
    }
}

/// The handshake over a connected socket: OpenSSL's bufferevent on the descriptor.
private func handshake(overSocket fd: Int32, host: String, port: UInt16, on loop: EventLoop, options: Connection.Options,
                       tls: TLSClientContext, serverName: String,
                       completion: @escaping (Result<Connection, TLSError>) -> Void)
{
    guard let session = SSLSession(client: tls.handle, fd: fd, serverName: serverName,
                                   verification: tls.configuration.verification)
    else {
        closeSocket(fd)
        completion(.failure(.handshakeFailed(reason: "OpenSSL could not make a session")))
        return
    }
    let peer = hostAndPort(host, port)
    TLSHandshake(loop: loop, session: session, timeout: tls.configuration.handshakeTimeout) { outcome in
        completion(establishedConnection(for: outcome, peer: peer, on: loop, options: options))
    }.start()
}

extension Listener {
    /// TLS on a socket passed by socket activation (see `ActivatedSockets`), handing each
    /// established connection to `accept`. Loop thread only.
    @available(*, deprecated, message: "use Listener(.activated(_:), on:group:options:tls:accept:)")
    public convenience init(activatedSocket socket: ActivatedSockets.Socket, on loop: EventLoop,
                            group: EventLoopGroup? = nil, options: Connection.Options = .init(), tls: TLSServerContext,
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(.activated(socket), on: loop, group: group, options: options, tls: tls, accept: accept)
    }

    /// TLS on a socket passed by socket activation, for `connections`. Any task.
    @available(*, deprecated, message: "use Listener(.activated(_:), on:group:options:tls:) async")
    public convenience init(activatedSocket socket: ActivatedSockets.Socket, on loop: EventLoop,
                            group: EventLoopGroup? = nil, options: Connection.Options = .init(), tls: TLSServerContext)
        async throws(EventLoopError)
    {
        try await self.init(.activated(socket), on: loop, group: group, options: options, tls: tls)
    }
}

/// The handshake over a stream of a simulation's network (`MainspringTesting`): OpenSSL's
/// filter over a simulated socket (see SimulatedTLS.swift). Loop thread.
private func handshake(overSimulated end: any SimulatedStreamEnd, owner: (any SimulatedOwner)?, host: String,
                       port: UInt16, on loop: EventLoop, options: Connection.Options, tls: TLSClientContext,
                       serverName: String, completion: @escaping (Result<Connection, TLSError>) -> Void)
{    let layerSocket: SimulatedLayerSocket
    do throws(EventLoopError) {
        layerSocket = try SimulatedLayerSocket(on: loop, end: end)
    } catch {
        return completion(.failure(.connect(error)))
    }
    guard let session = SSLSession(client: tls.handle, fd: -1, serverName: serverName,
                                   verification: tls.configuration.verification)
    else {
        layerSocket.discard()
        return completion(.failure(.handshakeFailed(reason: "OpenSSL could not make a session")))
    }
    let peer = hostAndPort(host, port)
    let handshake = SimulatedTLSHandshake(loop: loop, session: session, layerSocket: layerSocket,
                                          timeout: tls.configuration.handshakeTimeout) { outcome in
        let made = establishedConnection(for: outcome, peer: peer, on: loop, options: options, simulatedLayer: layerSocket)
        if case .success(let connection) = made { loop.setSimulatedOwner(owner, of: connection) }
        // The caller hears as a dispatch of the loop, not inside the network's delivery.
        loop.executeNextTurn(priority: .input) { completion(made) }
    }
    // The handshake is the connecting program's: it ends with the program.
    SimulatedOwnership.$current.withValue(owner) { handshake.start() }
}
