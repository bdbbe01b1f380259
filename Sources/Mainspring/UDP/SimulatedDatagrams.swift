/// What a simulation's network provides to `DatagramSocket` on its loops (`MainspringTesting`'s
/// `SimulatedNetwork`): UDP ports bound on a loop's host, datagrams moved in memory on virtual
/// time — lost, duplicated or delayed past later ones as the network's settings and seed decide.
/// The socket's own code (its queue, its consumers, its statistics, truncation) is the real one;
/// only the descriptor and its system calls are replaced.
///
/// Everything here is called on the thread that drives the simulation (the loops' thread).
@_spi(Simulation)
public protocol SimulatedDatagramNetworking: AnyObject {
    /// Binds a UDP port on `host:port` of `loop`'s host (`port` 0: the network picks one).
    /// `arrived` runs on `loop`'s thread for each datagram that reaches the port, and for each
    /// port-unreachable answer to one it sent.
    /// - Throws: `EventLoopError.system` with `EADDRINUSE` when the port is taken,
    ///   `EADDRNOTAVAIL` when `host` is not an address of `loop`'s host.
    func bindDatagram(on loop: EventLoop, host: String, port: UInt16,
                      arrived: @escaping (SimulatedDatagramArrival) -> Void) throws(EventLoopError)
        -> any SimulatedDatagramPort
}

/// What reaches a simulated UDP port.
@_spi(Simulation)
public enum SimulatedDatagramArrival {
    /// A datagram, with its sender's address.
    case datagram([UInt8], from: SocketAddress)
    /// Nobody was bound where a datagram from this port went (`address`): the ICMP
    /// port-unreachable a connected socket reports as `ECONNREFUSED`.
    case unreachable(SocketAddress)
}

/// A bound UDP port of a simulated network (see `SimulatedDatagramNetworking`).
@_spi(Simulation)
public protocol SimulatedDatagramPort: AnyObject {
    /// The address it is bound to (its host's address; the port chosen for port 0).
    var localAddress: SocketAddress { get }
    /// Sends `bytes` to `address`: the network delivers it one latency later, or not (a loss,
    /// a partition, nobody bound there), or twice, or late.
    func send(_ bytes: [UInt8], to address: SocketAddress)
    /// Unbinds: nothing arrives from now on, and the port is free again.
    func close()
}

extension EventLoop {
    /// The datagram side of this loop's simulated network, or `.simulatedLoop` naming `what`.
    func requireSimulatedDatagrams(for what: @autoclosure () -> String) throws(EventLoopError)
        -> any SimulatedDatagramNetworking
    {
        guard let network = simulatedNetwork as? any SimulatedDatagramNetworking else {
            throw .simulatedLoop(refused: what())
        }
        return network
    }
}
