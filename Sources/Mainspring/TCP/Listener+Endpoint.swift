extension Listener {
    /// Where a listener listens: one value per way of listening, for the one initializer of
    /// each form (``init(_:on:group:options:accept:)`` with a handler,
    /// ``init(_:on:group:options:)`` for `connections`; `MainspringTLS` adds a `tls:` to each).
    ///
    /// ```swift
    /// try Listener(.tcp(port: 7000), on: loop) { connection in … }
    /// try Listener(.unix(path: "/run/app.sock", mode: 0o660), on: loop) { connection in … }
    /// for socket in try ActivatedSockets.fromEnvironment().sockets {
    ///     try Listener(.activated(socket), on: loop) { connection in … }
    /// }
    /// ```
    public enum Endpoint: Sendable, CustomStringConvertible {
        /// A TCP port on `host` — an IPv4 or IPv6 literal (`"127.0.0.1"`, `"::1"`,
        /// `"0.0.0.0"`, `"::"`, which also accepts IPv4) or `"localhost"`; a host name is
        /// refused (`.bindNeedsAddress`: resolve it first with `EventLoop.resolve(_:port:timeout:)`).
        /// Port 0 lets the kernel choose: read ``Listener/port``. `backlog` is `listen(2)`'s.
        case tcp(host: String = "127.0.0.1", port: UInt16 = 0, backlog: Int32 = 511)
        /// A Unix stream socket at `path` — a file path, or `"@name"` in Linux's abstract
        /// namespace (no file). The file is made with `mode` (`0o660`, say) from the start, or
        /// with the umask's mode when nil; a stale socket file (nobody listens) is replaced, a
        /// live one or a file of another kind is reported (`.unixSocketPathInUse`); the file is
        /// removed when the listener closes.
        case unix(path: String, mode: UInt16? = nil, backlog: Int32 = 511)
        /// A stream socket that already listens (inherited from a parent, made by the caller):
        /// IPv4, IPv6 or Unix. The listener takes it over — non-blocking, close-on-exec, closed
        /// when the listener closes; when the initializer throws, it is still the caller's.
        /// Refused with `.notListeningSocket` (saying why) when it is not a listening stream socket.
        case adopted(descriptor: Int32)
        /// A socket a service manager passed (``ActivatedSockets``): ``adopted(descriptor:)`` of
        /// its descriptor. Adopt each socket once.
        case activated(ActivatedSockets.Socket)

        public var description: String {
            switch self {
            case .tcp(let host, let port, _): hostAndPort(host, port)
            case .unix(let path, _, _): path
            case .adopted(let descriptor): "descriptor \(descriptor)"
            case .activated(let socket): "activated socket \(socket.descriptor)"
            }
        }

        /// The initializer's name in a `.wrongThread` error.
        var initializerName: StaticString {
            switch self {
            case .tcp: "Listener.init(.tcp, on:…)"
            case .unix: "Listener.init(.unix, on:…)"
            case .adopted: "Listener.init(.adopted, on:…)"
            case .activated: "Listener.init(.activated, on:…)"
            }
        }

        /// The socket the listener's source makes or takes.
        var socket: ListeningSocket {
            switch self {
            case .tcp(let host, let port, let backlog): .binding(host: host, port: port, backlog: backlog)
            case .unix(let path, let mode, let backlog): .unix(path: path, mode: mode, backlog: backlog)
            case .adopted(let descriptor): .adopting(descriptor)
            case .activated(let socket): .adopting(socket.descriptor)
            }
        }
    }

    /// Listens on `endpoint` and hands each accepted connection to `accept` on its loop — on
    /// `group.next()`, or on `loop` when `group` is nil. Must be called on `loop`'s thread.
    ///
    /// When `accept(2)` runs out of file descriptors (`EMFILE`, `ENFILE`), the listener pauses
    /// for 100 ms instead of spinning, then resumes. On a simulated loop (`MainspringTesting`)
    /// TCP and Unix endpoints are the simulation's network's; a descriptor is refused.
    /// - Throws: `EventLoopError.invalidAddress`, `.bindNeedsAddress`, `.system` (the address in
    ///   use, no such directory…), `.unixSocketPathInUse`, `.notListeningSocket`, `.libevent`,
    ///   `.simulatedLoop`, `.wrongThread`.
    public convenience init(_ endpoint: Endpoint, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(),
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(socket: endpoint.socket, on: loop, group: group, options: options, preparer: nil,
                      function: endpoint.initializerName, accept: accept)
    }

    /// Listens on `endpoint` like the callback initializer, and queues the accepted connections
    /// for `connections`. Any task: it hops to `loop` to listen (no hop from a task that prefers
    /// `loop`). Accepting pauses while `maxWaitingConnections` accepted connections wait to be
    /// taken, so a consumer that lags leaves further clients in the kernel's backlog.
    /// - Throws: as the callback initializer, and `.loopClosed`.
    public convenience init(_ endpoint: Endpoint, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init()) async throws(EventLoopError)
    {
        try await self.init(socket: endpoint.socket, on: loop, group: group, options: options)
    }

    /// The callback form with a step between accepting and handing over (`MainspringTLS`'s
    /// handshake).
    package convenience init(_ endpoint: Endpoint, on loop: EventLoop, group: EventLoopGroup?, options: Connection.Options,
                             preparer: any AcceptedSocketPreparer,
                             accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(socket: endpoint.socket, on: loop, group: group, options: options, preparer: preparer,
                      function: "Listener.init(_:on:…tls:…)", accept: accept)
    }

    /// The async form with a preparer.
    package convenience init(_ endpoint: Endpoint, on loop: EventLoop, group: EventLoopGroup?, options: Connection.Options,
                             preparer: any AcceptedSocketPreparer) async throws(EventLoopError)
    {
        try await self.init(socket: endpoint.socket, on: loop, group: group, options: options, preparer: preparer)
    }
}
