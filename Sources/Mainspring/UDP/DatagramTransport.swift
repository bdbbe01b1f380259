#if canImport(Glibc)
import Glibc
#endif

/// Where a datagram socket's datagrams go and come from, as the loop's world made it
/// (`LoopWorld.bindDatagram`): a kernel's UDP socket (`KernelDatagramTransport`), or a port of
/// a simulation's network (`SimulatedDatagramTransport`). `DatagramSource` — the consumer, the
/// send queue, the statistics — is one code over either. Loop thread only.
protocol DatagramTransport: AnyObject {
    /// The event that says the socket can take more (a kernel's socket; none for a simulation's
    /// port, which never refuses a datagram).
    func makeWriteEvent(on base: EventBase, target: NativeEventTarget) throws(EventLoopError) -> NativeEvent?
    /// The consumer is about to be set: start what tells `source` that datagrams are there.
    func startReading(for source: DatagramSource) throws(EventLoopError)
    /// The consumer is set: what waits already may be delivered.
    func readerReady(_ source: DatagramSource)
    /// Reading resumes after a pause.
    func resumeReading(for source: DatagramSource)
    /// Delivers up to `limit` datagrams (and errors) to `source` (`deliver`); the rest later.
    func receive(for source: DatagramSource, limit: Int)
    /// Sends `datagrams`, each to its own address or to `peer`.
    func send(_ datagrams: ArraySlice<Datagram>, peer: SocketAddress?) -> DatagramCallResult
    /// `connect(2)`: 0, or the errno.
    func connect(to address: SocketAddress) -> Int32
    /// Joins or leaves a multicast group: 0, or the errno.
    /// - Throws: `.simulatedLoop` where there is no multicast (a simulation's network).
    func changeMembership(of group: SocketAddress, interfaceIndex: UInt32, join: Bool) throws(EventLoopError) -> Int32
    /// The socket goes: the descriptor closed, the port free again.
    func close()
}

/// A kernel's UDP socket: `recvmmsg`/`sendmmsg` in batches on its descriptor.
final class KernelDatagramTransport: DatagramTransport {
    let fd: Int32
    private var receiveBuffers: DatagramReceiveBuffers?

    init(fd: Int32) { self.fd = fd }

    func makeWriteEvent(on base: EventBase, target: NativeEventTarget) throws(EventLoopError) -> NativeEvent? {
        try NativeEvent(base: base, fd: fd, readiness: .write, persistent: true, target: target)
    }

    func startReading(for source: DatagramSource) throws(EventLoopError) {
        try source.addNativeEvent(fd: fd, readiness: .read, persistent: true)
        receiveBuffers = DatagramReceiveBuffers(size: source.options.maximumDatagramSize,
                                                batch: source.options.receiveBatchSize)
    }

    func readerReady(_ source: DatagramSource) {}

    func resumeReading(for source: DatagramSource) { source.resumeNative() }

    func receive(for source: DatagramSource, limit: Int) {
        guard let buffers = receiveBuffers else { return }
        var handled = 0
        while handled < limit, !source.isClosed, !source.isReadingPaused {
            let wanted = min(buffers.batch, limit - handled)
            switch buffers.receive(fd, limit: wanted) {
            case .done(let count):
                source.statistics.receiveBatches += 1
                for index in 0..<count {
                    let (bytes, isTruncated, length, sender) = buffers.datagram(at: index)
                    source.deliver(.datagram(Datagram(received: bytes, from: sender, isTruncated: isTruncated, length: length)))
                    if source.isClosed { return }
                }
                handled += count
                if count < wanted { return }
            case .wouldBlock:
                return
            case .failed(let code):
                source.deliver(.error(errno: code))
                handled += 1
            }
        }
    }

    func send(_ datagrams: ArraySlice<Datagram>, peer: SocketAddress?) -> DatagramCallResult {
        sendDatagramBatch(fd, datagrams)
    }

    func connect(to address: SocketAddress) -> Int32 { connectDatagramSocket(fd, to: address) }

    func changeMembership(of group: SocketAddress, interfaceIndex: UInt32, join: Bool) throws(EventLoopError) -> Int32 {
        changeMulticastMembership(fd, group: group, interfaceIndex: interfaceIndex, join: join)
    }

    func close() { closeDescriptor(fd) }
}

