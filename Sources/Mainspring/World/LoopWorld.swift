/// What a loop reaches the world through — the one seam between the library and the world it
/// runs in. A real loop reaches the kernel (`KernelWorld`: sockets, descriptors, `connect(2)`);
/// a simulated loop reaches its simulation (`SimulatedWorld`, over `MainspringTesting`'s
/// network). The choice is made once, when the loop is made (`EventLoop.world`); the doors of
/// the library — connections, listeners, pairs — ask their loop's world and hold no branch of
/// their own: what they get back (a `StreamEndpoint`, a `ListeningPort`) is the same kind of
/// thing in both worlds, and the code over it is one.
///
/// Loop thread only, as the doors that call it.
protocol LoopWorld: AnyObject {
    /// Starts `source`'s connect to `host:port`: gives it its socket (connecting) now, and
    /// finishes the connect later (`connectFinished`, or the simulated one). On a failure now
    /// the source is closed and the error thrown.
    func startConnect(_ source: ConnectionSource, to host: String, port: UInt16, options: Connection.Options)
        throws(EventLoopError)

    /// A connected stream to the Unix socket at `path` (connected at once, as a Unix connect is).
    func connect(unixPath path: String, from loop: EventLoop) throws(EventLoopError) -> StreamEndpoint

    /// Two ends of one stream, connected now (`Connection.makePair`).
    func makePair(on loop: EventLoop) throws(EventLoopError) -> (StreamEndpoint, StreamEndpoint)

    /// A connected stream socket the caller already has, checked and taken over.
    func adopt(descriptor: Int32) throws(EventLoopError) -> StreamEndpoint

    /// Listens as `socket` says, handing what it accepts to `target`.
    func listen(_ socket: ListeningSocket, on loop: EventLoop, target: SocketListenerTarget) throws(EventLoopError)
        -> any ListeningPort

    /// What writes an `InputSimulator`'s records and reads them on `loop`.
    func makeInputDriver(on loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
                         onEvent: ((InputSimulator.Event) -> Void)?) throws(EventLoopError) -> any InputDriver

    /// Who opened the loop's sources, where programs of a simulation open them (see
    /// SimulatedOwnership.swift); nil in the kernel's world, whose processes are the kernel's.
    var ownership: SimulatedOwnerships? { get }

    /// `source` was registered on the loop (recorded as its opener's, in a simulation).
    func sourceRegistered(_ source: Source)

    /// `source` left the loop.
    func sourceUnregistered(_ source: Source)
}

/// A listening socket as a world made it: the kernel's (`SocketListener`), or a listener of a
/// simulation's network.
protocol ListeningPort: AnyObject {
    /// The bound port (0 for a Unix socket).
    var port: UInt16 { get }
    /// The bound address, for messages ("127.0.0.1:7000", a Unix socket's path).
    var localAddress: String { get }
    /// Accepts (true) or holds new connections in the backlog (false).
    /// - Throws: `.libevent` when the loop refuses the socket (accepting only).
    func setAccepting(_ accepting: Bool) throws(EventLoopError)
    /// Stops listening: connects to it are refused from now on (a Unix socket's file removed).
    func close()
}

extension EventLoop {
    /// The world a loop reaches: the kernel, or its simulation. Chosen once, at `init`.
    static func makeWorld(for simulation: (any LoopSimulating)?) -> any LoopWorld {
        if let simulation { return SimulatedWorld(simulation) }
        return KernelWorld()
    }
}

/// The kernel's world: real sockets and descriptors.
final class KernelWorld: LoopWorld {
    var ownership: SimulatedOwnerships? { nil }
    func sourceRegistered(_ source: Source) {}
    func sourceUnregistered(_ source: Source) {}

    func makeInputDriver(on loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
                         onEvent: ((InputSimulator.Event) -> Void)?) throws(EventLoopError) -> any InputDriver
    {
        try PipeInputDriver(loop: loop, pattern: pattern, count: count, cost: cost, onEvent: onEvent)
    }

    func startConnect(_ source: ConnectionSource, to host: String, port: UInt16, options: Connection.Options)
        throws(EventLoopError)
    {
        let loop = source.loop
        if let literal = numericAddress(host, port: port) {
            // One address: libevent connects the socket itself, which exists from now on.
            do {
                source.socket = try BufferedSocket(connectingTo: literal, base: loop.base, target: source)
            } catch {
                source.close()
                throw error
            }
            source.configureSocket()
            return
        }
        guard isPlausibleHostName(host) else {
            source.close()
            throw .invalidAddress(host)
        }
        do {
            source.socket = try BufferedSocket(unconnectedOn: loop.base, target: source)
        } catch {
            source.close()
            throw error
        }
        source.configureSocket()
        loop.connectSocket(to: host, port: port, options: options) { [weak source] result in
            guard let source else {
                if case .success(let fd) = result { closeDescriptor(fd) }
                return
            }
            source.connectFinished(result)
        }
    }

    func connect(unixPath path: String, from loop: EventLoop) throws(EventLoopError) -> StreamEndpoint {
        .descriptor(try startUnixConnect(to: path))
    }

    func makePair(on loop: EventLoop) throws(EventLoopError) -> (StreamEndpoint, StreamEndpoint) {
        let (first, second) = try makeStreamSocketPair()
        return (.descriptor(first), .descriptor(second))
    }

    func adopt(descriptor: Int32) throws(EventLoopError) -> StreamEndpoint {
        guard isOpenDescriptor(descriptor) else { throw .badDescriptor(descriptor) }
        if let problem = connectedStreamSocketProblem(descriptor) {
            throw .notConnectedSocket(descriptor: descriptor, reason: problem)
        }
        if let code = setNonBlocking(descriptor) {
            throw .system(function: "fcntl(\(descriptor), F_SETFL, O_NONBLOCK)", errno: code)
        }
        if let code = setCloseOnExec(descriptor) {
            throw .system(function: "fcntl(\(descriptor), F_SETFD, FD_CLOEXEC)", errno: code)
        }
        return .descriptor(descriptor)
    }

    func listen(_ socket: ListeningSocket, on loop: EventLoop, target: SocketListenerTarget) throws(EventLoopError)
        -> any ListeningPort
    {
        switch socket {
        case .binding(let host, let port, let backlog):
            return try SocketListener(base: loop.base, host: host, port: port, backlog: backlog, target: target)
        case .adopting(let fd):
            return try SocketListener(base: loop.base, adopting: fd, target: target)
        case .unix(let path, let mode, let backlog):
            return try SocketListener(base: loop.base, unixPath: path, mode: mode, backlog: backlog, target: target)
        }
    }
}
