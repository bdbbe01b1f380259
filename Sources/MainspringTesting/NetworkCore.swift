@_spi(Simulation) import MainspringCore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The engine of a simulation's network (`SimulatedNetwork`): hosts, listeners, streams and the
/// events that move their bytes on virtual time. Touched only on the thread that drives the
/// simulation (the loops call it from their dispatch), hence `@unchecked Sendable`.
///
/// ## The model
/// A stream is two ends and two directions. Each direction is a FIFO of packets (data, the end
/// of the stream, a reset), each with the virtual instant it arrives; the network delivers the
/// head when it is due, one packet per step, so that the loops run between two segments (a
/// parser sees every split). What a direction holds — in flight, or arrived and not yet read
/// because the reader stopped reading — is bounded by the window: the sender's output stays in
/// its socket's buffer beyond it, so its backpressure is real. A partition stalls a direction
/// at its head; healing it delivers the rest, one latency later. A reset fails both ends at once.
final class NetworkCore: SimulatedNetworking, SimulatedDatagramNetworking, @unchecked Sendable {
    let clock: VirtualClock
    /// Every random choice of the network (from the seed).
    var random: SplitMix64

    // Settings (see `SimulatedNetwork`).
    var latency: UInt64 = 0
    var maxSegmentSize: Int?
    var window = 262_144
    var connectTimeout: UInt64 = 127_000_000_000
    /// The chances that a datagram is lost, duplicated, or held back past later ones.
    var datagramLoss = 0.0
    var datagramDuplication = 0.0
    var datagramReordering = 0.0

    /// Bound UDP ports (see NetworkDatagrams.swift).
    var datagramPorts: [HostPort: NetworkDatagramPort] = [:]
    var nextDatagramPort: [String: UInt16] = [:]

    /// Each loop's host address.
    var hosts: [ObjectIdentifier: String] = [:]
    /// Every host address a loop was given (connects to others time out).
    var knownHosts: Set<String> = []
    var names: [String: [String]] = [:]
    var listeners: [HostPort: NetworkListener] = [:]
    var partitions: Set<HostPair> = []
    var nextPort: [String: UInt16] = [:]

    /// The ends whose sockets changed since the last step.
    private var dirty: [NetworkEnd] = []
    private var events = MinHeap<NetworkEvent>()
    private var sequence: UInt64 = 0
    /// Ends whose connection has not closed them yet (a leak check reads the count).
    private(set) var openEnds: Set<ObjectIdentifier> = []
    var ends: [ObjectIdentifier: NetworkEnd] = [:]

    /// Faults injected so far, by kind ("reset", "partition").
    var faults: [String: Int] = [:]
    /// Bytes of junk slipped in so far (every run of it).
    var junkBytes = 0

    init(clock: VirtualClock, seed: UInt64) {
        self.clock = clock
        random = SplitMix64(seed: seed ^ 0x6E65_7477_6F72_6B21)
    }

    deinit {
        // A stream whose two ends did not both close (its connect still on its way when the
        // simulation ended, an end in a backlog, a connection left open) is a cycle of two ends,
        // each the other's `peer`, which `ended` breaks only once both have closed: broken here,
        // as nothing can close them any more.
        for end in ends.values { end.peer = nil }
    }

    var now: UInt64 { clock.nanoseconds }

    // MARK: Listening

    func listen(on loop: EventLoop, host: String, port: UInt16, backlog: Int32,
                accepted: @escaping (any SimulatedStreamEnd, String) -> Void) throws(EventLoopError)
        -> any SimulatedListening
    {
        let own = try bindingHost(host, port: port, on: loop, call: "bind/listen")
        let chosen = port == 0 ? takePort(on: own, from: 40_000) : port
        let key = HostPort(host: own, port: chosen)
        if listeners[key] != nil { throw .system(function: "bind/listen \(host):\(port)", errno: EADDRINUSE) }
        let listener = NetworkListener(network: self, key: key, backlog: max(1, Int(backlog)), accepted: accepted)
        listeners[key] = listener
        return listener
    }

    /// A Unix path's place among the listeners: its host's namespace (no port).
    private func unixKey(_ path: String, on loop: EventLoop) -> HostPort {
        HostPort(host: "unix:\(host(of: loop)):\(path)", port: 0)
    }

    private func checkUnixPath(_ path: String) throws(EventLoopError) {
        guard !path.isEmpty, path.utf8.count <= 107 else {
            throw .invalidAddress("\(path.debugDescription) (a Unix socket path has 1 to 107 bytes)")
        }
    }