/// A port of a simulation's network (`MainspringTesting`): what is sent goes to the network,
/// and what arrives waits in an inbox — the kernel's receive buffer — until the consumer takes
/// it.
final class SimulatedDatagramTransport: DatagramTransport {
    /// The network's port (set once bound).
    var port: (any SimulatedDatagramPort)?
    /// The socket it serves (set once made).
    weak var source: DatagramSource?
    /// What the network delivered and the consumer has not taken, from `inboxStart`.
    private var inbox: [DatagramEvent] = []
    private var inboxStart = 0
    private var inboxBytes = 0

    func makeWriteEvent(on base: EventBase, target: NativeEventTarget) throws(EventLoopError) -> NativeEvent? { nil }

    func startReading(for source: DatagramSource) throws(EventLoopError) {}

    func readerReady(_ source: DatagramSource) {
        if inboxStart < inbox.count { source.fire(.read) }
    }

    func resumeReading(for source: DatagramSource) { readerReady(source) }

    /// A datagram (or a port-unreachable) the network delivered: into the inbox — or dropped,
    /// as the kernel drops, when it is from another peer than the connected one, or the inbox
    /// holds ``DatagramSocket/Options/receiveBufferSize`` bytes (default 212,992, Linux's
    /// `rmem_default`) or 4,096 events (empty datagrams take room in a kernel's buffer too) —
    /// and the consumer is told.
    func arrived(_ arrival: SimulatedDatagramArrival) {
        guard let source, !source.isClosed, inbox.count - inboxStart < 4_096 else { return }
        switch arrival {
        case .datagram(let bytes, let sender):
            if let peer = source.peer, sender != peer { return }
            guard inboxBytes + bytes.count <= source.options.receiveBufferSize ?? 212_992 else { return }
            let size = max(0, source.options.maximumDatagramSize)
            let datagram = bytes.count > size
                ? Datagram(received: Array(bytes.prefix(size)), from: sender, isTruncated: true, length: bytes.count)
                : Datagram(received: bytes, from: sender, isTruncated: false, length: bytes.count)
            inbox.append(.datagram(datagram))
            inboxBytes += bytes.count
        case .unreachable(let address):
            // Linux reports a port-unreachable only to a socket connected to that address.
            guard address == source.peer else { return }
            inbox.append(.error(errno: ECONNREFUSED))
        }
        if source.handler != nil, !source.isReadingPaused { source.fire(.read) }
    }

    /// Up to `limit` events from the inbox (one batch); the rest on the loop's next turn.
    func receive(for source: DatagramSource, limit: Int) {
        var handled = 0
        if inboxStart < inbox.count { source.statistics.receiveBatches += 1 }
        while handled < limit, inboxStart < inbox.count, !source.isClosed, !source.isReadingPaused {
            let event = inbox[inboxStart]
            inboxStart += 1
            handled += 1
            if case .datagram(let datagram) = event { inboxBytes -= datagram.length }
            source.deliver(event)
        }
        if inboxStart == inbox.count {
            inbox.removeAll(keepingCapacity: inbox.capacity <= 1_024)
            inboxStart = 0
        } else if inboxStart > 256, inboxStart * 2 > inbox.count {
            // A steady flow that never lets the inbox empty: drop what was taken, so the array
            // stays as bounded as the bytes it holds.
            inbox.removeFirst(inboxStart)
            inboxStart = 0
        }
        if inboxStart < inbox.count, !source.isClosed, !source.isReadingPaused {
            source.fire(.read)  // the rest next turn, as a level-triggered descriptor would
        }
    }

    func send(_ datagrams: ArraySlice<Datagram>, peer: SocketAddress?) -> DatagramCallResult {
        // The socket's check made sure each has a destination (its own, or the connected peer).
        for datagram in datagrams {
            if let address = datagram.address ?? peer { port?.send(datagram.bytes, to: address) }
        }
        return .done(datagrams.count)
    }

    /// The simulated network sends nothing for a connect either.
    func connect(to address: SocketAddress) -> Int32 { 0 }

    func changeMembership(of group: SocketAddress, interfaceIndex: UInt32, join: Bool) throws(EventLoopError) -> Int32 {
        throw .simulatedLoop(refused: "multicast group \(group.host)")
    }

    func close() {
        inbox = []
        inboxStart = 0
        inboxBytes = 0
        port?.close()
        port = nil
    }
}
