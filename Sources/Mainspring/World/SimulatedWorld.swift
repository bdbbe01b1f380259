/// A simulation's world (`MainspringTesting`): its network's streams and listeners stand in
/// for sockets, on virtual time; what has no simulated counterpart (a descriptor to adopt) is
/// refused with `EventLoopError.simulatedLoop`.
final class SimulatedWorld: LoopWorld {
    let simulation: any LoopSimulating
    /// Who opened the loop's sources (its simulated programs' descriptors, as a kernel keeps them).
    private let owners = SimulatedOwnerships()
    var ownership: SimulatedOwnerships? { owners }

    init(_ simulation: any LoopSimulating) { self.simulation = simulation }

    func loopMade(_ loop: EventLoop) {
        // Only the loop's own eventfd is real on a simulated loop: a watcher of a descriptor, a
        // signal, a socket made by hand are refused (`EventLoopError.simulatedLoop`).
        loop.base.refusesDescriptors = true
        // The simulation drives a simulated loop from the start: it waits for work.
        loop.activityStamp.set(0)
    }

    func loopShutDown(_ loop: EventLoop) {
        // A real loop's `run()` marks it not running as it returns; the simulation has no such
        // moment, so a simulated loop is marked here.
        if EventLoop.runningLoop.value !== loop { loop.activityStamp.set(ActivityStamp.notRunning) }
    }

    func sourceRegistered(_ source: Source) {
        guard let owner = owners.current else { return }
        source.loop.setSimulatedOwner(owner, of: source)
    }

    var armsNativeTimers: Bool { false }
    var sharesListeningSockets: Bool { false }

    func bindDatagram(_ address: SocketAddress, port: UInt16, on loop: EventLoop, options: DatagramSocket.Options)
        throws(EventLoopError) -> (DatagramSource, SocketAddress)
    {
        let network = try loop.requireSimulatedDatagrams(for: "a UDP socket on \(address.host):\(port)")
        let transport = SimulatedDatagramTransport()
        let bound = try network.bindDatagram(on: loop, host: address.host, port: port) { [weak transport] arrival in
            transport?.arrived(arrival)
        }
        transport.port = bound
        // (A source that cannot be made closes its transport: the port is free again.)
        let source = try DatagramSource(loop: loop, transport: transport, family: address.family, options: options)
        transport.source = source
        return (source, bound.localAddress)
    }

    func spawn(_ configuration: Subprocess.Configuration, on loop: EventLoop, forcePolling: Bool)
        throws(SubprocessError) -> Subprocess
    {
        try Subprocess.launchSimulated(configuration, on: loop)
    }

    /// The simulation's table (`SimulatedNetwork.register(name:address:)`), at once.
    func resolve(_ host: String, port: UInt16, timeout: Duration, on loop: EventLoop,
                 _ done: @escaping (Result<[SocketAddress], EventLoopError>) -> Void)
    {
        guard let addresses = simulation.network?.resolve(host, port: port), !addresses.isEmpty else {
            done(.failure(.hostNotFound(host: host, reason: "no address registered with the simulation's network")))
            return
        }
        done(.success(addresses))
    }

    func connectStream(to host: String, port: UInt16, options: Connection.Options, on loop: EventLoop,
                       _ done: @escaping (Result<StreamEndpoint, EventLoopError>) -> Void)
    {
        loop.connectSimulatedStream(to: host, port: port, options: options) { result in done(result.map { .simulated($0) }) }
    }

    /// No pipe and no thread: one source of the loop, on the simulation's time.
    func makeInputDriver(on loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
                         onEvent: ((InputSimulator.Event) -> Void)?) throws(EventLoopError) -> any InputDriver
    {
        guard loop.claimThread() else { throw .wrongThread(function: "InputSimulator.init") }
        return SimulatedInputSource(loop: loop, pattern: pattern, count: count, cost: cost, onEvent: onEvent)
    }

    func sourceUnregistered(_ source: Source) {
        guard !owners.records.isEmpty else { return }
        owners.records[ObjectIdentifier(source)] = nil
    }

    func startConnect(_ source: ConnectionSource, to host: String, port: UInt16, options: Connection.Options)
        throws(EventLoopError)
    {
        try source.connectOverSimulatedNetwork(host: host, port: port, options: options)
    }

    func connect(unixPath path: String, from loop: EventLoop) throws(EventLoopError) -> StreamEndpoint {
        .simulated(try loop.requireSimulatedNetwork(for: "a connection to \(path)").connect(unixPath: path, from: loop))
    }

    func makePair(on loop: EventLoop) throws(EventLoopError) -> (StreamEndpoint, StreamEndpoint) {
        let (first, second) = try loop.requireSimulatedNetwork(for: "Connection.makePair").makePair(on: loop)
        return (.simulated(first), .simulated(second))
    }

    func adopt(descriptor: Int32) throws(EventLoopError) -> StreamEndpoint {
        throw .simulatedLoop(refused: "Connection.adopting(descriptor: \(descriptor))")
    }

    func listen(_ socket: ListeningSocket, on loop: EventLoop, target: SocketListenerTarget) throws(EventLoopError)
        -> any ListeningPort
    {
        let accepted: (any SimulatedStreamEnd, String) -> Void = { [weak target] end, peer in
            guard let target else {
                end.socketClosed(unreadInput: false)
                return
            }
            target.accepted(.simulated(end), peer: peer)
        }
        switch socket {
        case .binding(let host, let port, let backlog):
            let network = try loop.requireSimulatedNetwork(for: "a TCP listener on \(host):\(port)")
            return SimulatedListeningPort(try network.listen(on: loop, host: host, port: port, backlog: backlog,
                                                             accepted: accepted))
        case .unix(let path, _, let backlog):
            // No file on a simulated host: `mode` has nothing to apply to.
            let network = try loop.requireSimulatedNetwork(for: "a Unix listener at \(path)")
            return SimulatedListeningPort(try network.listen(unixPath: path, on: loop, backlog: backlog, accepted: accepted))
        case .adopting(let fd):
            throw .simulatedLoop(refused: "a listener adopting descriptor \(fd)")
        }
    }
}

/// A listener of a simulation's network as a `ListeningPort`.
private final class SimulatedListeningPort: ListeningPort {
    private let listening: any SimulatedListening

    init(_ listening: any SimulatedListening) { self.listening = listening }

    var port: UInt16 { listening.port }
    var localAddress: String { listening.localAddress }
    func setAccepting(_ accepting: Bool) { listening.setAccepting(accepting) }
    func close() { listening.close() }
}
