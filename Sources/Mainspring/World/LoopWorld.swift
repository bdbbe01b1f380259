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

    /// A UDP socket bound to `address` (its host; `port` as asked: 0 picks one) on `loop`, and
    /// the address it is bound to.
    func bindDatagram(_ address: SocketAddress, port: UInt16, on loop: EventLoop, options: DatagramSocket.Options)
        throws(EventLoopError) -> (DatagramSource, SocketAddress)

    /// A child process started as `configuration` says (a real program, or a simulation's).
    func spawn(_ configuration: Subprocess.Configuration, on loop: EventLoop, forcePolling: Bool)
        throws(SubprocessError) -> Subprocess

    /// Looks `host` (a plausible name, not a literal) up: `done` on `loop`'s thread with its
    /// addresses (each with `port`), or `.hostNotFound`, `.resolveTimedOut`.
    func resolve(_ host: String, port: UInt16, timeout: Duration, on loop: EventLoop,
                 _ done: @escaping (Result<[SocketAddress], EventLoopError>) -> Void)

    /// Connects a stream to `host:port` for a layer that makes its own socket over it
    /// (MainspringTLS): `done` on `loop`'s thread once, with the endpoint (now the caller's) or
    /// the error a connect reports.
    func connectStream(to host: String, port: UInt16, options: Connection.Options, on loop: EventLoop,
                       _ done: @escaping (Result<StreamEndpoint, EventLoopError>) -> Void)

    /// Whether the loop's timers arm libevent's own timer (a kernel's loop polls with it; a
    /// simulation reads the timers' deadlines instead).
    var armsNativeTimers: Bool { get }

    /// Whether one listening socket can be shared by several loops (each accepting from its
    /// own duplicate of it), as a kernel's can.
    var sharesListeningSockets: Bool { get }

    /// What writes an `InputSimulator`'s records and reads them on `loop`.
    func makeInputDriver(on loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
                         onEvent: ((InputSimulator.Event) -> Void)?) throws(EventLoopError) -> any InputDriver

    /// `loop` was made, with this world (its base and clock are there).
    func loopMade(_ loop: EventLoop)

    /// `loop` was shut down for good, on its thread (`shutdownNow`).
    func loopShutDown(_ loop: EventLoop)

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
    func loopMade(_ loop: EventLoop) {}
    /// (A real loop's `run()` marks it not running as it returns.)
    func loopShutDown(_ loop: EventLoop) {}
    func sourceRegistered(_ source: Source) {}
    func sourceUnregistered(_ source: Source) {}

    func makeInputDriver(on loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
                         onEvent: ((InputSimulator.Event) -> Void)?) throws(EventLoopError) -> any InputDriver
    {
        try PipeInputDriver(loop: loop, pattern: pattern, count: count, cost: cost, onEvent: onEvent)
    }

    var armsNativeTimers: Bool { true }
    var sharesListeningSockets: Bool { true }

    func bindDatagram(_ address: SocketAddress, port: UInt16, on loop: EventLoop, options: DatagramSocket.Options)
        throws(EventLoopError) -> (DatagramSource, SocketAddress)
    {
        let fd = try bindDatagramSocket(address, reusesAddress: options.reusesAddress,
                                        allowsBroadcast: options.allowsBroadcast,
                                        receiveBufferSize: options.receiveBufferSize,
                                        sendBufferSize: options.sendBufferSize).get()
        let bound = boundAddress(of: fd) ?? address
        return (try DatagramSource(loop: loop, transport: KernelDatagramTransport(fd: fd), family: address.family,
                                   options: options), bound)
    }

    func spawn(_ configuration: Subprocess.Configuration, on loop: EventLoop, forcePolling: Bool)
        throws(SubprocessError) -> Subprocess
    {
        try Subprocess.startChild(configuration, on: loop, forcePolling: forcePolling)
    }

    func resolve(_ host: String, port: UInt16, timeout: Duration, on loop: EventLoop,
                 _ done: @escaping (Result<[SocketAddress], EventLoopError>) -> Void)
    {
        loop.resolveWithSystem(host, port: port, timeout: timeout, done)
    }

    func connectStream(to host: String, port: UInt16, options: Connection.Options, on loop: EventLoop,
                       _ done: @escaping (Result<StreamEndpoint, EventLoopError>) -> Void)
    {
        loop.connectSocket(to: host, port: port, options: options) { result in done(result.map { .descriptor($0) }) }
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

extension EventLoop {
    /// Connects a stream to `host:port` through the loop's world, for a layer that makes its
    /// own socket over what it gets (MainspringTLS's handshake): `done` runs once on this loop's
    /// thread with the endpoint — a descriptor, or a simulated stream's end; now the caller's to
    /// release — or the error a connect reports (a literal's errno, a name's `.connectFailed`,
    /// `.hostNotFound`). Loop thread only.
    package func connectStream(to host: String, port: UInt16, options: Connection.Options,
                               _ done: @escaping (Result<StreamEndpoint, EventLoopError>) -> Void)
    {
        world.connectStream(to: host, port: port, options: options, on: self, done)
    }

    /// Whether loops like this one can share one listening socket (each accepting from its own
    /// duplicate), as a kernel's can; a simulation's cannot (one listener spreads the
    /// connections instead).
    /// `package`: `HTTPServer` chooses how it accepts.
    package var sharesListeningSockets: Bool { world.sharesListeningSockets }
}
