/// What a simulation's network provides to the library's stream sockets on its loops
/// (`MainspringTesting`'s `SimulatedNetwork`): listening, connecting, pairs and names, with the
/// bytes moved in memory on virtual time. The library's own `Listener` and `Connection` run over
/// it unchanged: each end of a simulated stream is a bufferevent without a descriptor
/// (`SimulatedSocket`), fed and drained by the network.
///
/// Everything here is called on the thread that drives the simulation (the loops' thread).
@_spi(Simulation)
public protocol SimulatedNetworking: AnyObject, Sendable {
    /// Listens on `host:port` of `loop`'s host (`port` 0: the network picks one). `accepted`
    /// runs on `loop`'s thread with each new stream's server end and the peer's address.
    /// - Throws: `EventLoopError.system` with `EADDRINUSE` when the port is taken,
    ///   `.invalidAddress` when `host` is not an address of `loop`'s host.
    func listen(on loop: EventLoop, host: String, port: UInt16, backlog: Int32,
                accepted: @escaping (any SimulatedStreamEnd, String) -> Void) throws(EventLoopError)
        -> any SimulatedListening

    /// Connects from `loop`'s host to `address`; `done` runs once on `loop`'s thread with the
    /// client end once the peer accepted (refused: `.system` with `ECONNREFUSED`; nobody at
    /// that address, or a partition: `ETIMEDOUT` after the network's connect timeout).
    func connect(from loop: EventLoop, to address: SocketAddress,
                 _ done: @escaping (Result<any SimulatedStreamEnd, EventLoopError>) -> Void)

    /// Listens on the Unix stream socket `path` of `loop`'s host (each host has its own
    /// namespace of paths; no file is made). `accepted` as for `listen(on:host:port:…)`.
    /// - Throws: `EventLoopError.unixSocketPathInUse` when a listener has the path,
    ///   `.invalidAddress` for an empty path or one over 107 bytes.
    func listen(unixPath path: String, on loop: EventLoop, backlog: Int32,
                accepted: @escaping (any SimulatedStreamEnd, String) -> Void) throws(EventLoopError)
        -> any SimulatedListening

    /// Connects at once to the Unix stream socket `path` on `loop`'s host, as a Unix connect
    /// does: the client end, its server end already in the listener's backlog.
    /// - Throws: `.system` with `ENOENT` (nobody listens at the path) or `EAGAIN` (the
    ///   listener's backlog is full), `.invalidAddress`.
    func connect(unixPath path: String, from loop: EventLoop) throws(EventLoopError) -> any SimulatedStreamEnd

    /// Two ends of one stream on `loop`'s host, connected now (`Connection.makePair(on:)`).
    func makePair(on loop: EventLoop) -> (any SimulatedStreamEnd, any SimulatedStreamEnd)

    /// A pipe on `loop`'s host, a simulated program's standard stream: one stream whose
    /// `writer` end only writes and `reader` end only reads, without the link's latency or
    /// faults; a writer whose reader closed with input unread fails with `EPIPE`.
    func makePipe(on loop: EventLoop) -> (writer: any SimulatedStreamEnd, reader: any SimulatedStreamEnd)

    /// The addresses registered for `name` (nil: none), each with `port`.
    func resolve(_ name: String, port: UInt16) -> [SocketAddress]?
}

/// A simulated listening socket (see `SimulatedNetworking.listen`).
@_spi(Simulation)
public protocol SimulatedListening: AnyObject {
    /// The port it listens on.
    var port: UInt16 { get }
    /// "address:port", for messages.
    var localAddress: String { get }
    /// Accepts (true) or holds new connections in the backlog (false).
    func setAccepting(_ accepting: Bool)
    /// Stops listening: connects to its port are refused from now on.
    func close()
}

/// The network's side of one end of a simulated stream: the socket a connection made over it
/// (`attach`) tells it what happens to its buffers.
@_spi(Simulation)
public protocol SimulatedStreamEnd: AnyObject {
    /// The connection's socket takes this end: the network feeds `socket`'s input and drains
    /// its output from now on.
    func attach(_ socket: SimulatedSocket)
    /// The socket's buffers or reading changed (output written, input taken, reading enabled
    /// or disabled): the network may move bytes. Called inside the change: must only record.
    func socketChanged()
    /// The socket half-closed: the peer reads the end once the output is delivered.
    /// `remainingOutput` is what a layer over it wrote last and the network has not taken yet
    /// (TLS's close_notify) — sent before the end; empty for a connection's own socket, which
    /// half-closes once its output is out.
    func socketShutdownWrite(remainingOutput: [UInt8])
    /// The socket is gone (its connection closed), or was never attached: what it had not
    /// sent is dropped; `unreadInput` says whether input was left unread (a reset, as TCP does).
    func socketClosed(unreadInput: Bool)
    /// As `socketClosed(unreadInput:)`, from a socket that goes: `remainingOutput` is what a
    /// layer over it (`SimulatedLayerSocket`) had written and the network not taken yet — bytes
    /// a kernel would still send after the close, before the end of the stream (empty for a
    /// connection's own socket, whose unsent output is dropped).
    func socketClosed(unreadInput: Bool, remainingOutput: [UInt8])
    /// The read and write inactivity timeouts of the socket (virtual ns; nil: none).
    func socketSetTimeouts(read: UInt64?, write: UInt64?)
}

extension LoopSimulating {
    /// No network: sockets on the simulation's loops are refused (`EventLoopError.simulatedLoop`).
    public var network: (any SimulatedNetworking)? { nil }
}

extension EventLoop {
    /// The network of this loop's simulation, if it has one (`MainspringTesting`).
    var simulatedNetwork: (any SimulatedNetworking)? { simulation?.network }

    /// The simulation's network, or `.simulatedLoop` naming `what` when there is none.
    func requireSimulatedNetwork(for what: @autoclosure () -> String) throws(EventLoopError) -> any SimulatedNetworking {
        guard let network = simulatedNetwork else { throw .simulatedLoop(refused: what()) }
        return network
    }
}
