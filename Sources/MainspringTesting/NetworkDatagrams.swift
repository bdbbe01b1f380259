@_spi(Simulation) import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// UDP on the simulated network: ports bound on a loop's host, and datagrams that travel one
/// latency — unless the seed loses one (``NetworkCore/datagramLoss``), sends it twice
/// (``NetworkCore/datagramDuplication``) or holds it back past the ones sent after it
/// (``NetworkCore/datagramReordering``). A partition loses what crosses it (UDP does not wait);
/// a datagram to a port nobody binds on a reachable host gets a port-unreachable back.
extension NetworkCore {
    func bindDatagram(on loop: EventLoop, host: String, port: UInt16,
                      arrived: @escaping (SimulatedDatagramArrival) -> Void) throws(EventLoopError)
        -> any SimulatedDatagramPort
    {
        let own = try bindingHost(host, port: port, on: loop, call: "bind")
        let chosen = port == 0
            ? takeFreePort(&nextDatagramPort, on: own, from: 40_000) { datagramPorts[HostPort(host: own, port: $0)] != nil }
            : port
        let key = HostPort(host: own, port: chosen)
        if datagramPorts[key] != nil { throw .system(function: "bind \(host):\(port)", errno: EADDRINUSE) }
        // The address it reports is the one it was bound to, as `getsockname` says (`host` is a
        // literal: `DatagramSocket` parsed it); the one its datagrams come from is its host's.
        let local = try SocketAddress(ipAddress: host, port: chosen)
        let external = try SocketAddress(ipAddress: own, port: chosen)
        let bound = NetworkDatagramPort(network: self, key: key, localAddress: local, hostAddress: external,
                                        order: random.next(), arrived: arrived)
        datagramPorts[key] = bound
        return bound
    }

    /// A datagram from `port` to `address` onto the link: lost, duplicated or delayed as the
    /// seed decides; each copy arrives one latency later (plus, held back, up to two more
    /// latencies and a millisecond).
    fileprivate func send(_ bytes: [UInt8], from port: NetworkDatagramPort, to address: SocketAddress) {
        let destinationHost = isLoopback(address.host) ? port.key.host : address.host
        guard knownHosts.contains(destinationHost) || destinationHost == port.key.host,
              !isPartitioned(port.key.host, destinationHost)
        else { return }  // nobody has the address, or a partition: gone without a word
        if chance(datagramLoss) {
            faults["datagram-loss", default: 0] += 1
            return
        }
        // The sender as the receiver sees it: the loopback address for a loopback send (a literal,
        // from a parsed address, so parsing it again cannot fail), else the port's host's.
        let sender = isLoopback(address.host)
            ? (try? SocketAddress(ipAddress: address.host, port: port.key.port)) ?? port.hostAddress
            : port.hostAddress
        let destination = HostPort(host: destinationHost, port: address.port)
        let copies = chance(datagramDuplication) ? 2 : 1
        if copies == 2 { faults["datagram-duplicate", default: 0] += 1 }
        for _ in 0..<copies {
            var arrival = now &+ latency
            if chance(datagramReordering) {
                faults["datagram-reorder", default: 0] += 1
                arrival &+= 1 &+ random.next() % (2 &* latency &+ 1_000_000)
            }
            schedule(at: arrival, key: port.order) { [unowned self] in
                deliverDatagram(bytes, from: sender, fromPort: port, to: destination, as: address)
            }
        }
    }

    private func deliverDatagram(_ bytes: [UInt8], from sender: SocketAddress, fromPort: NetworkDatagramPort,
                                 to destination: HostPort, as address: SocketAddress)
    {
        if isPartitioned(fromPort.key.host, destination.host) { return }
        if let receiver = datagramPorts[destination] {
            receiver.arrived(.datagram(bytes, from: sender))
            return
        }
        // Nobody bound there: the ICMP port-unreachable travels back.
        schedule(at: now &+ latency, key: fromPort.order) {
            if !fromPort.isClosed { fromPort.arrived(.unreachable(address)) }
        }
    }

    fileprivate func unbind(_ port: NetworkDatagramPort) {
        if datagramPorts[port.key] === port { datagramPorts[port.key] = nil }
    }

    /// True with probability `probability` (from the seed; no draw when it is 0 or less).
    private func chance(_ probability: Double) -> Bool {
        probability > 0 && uniform() < probability
    }
}

/// A bound UDP port of the simulated network.
final class NetworkDatagramPort: SimulatedDatagramPort {
    unowned let network: NetworkCore
    let key: HostPort
    let localAddress: SocketAddress
    /// Its host's address with its port: where its datagrams come from (but on loopback).
    let hostAddress: SocketAddress
    /// Orders this port's deliveries against others' at one instant (from the seed).
    let order: UInt64
    let arrived: (SimulatedDatagramArrival) -> Void
    private(set) var isClosed = false

    init(network: NetworkCore, key: HostPort, localAddress: SocketAddress, hostAddress: SocketAddress, order: UInt64,
         arrived: @escaping (SimulatedDatagramArrival) -> Void)
    {
        self.network = network
        self.key = key
        self.localAddress = localAddress
        self.hostAddress = hostAddress
        self.order = order
        self.arrived = arrived
    }

    func send(_ bytes: [UInt8], to address: SocketAddress) {
        guard !isClosed else { return }
        network.send(bytes, from: self, to: address)
    }

    func close() {
        guard !isClosed else { return }
        isClosed = true
        network.unbind(self)
    }
}
