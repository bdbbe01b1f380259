/// The peer process of a Unix socket connection, as the kernel recorded it when the connection
/// was made (`SO_PEERCRED`). A value: any thread.
public struct PeerCredentials: Sendable, Equatable, CustomStringConvertible {
    /// The peer's process id (as seen from this process's PID namespace).
    public let pid: Int32
    /// The peer's effective user id.
    public let uid: UInt32
    /// The peer's effective group id.
    public let gid: UInt32

    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }

    public var description: String { "pid \(pid), uid \(uid), gid \(gid)" }
}

extension Listener {
    /// Listens on a Unix stream socket at `path` — a file path, or `"@name"` in Linux's
    /// abstract namespace (no file) — handing each accepted connection to `accept` as
    /// ``init(host:port:on:group:options:backlog:accept:)`` does. Must be called on `loop`'s
    /// thread.
    ///
    /// The socket file is created with `mode` (`0o660`, say) from the start — bound under a
    /// temporary name beside it, then linked into place — or with the umask's mode when nil.
    /// An existing file at `path` is replaced only if it is a socket nobody listens on (a stale
    /// one, left by a process that died); a live socket, or a file of another kind, is left
    /// alone and reported. The file is removed when the listener closes (if it is still the one
    /// this listener made). Costs a few system calls, once. On a simulated loop
    /// (`MainspringTesting`) the path is one of the simulated host's, in memory: no file, and
    /// `mode` is not used.
    /// - Throws: `EventLoopError.unixSocketPathInUse`, `.invalidAddress` (an empty path, or one
    ///   longer than 107 bytes), `.system` (the directory does not exist: `ENOENT`; …),
    ///   `.wrongThread`.
    @available(*, deprecated, message: "use Listener(.unix(path:mode:backlog:), on:group:options:accept:)")
    public convenience init(unixPath path: String, mode: UInt16? = nil, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), backlog: Int32 = 511,
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(socket: .unix(path: path, mode: mode, backlog: backlog), on: loop, group: group, options: options,
                      preparer: nil, function: "Listener.init(unixPath:…)", accept: accept)
    }

    /// Listens on a Unix stream socket at `path` like the callback initialiser, and queues the
    /// accepted connections for `connections`. Any task.
    /// - Throws: as the callback initialiser, and `.loopClosed`.
    @available(*, deprecated, message: "use Listener(.unix(path:mode:backlog:), on:group:options:) async")
    public convenience init(unixPath path: String, mode: UInt16? = nil, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), backlog: Int32 = 511) async throws(EventLoopError)
    {
        try await self.init(socket: .unix(path: path, mode: mode, backlog: backlog), on: loop, group: group,
                            options: options)
    }
}

extension Connection {
    /// Connects to the Unix stream socket at `path` (a file path, or `"@name"` in the abstract
    /// namespace) from `loop`. A Unix connect finishes at once, so the connection is
    /// established when this returns; every `Connection` API works on it as on TCP. Loop thread
    /// only.
    /// - Throws: `EventLoopError.system` with the connect's errno (`ENOENT`: no such file;
    ///   `ECONNREFUSED`: nobody listens; `EAGAIN`: the server's backlog is full),
    ///   `.invalidAddress`, `.wrongThread`.
    public static func connect(unixPath path: String, on loop: EventLoop, options: Options = .init())
        throws(EventLoopError) -> Connection
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Connection.connect(unixPath:on:options:)") }
        options.check("Connection.connect(unixPath:)")
        let endpoint = try loop.world.connect(unixPath: path, from: loop)
        // A source that cannot be made releases the endpoint itself.
        return Connection(source: try ConnectionSource(loop: loop, endpoint: endpoint, peer: path, options: options))
    }

    /// Connects to the Unix stream socket at `path` from `loop`. Any task.
    /// - Throws: as the callback form, and `.loopClosed`.
    public static func connect(unixPath path: String, on loop: EventLoop, options: Options = .init()) async
        throws(EventLoopError) -> Connection
    {
        let made: Result<Connection, EventLoopError> = await withUnsafeContinuation { continuation in
            loop.executeNowOrPost({
                do throws(EventLoopError) {
                    continuation.resume(returning: .success(try connect(unixPath: path, on: loop, options: options)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }, orElse: { continuation.resume(returning: .failure(.loopClosed)) })
        }
        return try made.get()
    }

    /// The peer's process, user and group on a Unix socket connection (`SO_PEERCRED`); nil on
    /// TCP or once closed. Loop thread only; one system call each time.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var peerCredentials: PeerCredentials? {
        loop.preconditionOnLoop("Connection.peerCredentials")
        guard let fd = source.socket?.fd, fd >= 0, let found = socketPeerCredentials(of: fd) else { return nil }
        return PeerCredentials(pid: found.pid, uid: found.uid, gid: found.gid)
    }
}