    func listen(unixPath path: String, on loop: EventLoop, backlog: Int32,
                accepted: @escaping (any SimulatedStreamEnd, String) -> Void) throws(EventLoopError)
        -> any SimulatedListening
    {
        try checkUnixPath(path)
        let key = unixKey(path, on: loop)
        if listeners[key] != nil { throw .unixSocketPathInUse(path: path, reason: "a listener on this simulated host has it") }
        let listener = NetworkListener(network: self, key: key, backlog: max(1, Int(backlog)), accepted: accepted, name: path)
        listeners[key] = listener
        return listener
    }

    func connect(unixPath path: String, from loop: EventLoop) throws(EventLoopError) -> any SimulatedStreamEnd {
        try checkUnixPath(path)
        guard let listener = listeners[unixKey(path, on: loop)] else {
            throw .system(function: "connect \(path)", errno: ENOENT)
        }
        guard listener.hasRoom else { throw .system(function: "connect \(path)", errno: EAGAIN) }
        let own = host(of: loop)
        let (client, server) = makeStream(clientHost: own, clientPort: takePort(on: own, from: 50_000),
                                          serverHost: own, serverPort: 0)
        listener.enqueue(server, peer: path)
        return client
    }

    func removeListener(_ listener: NetworkListener) {
        if listeners[listener.key] === listener { listeners[listener.key] = nil }
    }

    // MARK: Connecting

    func connect(from loop: EventLoop, to address: SocketAddress,
                 _ done: @escaping (Result<any SimulatedStreamEnd, EventLoopError>) -> Void)
    {
        let source = host(of: loop)
        let destination = isLoopback(address.host) ? source : address.host
        let attempt = ConnectAttempt(from: source, port: takePort(on: source, from: 50_000), to: destination,
                                     address: address, done: done)
        schedule(at: now &+ connectTimeout) { [unowned self] in
            attempt.finish(.failure(.system(function: "connect \(address)", errno: ETIMEDOUT)), network: self)
        }
        sendSyn(attempt, retryAfter: 1_000_000_000)
    }

    /// The connect's SYN, one latency on its way; unanswered (a partition, nobody at that
    /// address, a full backlog) it is sent again after `retryAfter`, doubling, until the
    /// connect times out.
    private func sendSyn(_ attempt: ConnectAttempt, retryAfter: UInt64) {
        schedule(at: now &+ latency) { [unowned self] in
            guard !attempt.isFinished else { return }
            let reachable = knownHosts.contains(attempt.to) && !isPartitioned(attempt.from, attempt.to)
            let listener = reachable ? listeners[HostPort(host: attempt.to, port: attempt.address.port)] : nil
            if reachable, listener == nil {
                // Nobody listens: a reset comes back.
                schedule(at: now &+ latency) { [unowned self] in
                    attempt.finish(.failure(.system(function: "connect \(attempt.address)", errno: ECONNREFUSED)), network: self)
                }
                return
            }
            guard let listener, listener.hasRoom else {
                schedule(at: now &+ retryAfter) { [unowned self] in
                    guard !attempt.isFinished else { return }
                    sendSyn(attempt, retryAfter: retryAfter &* 2)
                }
                return
            }
            let (client, server) = makeStream(clientHost: attempt.from, clientPort: attempt.port,
                                              serverHost: attempt.to, serverPort: attempt.address.port)
            listener.enqueue(server, peer: "\(attempt.from):\(attempt.port)")
            // The SYN-ACK: the client is connected one latency later.
            schedule(at: now &+ latency) { [unowned self] in
                if attempt.isFinished {
                    client.socketClosed(unreadInput: false)
                } else if client.isReset {
                    // The stream was reset while the answer travelled: the connect fails.
                    client.socketClosed(unreadInput: false)
                    attempt.finish(.failure(.system(function: "connect \(attempt.address)", errno: ECONNRESET)), network: self)
                } else {
                    attempt.finish(.success(client), network: self)
                }
            }
        }
    }

    func makePair(on loop: EventLoop) -> (any SimulatedStreamEnd, any SimulatedStreamEnd) {
        let host = self.host(of: loop)
        return makeStream(clientHost: host, clientPort: takePort(on: host, from: 50_000),
                          serverHost: host, serverPort: takePort(on: host, from: 50_000))
    }

    /// A pipe on `loop`'s host: a stream without latency or faults (the kernel's pipe buffer,
    /// not a link), whose writer sees `EPIPE` where a socket's would see a reset.
    func makePipe(on loop: EventLoop) -> (writer: any SimulatedStreamEnd, reader: any SimulatedStreamEnd) {
        let host = self.host(of: loop)
        return makeStream(clientHost: host, clientPort: 0, serverHost: host, serverPort: 0, isPipe: true)
    }

