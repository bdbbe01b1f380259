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
    private var hosts: [ObjectIdentifier: String] = [:]
    /// Every host address a loop was given (connects to others time out).
    private(set) var knownHosts: Set<String> = []
    private var names: [String: [String]] = [:]
    private var listeners: [HostPort: NetworkListener] = [:]
    private var partitions: Set<HostPair> = []
    private var nextPort: [String: UInt16] = [:]

    /// The ends whose sockets changed since the last step.
    private var dirty: [NetworkEnd] = []
    private var events = EventHeap()
    private var sequence: UInt64 = 0
    /// Ends whose connection has not closed them yet (a leak check reads the count).
    private(set) var openEnds: Set<ObjectIdentifier> = []
    private var ends: [ObjectIdentifier: NetworkEnd] = [:]

    /// Faults injected so far, by kind ("reset", "partition").
    var faults: [String: Int] = [:]
    /// Bytes of junk slipped in so far (every run of it).
    private(set) var junkBytes = 0

    init(clock: VirtualClock, seed: UInt64) {
        self.clock = clock
        random = SplitMix64(seed: seed ^ 0x6E65_7477_6F72_6B21)
    }

    var now: UInt64 { clock.nanoseconds }

    // MARK: Hosts and names

    func setHost(_ host: String, for loop: EventLoop) {
        hosts[ObjectIdentifier(loop)] = host
        knownHosts.insert(host)
    }

    func host(of loop: EventLoop) -> String { hosts[ObjectIdentifier(loop)] ?? "127.0.0.1" }

    func register(name: String, address: String) {
        names[name.lowercased(), default: []].append(address)
    }

    func resolve(_ name: String, port: UInt16) -> [SocketAddress]? {
        let key = name.lowercased()
        let addresses = names[key] ?? (key == "localhost" ? ["127.0.0.1"] : nil)
        // A registered address that is not an IP literal resolves to nothing (as a name
        // without records does): `register` documents dotted IPv4 addresses.
        return addresses?.compactMap { try? SocketAddress(ipAddress: $0, port: port) }
    }

    func isLoopback(_ address: String) -> Bool {
        address == "127.0.0.1" || address == "::1" || address == "localhost"
    }

    private func takePort(on host: String, from first: UInt16) -> UInt16 {
        takeFreePort(&nextPort, on: host, from: first) { listeners[HostPort(host: host, port: $0)] != nil }
    }

    /// The first port from `first` (or after the last one `next` handed out on `host`) that
    /// `isTaken` says is free; `next` remembers it. TCP and UDP each keep their own `next`.
    func takeFreePort(_ next: inout [String: UInt16], on host: String, from first: UInt16,
                      isTaken: (UInt16) -> Bool) -> UInt16
    {
        var port = max(next[host] ?? first, first)
        while isTaken(port) { port &+= 1 }
        next[host] = port &+ 1
        return port
    }

    /// The host `loop` binds on for a bind to `host` (a wildcard, a loopback address, or the
    /// loop's own address); `EADDRNOTAVAIL`, naming `call`, for an address of another host.
    func bindingHost(_ host: String, port: UInt16, on loop: EventLoop, call: String) throws(EventLoopError) -> String {
        let own = self.host(of: loop)
        let wildcard = host == "0.0.0.0" || host == "::" || host.isEmpty
        guard wildcard || isLoopback(host) || host == own else {
            throw .system(function: "\(call) \(host):\(port)", errno: EADDRNOTAVAIL)
        }
        return own
    }

    /// A uniform draw in [0, 1) from the seed.
    func uniform() -> Double { Double(random.next() >> 11) / Double(UInt64(1) << 53) }

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

    fileprivate func removeListener(_ listener: NetworkListener) {
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

    fileprivate func ended(_ end: NetworkEnd) {
        openEnds.remove(ObjectIdentifier(end))
        if let peer = end.peer, !openEnds.contains(ObjectIdentifier(peer)) {
            ends[ObjectIdentifier(end)] = nil
            ends[ObjectIdentifier(peer)] = nil
            end.peer = nil
            peer.peer = nil
        }
    }

    // MARK: Faults

    func isPartitioned(_ one: String, _ other: String) -> Bool {
        one != other && partitions.contains(HostPair(one, other))
    }

    func partition(_ one: String, _ other: String) {
        if partitions.insert(HostPair(one, other)).inserted { faults["partition", default: 0] += 1 }
    }

    func heal(_ one: String, _ other: String) {
        guard partitions.remove(HostPair(one, other)) != nil else { return }
        for end in ends.values where end.outgoing.isStalledByPartition && HostPair(end.host, end.peer?.host ?? "") == HostPair(one, other) {
            end.outgoing.isStalledByPartition = false
            scheduleHead(of: end, notBefore: now &+ latency)
        }
    }

    /// Fails every open stream between the two hosts at once: both ends see `ECONNRESET`.
    func reset(_ one: String, _ other: String) {
        let pair = HostPair(one, other)
        let hit = ends.values.filter { end in
            !end.isPipe && openEnds.contains(ObjectIdentifier(end)) && HostPair(end.host, end.peer?.host ?? "") == pair
        }.sorted { $0.key < $1.key }
        faults["reset", default: 0] += Set(hit.map { min($0.key, $0.peer?.key ?? $0.key) }).count  // streams
        for end in hit { resetEnd(end) }
    }

    /// One end of a reset stream: what it had on its way is dropped, and its connection fails
    /// with `ECONNRESET`.
    private func resetEnd(_ end: NetworkEnd) {
        end.outgoing.packets.removeAll()
        end.outgoing.bytes = 0
        end.isReset = true
        end.socket?.deliverError(ECONNRESET)
    }

    // MARK: A random fault schedule

    /// Injects faults at random (from the seed) until `until`: resets of one open stream
    /// between `hosts`, and partitions between two of them that heal after about
    /// `partitionDuration` (half to one and a half times it; every partition is healed by
    /// `until`).
    func injectFaults(resetsPerMinute: Double, partitionsPerMinute: Double, partitionDuration: UInt64,
                      junkPerMinute: Double = 0, hosts: [String], until: UInt64)
    {
        let hosts = Array(Set(hosts)).sorted()
        if junkPerMinute > 0 { scheduleRandomJunk(rate: junkPerMinute, hosts: Set(hosts), until: until) }
        if resetsPerMinute > 0 { scheduleRandomReset(rate: resetsPerMinute, hosts: Set(hosts), until: until) }
        if partitionsPerMinute > 0, hosts.count >= 2 {
            scheduleRandomPartition(rate: partitionsPerMinute, duration: partitionDuration, hosts: hosts, until: until)
        }
    }

    /// An exponentially distributed wait for a fault that comes `perMinute` times a minute.
    private func randomWait(perMinute: Double) -> UInt64 {
        UInt64(-log(1 - uniform()) * 60e9 / perMinute) + 1
    }

    private func scheduleRandomReset(rate: Double, hosts: Set<String>, until: UInt64) {
        let at = now &+ randomWait(perMinute: rate)
        guard at < until else { return }
        schedule(at: at) { [unowned self] in
            let candidates = ends.values.filter { end in
                guard !end.isPipe, let peer = end.peer, end.key < peer.key, hosts.contains(end.host), hosts.contains(peer.host)
                else { return false }
                return openEnds.contains(ObjectIdentifier(end)) && openEnds.contains(ObjectIdentifier(peer))
                    && !end.isReset && !peer.isReset
            }.sorted { $0.key < $1.key }
            if !candidates.isEmpty {
                let end = candidates[Int(random.next() % UInt64(candidates.count))]
                faults["reset", default: 0] += 1
                for side in [end, end.peer!] { resetEnd(side) }
            }
            scheduleRandomReset(rate: rate, hosts: hosts, until: until)
        }
    }

    /// Junk: 1 to 64 random bytes (any value: newlines, NULs, invalid UTF-8) slipped into one
    /// direction of an open stream between `hosts`, between two of its segments, as if its
    /// writer had sent them.
    private func scheduleRandomJunk(rate: Double, hosts: Set<String>, until: UInt64) {
        let at = now &+ randomWait(perMinute: rate)
        guard at < until else { return }
        schedule(at: at) { [unowned self] in
            let candidates = ends.values.filter { end in
                guard !end.isPipe, let peer = end.peer, hosts.contains(end.host), hosts.contains(peer.host) else { return false }
                return end.socket != nil && !end.isReset && !end.finSent && !peer.isClosed
            }.sorted { $0.key < $1.key }
            if !candidates.isEmpty {
                let end = candidates[Int(random.next() % UInt64(candidates.count))]
                let junk = (0..<(1 + Int(random.next() % 64))).map { _ in UInt8(truncatingIfNeeded: random.next()) }
                faults["junk", default: 0] += 1
                junkBytes += junk.count
                end.outgoing.packets.append(Packet(kind: .data(junk), arrival: now &+ latency))
                end.outgoing.bytes += junk.count
                scheduleHead(of: end)
            }
            scheduleRandomJunk(rate: rate, hosts: hosts, until: until)
        }
    }

    private func scheduleRandomPartition(rate: Double, duration: UInt64, hosts: [String], until: UInt64) {
        let at = now &+ randomWait(perMinute: rate)
        guard at < until else { return }
        schedule(at: at) { [unowned self] in
            let first = Int(random.next() % UInt64(hosts.count))
            var second = Int(random.next() % UInt64(hosts.count - 1))
            if second >= first { second += 1 }
            let (one, other) = (hosts[first], hosts[second])
            if !isPartitioned(one, other) {
                partition(one, other)
                let length = UInt64(Double(duration) * (0.5 + uniform()))
                schedule(at: min(now &+ max(1, length), until)) { [unowned self] in heal(one, other) }
            }
            scheduleRandomPartition(rate: rate, duration: duration, hosts: hosts, until: until)
        }
    }

    // MARK: Moving bytes

    fileprivate func markDirty(_ end: NetworkEnd) {
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
    fileprivate func sendRemaining(_ bytes: [UInt8], from end: NetworkEnd) {
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
    private func latency(of end: NetworkEnd) -> UInt64 { end.isPipe ? 0 : latency }

    /// Schedules the delivery of `end`'s outgoing head, if not scheduled already.
    private func scheduleHead(of end: NetworkEnd, notBefore: UInt64 = 0) {
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

    // MARK: End-side events

    fileprivate func attached(_ end: NetworkEnd) {
        if end.isReset {
            // Reset before its connection took it (still connecting, or accepted and on its
            // way to a loop): the connection fails at once, as a connect that meets an RST.
            end.socket?.deliverError(ECONNRESET)
            return
        }
        end.wasReading = false
        markDirty(end)
        if let peer = end.peer, peer.outgoing.isStalledOnReader {
            peer.outgoing.isStalledOnReader = false
            scheduleHead(of: peer)
        }
    }

    fileprivate func closed(_ end: NetworkEnd, unreadInput: Bool) {
        // Input left unread (in the socket, or arrived and waiting for it) makes the close a
        // reset, as TCP's does; otherwise the peer reads the end after what was sent.
        let unread = unreadInput || end.peer?.outgoing.isStalledOnReader == true
        if !end.isReset, end.peer != nil {
            if unread {
                if !end.rstSent {
                    end.rstSent = true
                    end.outgoing.packets.append(Packet(kind: .reset, arrival: now &+ latency(of: end)))
                }
            } else if !end.finSent {
                end.finSent = true
                end.outgoing.packets.append(Packet(kind: .end, arrival: now &+ latency(of: end)))
            }
            scheduleHead(of: end)
        }
        if let peer = end.peer, peer.outgoing.isStalledOnReader {
            // What waited for this reader now meets a closed end (and gets a reset back).
            peer.outgoing.isStalledOnReader = false
            scheduleHead(of: peer)
        }
        ended(end)
    }

    private func armReadTimeout(_ end: NetworkEnd) {
        guard let timeout = end.readTimeout, !end.readCheckScheduled else { return }
        end.readCheckScheduled = true
        schedule(at: end.lastRead &+ timeout) { [unowned self] in
            end.readCheckScheduled = false
            guard let socket = end.socket, let timeout = end.readTimeout, socket.isReading else { return }
            if now >= end.lastRead &+ timeout {
                end.wasReading = false
                socket.deliverTimeout(reading: true)
            } else {
                armReadTimeout(end)
            }
        }
    }

    private func armWriteTimeout(_ end: NetworkEnd) {
        guard let timeout = end.writeTimeout, !end.writeCheckScheduled else { return }
        end.writeCheckScheduled = true
        schedule(at: end.lastWrite &+ timeout) { [unowned self] in
            end.writeCheckScheduled = false
            guard let socket = end.socket, let timeout = end.writeTimeout, socket.isWritePending else { return }
            if now >= end.lastWrite &+ timeout {
                socket.deliverTimeout(reading: false)
            } else {
                armWriteTimeout(end)
            }
        }
    }

    fileprivate func timeoutsChanged(_ end: NetworkEnd) {
        end.lastRead = now
        end.lastWrite = now
        if end.socket?.isReading == true { armReadTimeout(end) }
        if end.socket?.isWritePending == true { armWriteTimeout(end) }
    }

    /// Open streams and listeners, for a deadlock report.
    var summary: String? {
        let streams = openEnds.count
        let listening = listeners.count
        let bound = datagramPorts.count
        guard streams + listening + bound > 0 else { return nil }
        var parts = ["\(streams) open stream end\(streams == 1 ? "" : "s")", "\(listening) listener\(listening == 1 ? "" : "s")"]
        if bound > 0 { parts.append("\(bound) UDP port\(bound == 1 ? "" : "s")") }
        return "network: " + parts.joined(separator: ", ")
    }
}

/// A host address and a port.
struct HostPort: Hashable {
    let host: String
    let port: UInt16
}

/// Two hosts, unordered.
struct HostPair: Hashable {
    let low: String
    let high: String
    init(_ one: String, _ other: String) {
        (low, high) = one <= other ? (one, other) : (other, one)
    }
}

/// What travels on a direction of a stream.
struct Packet {
    enum Kind {
        case data([UInt8])
        /// The sender's end of the stream (a FIN).
        case end
        /// A reset (an RST).
        case reset
    }
    var kind: Kind
    var arrival: UInt64
}

/// One direction of a stream: what is on its way or waits for the reader.
final class Direction {
    var packets: [Packet] = []
    /// Data bytes in `packets` (bounded by the window).
    var bytes = 0
    var isHeadScheduled = false
    var isStalledOnReader = false
    var isStalledByPartition = false
}

/// One end of a simulated stream: the network's side of a connection's socket.
final class NetworkEnd: SimulatedStreamEnd {
    unowned let network: NetworkCore
    let host: String
    let port: UInt16
    /// Orders this end's deliveries against others' at one instant (from the seed).
    let key: UInt64
    /// Whether the stream is a pipe to a simulated program (`makePipe`): no latency, no faults.
    let isPipe: Bool
    /// The other end (cleared once both are closed).
    var peer: NetworkEnd?
    let outgoing = Direction()
    private(set) var socket: SimulatedSocket?
    private(set) var isClosed = false
    var isDirty = false
    var isWriteShut = false
    var finSent = false
    var rstSent = false
    var isReset = false
    var wasReading = false
    var readTimeout: UInt64?
    var writeTimeout: UInt64?
    var lastRead: UInt64 = 0
    var lastWrite: UInt64 = 0
    var readCheckScheduled = false
    var writeCheckScheduled = false

    init(network: NetworkCore, host: String, port: UInt16, key: UInt64, isPipe: Bool = false) {
        self.network = network
        self.host = host
        self.port = port
        self.key = key
        self.isPipe = isPipe
    }

    func attach(_ socket: SimulatedSocket) {
        guard !isClosed else { return }
        self.socket = socket
        network.attached(self)
    }

    func socketChanged() { network.markDirty(self) }

    func socketShutdownWrite(remainingOutput: [UInt8]) {
        if !remainingOutput.isEmpty, !isReset, peer != nil { network.sendRemaining(remainingOutput, from: self) }
        isWriteShut = true
        network.markDirty(self)
    }

    func socketClosed(unreadInput: Bool) {
        guard !isClosed else { return }
        isClosed = true
        socket = nil
        network.closed(self, unreadInput: unreadInput)
    }

    func socketClosed(unreadInput: Bool, remainingOutput: [UInt8]) {
        guard !isClosed else { return }
        if !remainingOutput.isEmpty, !isReset, peer != nil { network.sendRemaining(remainingOutput, from: self) }
        socketClosed(unreadInput: unreadInput)
    }

    func socketSetTimeouts(read: UInt64?, write: UInt64?) {
        readTimeout = read
        writeTimeout = write
        network.timeoutsChanged(self)
    }
}

/// A connect on its way: finished once (connected, refused, timed out).
final class ConnectAttempt {
    let from: String
    let port: UInt16
    let to: String
    let address: SocketAddress
    private var done: ((Result<any SimulatedStreamEnd, EventLoopError>) -> Void)?

    init(from: String, port: UInt16, to: String, address: SocketAddress,
         done: @escaping (Result<any SimulatedStreamEnd, EventLoopError>) -> Void)
    {
        self.from = from
        self.port = port
        self.to = to
        self.address = address
        self.done = done
    }

    var isFinished: Bool { done == nil }

    func finish(_ result: Result<any SimulatedStreamEnd, EventLoopError>, network: NetworkCore) {
        guard let done else { return }
        self.done = nil
        done(result)
    }
}

/// A listening port of the simulated network.
final class NetworkListener: SimulatedListening {
    unowned let network: NetworkCore
    let key: HostPort
    let backlog: Int
    private let accepted: (any SimulatedStreamEnd, String) -> Void
    private var isAccepting = true
    private var waiting: [(NetworkEnd, String)] = []
    private var isClosed = false

    /// A Unix listener's path (nil: a TCP listener).
    let name: String?

    init(network: NetworkCore, key: HostPort, backlog: Int, accepted: @escaping (any SimulatedStreamEnd, String) -> Void,
         name: String? = nil)
    {
        self.network = network
        self.key = key
        self.backlog = backlog
        self.accepted = accepted
        self.name = name
    }

    var port: UInt16 { key.port }
    var localAddress: String { name ?? "\(key.host):\(key.port)" }

    /// Whether a new connection fits (accepting, or room in the backlog).
    var hasRoom: Bool { !isClosed && (isAccepting || waiting.count < backlog) }

    func enqueue(_ end: NetworkEnd, peer: String) {
        if isAccepting {
            accepted(end, peer)
        } else {
            waiting.append((end, peer))
        }
    }

    func setAccepting(_ accepting: Bool) {
        isAccepting = accepting
        while isAccepting, !isClosed, !waiting.isEmpty {
            let (end, peer) = waiting.removeFirst()
            accepted(end, peer)
        }
    }

    func close() {
        guard !isClosed else { return }
        isClosed = true
        network.removeListener(self)
        let left = waiting
        waiting = []
        for (end, _) in left { end.socketClosed(unreadInput: true) }  // the client sees a reset
    }
}

/// A network event: `action` at `time`; at one instant, by `key` (from the seed), then in the
/// order scheduled.
struct NetworkEvent {
    let time: UInt64
    let key: UInt64
    let sequence: UInt64
    let action: () -> Void

    func precedes(_ other: NetworkEvent) -> Bool {
        (time, key, sequence) < (other.time, other.key, other.sequence)
    }
}

/// A binary min-heap of network events.
struct EventHeap {
    private var items: [NetworkEvent] = []

    var first: NetworkEvent? { items.first }
    var count: Int { items.count }

    mutating func insert(_ event: NetworkEvent) {
        items.append(event)
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard items[child].precedes(items[parent]) else { break }
            items.swapAt(child, parent)
            child = parent
        }
    }

    mutating func removeFirst() -> NetworkEvent {
        let top = items[0]
        let last = items.removeLast()
        if !items.isEmpty {
            items[0] = last
            var parent = 0
            while true {
                let left = 2 * parent + 1
                let right = left + 1
                var smallest = parent
                if left < items.count, items[left].precedes(items[smallest]) { smallest = left }
                if right < items.count, items[right].precedes(items[smallest]) { smallest = right }
                if smallest == parent { break }
                items.swapAt(parent, smallest)
                parent = smallest
            }
        }
        return top
    }
}