    private func makeStream(clientHost: String, clientPort: UInt16, serverHost: String, serverPort: UInt16,
                            isPipe: Bool = false) -> (NetworkEnd, NetworkEnd)
    {
        let client = NetworkEnd(network: self, host: clientHost, port: clientPort, key: random.next(), isPipe: isPipe)
        let server = NetworkEnd(network: self, host: serverHost, port: serverPort, key: random.next(), isPipe: isPipe)
        client.peer = server
        server.peer = client
        for end in [client, server] {
            openEnds.insert(ObjectIdentifier(end))
            ends[ObjectIdentifier(end)] = end
        }
        return (client, server)
    }

    func ended(_ end: NetworkEnd) {
        openEnds.remove(ObjectIdentifier(end))
        if let peer = end.peer, !openEnds.contains(ObjectIdentifier(peer)) {
            ends[ObjectIdentifier(end)] = nil
            ends[ObjectIdentifier(peer)] = nil
            end.peer = nil
            peer.peer = nil
        }
    }

    // MARK: Moving bytes

    func markDirty(_ end: NetworkEnd) {
        guard !end.isDirty else { return }
        end.isDirty = true
        dirty.append(end)
    }

    /// The earliest instant at which the network has something to do (now, when a socket
    /// changed), or nil.
    var nextEventTime: UInt64? {
        if !dirty.isEmpty { return now }
        return events.first?.time
    }

    /// Does the network's next piece of work due now: the changed sockets' output taken onto
    /// their links, or one due event. Returns whether anything happened.
    func runOneDue() -> Bool {
        var moved = false
        while !dirty.isEmpty {
            let batch = dirty
            dirty.removeAll()
            for end in batch {
                end.isDirty = false
                if pump(end) { moved = true }
            }
            if moved { return true }
        }
        guard let first = events.first, first.time <= now else { return false }
        let event = events.removeFirst()
        event.action()
        return true
    }

    /// Schedules `action` (closures here hold the core `unowned`: the heap of events belongs to
    /// the core, so a strong capture would keep a simulation's network alive for ever once events
    /// are left pending at its end — a connect's timeout, say).
    func schedule(at time: UInt64, key: UInt64 = 0, _ action: @escaping () -> Void) {
        sequence &+= 1
        events.insert(NetworkEvent(time: time, key: key, sequence: sequence, action: action))
    }

    /// Takes what `end`'s socket wrote onto its link (up to the window), and resumes what was
    /// waiting on it. Returns whether anything moved.
    private func pump(_ end: NetworkEnd) -> Bool {
        var moved = false
        let direction = end.outgoing
        if let socket = end.socket, socket.isOpen {
            if end.isWriteShut, socket.outputCount > 0, !end.isReset {
                // Written after the write side was shut (it shuts only once the output is
                // empty): a kernel refuses it with EPIPE, the connection fails with that, and the
                // peer never sees it — it has its end of the stream.
                _ = socket.takeOutput(upTo: socket.outputCount)
                socket.deliverError(EPIPE)
                markDirty(end)  // the end of the stream, if not sent yet, on the next pump
                return true
            }
            let room = window - direction.bytes
            if room > 0, socket.outputCount > 0, !end.isReset {
                let bytes = socket.takeOutput(upTo: room)
                if !bytes.isEmpty {
                    end.lastWrite = now
                    send(bytes, from: end)
                    moved = true
                }
            }
            if end.isWriteShut, !end.finSent, socket.outputCount == 0, !end.isReset {
                end.finSent = true
                direction.packets.append(Packet(kind: .end, arrival: now &+ latency(of: end)))
                scheduleHead(of: end)
                moved = true
            }
            let reading = socket.isReading
            if reading != end.wasReading {
                end.wasReading = reading
                if reading {
                    end.lastRead = now
                    armReadTimeout(end)
                }
            }
            if end.writeTimeout != nil, socket.isWritePending { armWriteTimeout(end) }
        }
        // Input taken or reading resumed: a direction stalled on this reader goes on.
        if let peer = end.peer, peer.outgoing.isStalledOnReader, (end.socket?.inputRoom ?? 0) > 0 || end.isClosed {
            peer.outgoing.isStalledOnReader = false
            scheduleHead(of: peer)
            moved = true
        }
        return moved
    }

    /// What a layer's socket had written when it closed: onto the link (past the window, as a
    /// kernel's send buffer), before the end.
    func sendRemaining(_ bytes: [UInt8], from end: NetworkEnd) {
        end.lastWrite = now
        send(bytes, from: end)
    }

    /// `bytes` onto `end`'s link, in segments of at most `maxSegmentSize`, all arriving one
    /// latency from now.
    private func send(_ bytes: [UInt8], from end: NetworkEnd) {
        let arrival = now &+ latency(of: end)
        let size = max(1, maxSegmentSize ?? bytes.count)
        var start = 0
        while start < bytes.count {
            let stop = min(bytes.count, start + size)
            end.outgoing.packets.append(Packet(kind: .data(Array(bytes[start..<stop])), arrival: arrival))
            start = stop
        }
        end.outgoing.bytes += bytes.count
        scheduleHead(of: end)
    }

    /// How long what `end` sends travels: the link's latency; nothing through a pipe.
    func latency(of end: NetworkEnd) -> UInt64 { end.isPipe ? 0 : latency }

    /// Schedules the delivery of `end`'s outgoing head, if not scheduled already.
    func scheduleHead(of end: NetworkEnd, notBefore: UInt64 = 0) {
        let direction = end.outgoing
        guard !direction.isHeadScheduled, let head = direction.packets.first else { return }
        direction.isHeadScheduled = true
        schedule(at: max(head.arrival, now, notBefore), key: end.key) { [unowned self] in
            direction.isHeadScheduled = false
            deliverHead(of: end)
        }
    }

    private func deliverHead(of sender: NetworkEnd) {
        let direction = sender.outgoing
        guard let receiver = sender.peer, let packet = direction.packets.first else { return }
        // Never early: a head that changed since it was scheduled waits for its own arrival.
        if packet.arrival > now { return scheduleHead(of: sender) }
        if isPartitioned(sender.host, receiver.host) {
            direction.isStalledByPartition = true
            return
        }
        if receiver.isClosed || receiver.isReset {
            // Nobody reads any more: data gets a reset back; an end or a reset is dropped. The
            // reset follows what the closed end sent before (its end, on the wire already):
            // the peer reads that first, as over TCP.
            let wasData = if case .data = packet.kind { true } else { false }
            direction.packets.removeAll()
            direction.bytes = 0
            markDirty(sender)  // room on the link again: the sender goes on, into the void
            if wasData, !receiver.isReset, !receiver.rstSent {
                receiver.rstSent = true
                receiver.outgoing.packets.append(Packet(kind: .reset, arrival: now &+ latency(of: receiver)))
                scheduleHead(of: receiver)
            }
            return
        }
        guard let socket = receiver.socket else {
            direction.isStalledOnReader = true  // accepted, its connection not made yet
            return
        }
        switch packet.kind {
        case .data(let bytes):
            let room = socket.inputRoom
            guard room > 0 else {
                // A reset behind what waits for this reader is not held back by it (TCP takes
                // an RST whatever its window): at its arrival, what waits is dropped and the
                // reset delivered.
                if let index = direction.packets.firstIndex(where: { if case .reset = $0.kind { true } else { false } }) {
                    let resetArrival = direction.packets[index].arrival
                    if resetArrival <= now {
                        for dropped in direction.packets[..<index] {
                            if case .data(let waiting) = dropped.kind { direction.bytes -= waiting.count }
                        }
                        direction.packets.removeFirst(index)
                        return deliverHead(of: sender)
                    }
                    direction.isStalledOnReader = true
                    return scheduleHead(of: sender, notBefore: resetArrival)
                }
                direction.isStalledOnReader = true
                return
            }
            let count = min(room, bytes.count)
            if count < bytes.count {
                direction.packets[0] = Packet(kind: .data(Array(bytes[count...])), arrival: packet.arrival)
            } else {
                direction.packets.removeFirst()
            }
            direction.bytes -= count
            receiver.lastRead = now
            socket.deliver(count < bytes.count ? Array(bytes[..<count]) : bytes)
            markDirty(sender)  // room on the link: the sender's output may go on
        case .end:
            direction.packets.removeFirst()
            socket.deliverEndOfFile()
        case .reset:
            direction.packets.removeAll()
            direction.bytes = 0
            receiver.isReset = true
            receiver.outgoing.packets.removeAll()
            receiver.outgoing.bytes = 0
            // A pipe's writer whose reader went with input unread: EPIPE, as write(2) says.
            socket.deliverError(receiver.isPipe ? EPIPE : ECONNRESET)
        }
        scheduleHead(of: sender)
    }
}
