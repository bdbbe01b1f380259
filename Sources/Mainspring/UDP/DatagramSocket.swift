/// One UDP datagram: what ``DatagramSocket`` receives (with its sender) and what it sends (with
/// its destination, or none for a connected socket's peer).
///
/// A value: any thread; costs its bytes.
public struct Datagram: Sendable, Hashable {
    /// The payload: all of it, or, when ``isTruncated``, the first
    /// ``DatagramSocket/Options/maximumDatagramSize`` bytes of it. May be empty (UDP allows
    /// zero-length datagrams).
    public var bytes: [UInt8]
    /// Received: the sender. To send: the destination, or nil for the socket's connected peer.
    public var address: SocketAddress?
    /// Received: whether the datagram was longer than the receive size and cut to it (the
    /// kernel's `MSG_TRUNC`). The rest is lost — UDP cannot read it later.
    public var isTruncated: Bool
    /// Received: the datagram's length as sent (more than `bytes.count` when truncated).
    public var length: Int

    /// A datagram to send: `bytes` to `address` (nil: the connected peer).
    public init(_ bytes: [UInt8], to address: SocketAddress? = nil) {
        self.bytes = bytes
        self.address = address
        self.isTruncated = false
        self.length = bytes.count
    }

    init(received bytes: [UInt8], from sender: SocketAddress?, isTruncated: Bool, length: Int) {
        self.bytes = bytes
        self.address = sender
        self.isTruncated = isTruncated
        self.length = length
    }
}

/// What a ``DatagramSocket`` reports: a datagram, or an error the socket met and survived.
public enum DatagramEvent: Sendable, Hashable {
    /// A datagram, in the order the kernel delivered it.
    case datagram(Datagram)
    /// A receive or a queued send failed with this `errno`; the socket stays open. On a
    /// connected socket `ECONNREFUSED` is the peer's ICMP port-unreachable answer to an earlier
    /// datagram; a queued datagram that failed (EMSGSIZE over a smaller path MTU, say) was
    /// dropped.
    case error(errno: Int32)
}

/// A UDP socket on one loop: IPv4 or IPv6, bound, optionally connected. Datagrams come in as a
/// callback (``onReceive(_:)``) or an async sequence (`datagrams()`), read in batches of
/// ``Options/receiveBatchSize`` with one `recvmmsg(2)` each; they go out with ``trySend(_:)``
/// (loop thread, never blocks: an outcome says whether the kernel took it, queued it, or
/// refused it because the queue is full) or ``send(_:)`` (async, any task: suspends while the
/// queue is full), queued datagrams leaving in batches with one `sendmmsg(2)` each.
///
/// ```swift
/// let socket = try DatagramSocket(bindingTo: "::", port: 5353, on: loop)
/// try socket.onReceive { event in
///     if case .datagram(let datagram) = event { _ = try? socket.trySend(Datagram(datagram.bytes, to: datagram.address)) }
/// }
/// ```
///
/// **Fairness.** Input like any other: the socket's handler runs at ``Options/priority``
/// (`.input`), and one readiness handles at most ``Options/maximumDatagramsPerWakeup``
/// datagrams before the loop polls again, so a flood waits its turn behind timers and other
/// sockets instead of starving them (the poll-interval rule).
///
/// **Memory.** The receive buffers are `maximumDatagramSize × receiveBatchSize` bytes (256 KiB
/// by default), allocated once; the send queue holds at most ``Options/sendQueueLimit``
/// datagrams — never more.
///
/// **Threads.** The handle is `Sendable`; its synchronous members are for the loop's thread
/// (they throw `.wrongThread` elsewhere), its async ones hop there. The loop keeps the socket
/// open until `close()` (dropping the handle does not close it) or the loop's shutdown.
public final class DatagramSocket: Sendable {
    /// How a socket is made and how it reads and queues.
    public struct Options: Sendable {
        /// The largest datagram received whole, in bytes; longer ones are cut and reported
        /// ``Datagram/isTruncated``. 8,192 by default (raise it to 65,527 for any datagram).
        public var maximumDatagramSize: Int = 8_192
        /// Datagrams read per `recvmmsg(2)` (1–64). 32 by default.
        public var receiveBatchSize: Int = 32
        /// Datagrams handled per readiness before the loop polls again (the fairness bound).
        /// 64 by default.
        public var maximumDatagramsPerWakeup: Int = 64
        /// Datagrams that may wait for room in the kernel's send buffer; beyond it
        /// ``DatagramSocket/trySend(_:)`` answers ``SendOutcome/queueFull`` and
        /// ``DatagramSocket/send(_:)`` suspends. 1,024 by default.
        public var sendQueueLimit: Int = 1_024
        /// `SO_BROADCAST`: whether datagrams may go to a broadcast address (otherwise the kernel
        /// refuses them with EACCES). Off by default.
        public var allowsBroadcast: Bool = false
        /// `SO_REUSEADDR`: lets several sockets bind one multicast port. Off by default.
        public var reusesAddress: Bool = false
        /// `SO_RCVBUF`, in bytes (the kernel doubles it and caps it at `rmem_max`); nil keeps
        /// the system's default.
        public var receiveBufferSize: Int?
        /// `SO_SNDBUF`, in bytes; nil keeps the system's default.
        public var sendBufferSize: Int?
        /// Where the socket's handler runs. `.input` by default.
        public var priority: Priority = .input

        public init() {}
    }

    /// What ``DatagramSocket/trySend(_:)`` did with a datagram.
    public enum SendOutcome: Sendable, Hashable {
        /// The kernel took it.
        case sent
        /// The kernel's buffer was full (or earlier datagrams wait): it is queued and leaves in
        /// order when there is room.
        case queued
        /// The queue holds ``Options/sendQueueLimit`` datagrams: this one was not taken. Try
        /// again later (``DatagramSocket/send(_:)`` waits for room).
        case queueFull
    }

    /// Counters of a socket's traffic (loop thread).
    public struct Statistics: Sendable, Hashable {
        /// Datagrams received and reported.
        public var datagramsReceived = 0
        /// `recvmmsg(2)` calls that returned datagrams.
        public var receiveBatches = 0
        /// Datagrams reported truncated.
        public var datagramsTruncated = 0
        /// Datagrams the kernel took.
        public var datagramsSent = 0
        /// `sendmmsg(2)` calls that sent datagrams.
        public var sendBatches = 0
        /// Times a datagram had to be queued because the kernel's buffer was full.
        public var sendsQueued = 0
    }

    /// The loop the socket belongs to.
    public let loop: EventLoop
    /// The address the socket is bound to (with the port the kernel chose for port 0).
    public let localAddress: SocketAddress
    private let state: UncheckedResult<DatagramSource>

    /// The loop side (tests reach its seams through it).
    var source: DatagramSource { state.value }

    /// A UDP socket bound to `host` and `port` on `loop`. `host` is an IPv4 or IPv6 literal
    /// (`"0.0.0.0"`, `"::"` — dual-stack, `"127.0.0.1"`, `"::1"`), `"localhost"` (127.0.0.1) or
    /// a name (its first address, looked up once, blocking, on the calling thread); port 0 lets
    /// the kernel choose (read ``localAddress``). Datagrams wait in the kernel until
    /// ``onReceive(_:)`` or `datagrams()` starts reading. Loop thread only.
    /// - Throws: `.wrongThread`, `.invalidAddress`, `.hostNotFound`, `.system` (the `bind`'s
    ///   errno: EADDRINUSE, EACCES…), `.libevent`.
    public init(bindingTo host: String, port: UInt16, on loop: EventLoop, options: Options = Options())
        throws(EventLoopError)
    {
        guard loop.claimThread() else { throw .wrongThread(function: "DatagramSocket.init(bindingTo:port:on:options:)") }
        let address = try listeningAddress(for: host, port: port)
        let fd: Int32
        switch bindDatagramSocket(address, reusesAddress: options.reusesAddress, allowsBroadcast: options.allowsBroadcast,
                                  receiveBufferSize: options.receiveBufferSize, sendBufferSize: options.sendBufferSize)
        {
        case .success(let made): fd = made
        case .failure(let error): throw error
        }
        self.loop = loop
        self.localAddress = boundAddress(of: fd) ?? address
        self.state = UncheckedResult(try DatagramSource(loop: loop, fd: fd, family: address.family, options: options))
    }

    /// `init(bindingTo:port:on:options:)` from any task: makes the socket on `loop` (no hop from
    /// a task already on it).
    public static func bind(to host: String, port: UInt16, on loop: EventLoop, options: Options = Options())
        async throws(EventLoopError) -> DatagramSocket
    {
        try await loop.onLoop { () throws(EventLoopError) in
            try DatagramSocket(bindingTo: host, port: port, on: loop, options: options)
        }
    }

    /// Connects the socket to `address` (`connect(2)`, which sends nothing): datagrams without
    /// an address go there, only its datagrams are received, and an ICMP port-unreachable from
    /// it is reported (``DatagramEvent/error(errno:)`` with ECONNREFUSED). Loop thread only.
    /// - Throws: `.wrongThread`, `.socketClosed`, `.system` with the connect's errno.
    public func connect(to address: SocketAddress) throws(EventLoopError) {
        try checkUsable("DatagramSocket.connect(to:)")
        let code = connectDatagramSocket(source.fd, to: address)
        guard code == 0 else { throw .system(function: "connect \(address)", errno: code) }
        source.peer = address
    }

    /// The peer given to ``connect(to:)``, if any. Loop thread only.
    public var connectedPeer: SocketAddress? {
        loop.preconditionOnLoop("DatagramSocket.connectedPeer")
        return source.peer
    }

    /// Calls `handler` on the loop, at ``Options/priority``, for each datagram and each error
    /// met, until `close()`. One consumer per socket: either this or `datagrams()`. Loop
    /// thread only.
    /// - Throws: `.wrongThread`, `.socketClosed`, `.libevent`; a precondition failure when the
    ///   socket already has a consumer.
    public func onReceive(_ handler: @escaping (DatagramEvent) -> Void) throws(EventLoopError) {
        try checkUsable("DatagramSocket.onReceive(_:)")
        try source.startReading(handler)
    }

    /// The datagrams (and errors) as an async sequence, ending (`nil`) when the socket
    /// closes. Reading pauses while ``Options/maximumDatagramsPerWakeup`` events wait for the
    /// consumer (the kernel's buffer then fills and drops, as UDP does). One consumer per
    /// socket; cancelling the iterating task ends the sequence but leaves the socket open. Loop
    /// thread only (the async overload works from any task).
    /// - Throws: `.wrongThread`, `.socketClosed`, `.libevent`.
    public func datagrams() throws(EventLoopError) -> Datagrams {
        try checkUsable("DatagramSocket.datagrams()")
        let feed = LoopFeed<DatagramEvent>(loop: loop, bound: max(1, source.options.maximumDatagramsPerWakeup))
        let source = self.source
        try source.startReading { [weak feed] event in feed?.yield(event) }
        feed.attach(source: PassiveSource(loop: loop, priority: .input), pause: { [weak source] in source?.pauseReading() },
                    resume: { [weak source] in source?.resumeReading() })
        source.onClosed = { [weak feed] in feed?.finish() }
        return Datagrams(feed: feed)
    }

    /// `datagrams()` from any task.
    public nonisolated(nonsending) func datagrams() async throws(EventLoopError) -> Datagrams {
        try await loop.onLoop { () throws(EventLoopError) in try self.datagrams() }
    }

    /// Sends `datagram` without blocking: to the kernel at once when nothing waits before it
    /// (one `sendmmsg(2)`), otherwise into the bounded send queue. Loop thread only.
    /// - Returns: ``SendOutcome/sent``, ``SendOutcome/queued``, or ``SendOutcome/queueFull``
    ///   (not taken).
    /// - Throws: `.datagramTooLarge` for a payload over the family's UDP limit (65,507 bytes for
    ///   IPv4) or one the kernel refuses with EMSGSIZE; `.invalidAddress` for a datagram without
    ///   an address on an unconnected socket or one of the other family on an IPv4 socket;
    ///   `.socketClosed`; `.wrongThread`; `.system` with the send's errno (EACCES for a
    ///   broadcast address without ``Options/allowsBroadcast``, ECONNREFUSED for a connected
    ///   peer that answered port-unreachable).
    public func trySend(_ datagram: Datagram) throws(EventLoopError) -> SendOutcome {
        try checkUsable("DatagramSocket.trySend(_:)")
        return try source.trySend(datagram)
    }

    /// Sends `datagrams` in order, without blocking, in batches of up to 64 per `sendmmsg(2)`:
    /// how many were taken (sent or queued) — fewer than given once the queue is full; the rest
    /// were not taken. Loop thread only. Throws like ``trySend(_:)`` for the first datagram
    /// that fails (those before it were taken).
    public func trySend(contentsOf datagrams: [Datagram]) throws(EventLoopError) -> Int {
        try checkUsable("DatagramSocket.trySend(contentsOf:)")
        return try source.trySend(contentsOf: datagrams[...])
    }

    /// Sends `datagram`, suspending while the send queue is full; returns once it is sent or
    /// queued (in order with other senders). Any task.
    /// - Throws: like ``trySend(_:)``; `.socketClosed` when the socket closes while it waits.
    public nonisolated(nonsending) func send(_ datagram: Datagram) async throws(EventLoopError) {
        let state = self.state
        let result: Result<Void, EventLoopError> = await withUnsafeContinuation { continuation in
            loop.executeNowOrPost {
                state.value.send(datagram, resuming: continuation)
            } orElse: {
                continuation.resume(returning: .failure(.loopClosed))
            }
        }
        try result.get()
    }

    /// Sends each of `datagrams` in order, suspending while the send queue is full.
    public nonisolated(nonsending) func send(contentsOf datagrams: [Datagram]) async throws(EventLoopError) {
        for datagram in datagrams { try await send(datagram) }
    }

    /// Joins the multicast `group` (an IPv4 or IPv6 multicast literal such as "239.1.2.3" or
    /// "ff02::1:3") on the interface named `interface` ("eth0"; nil lets the kernel pick), so
    /// that its datagrams to this socket's port arrive. Loop thread only.
    /// - Throws: `.invalidAddress` for an address that is not multicast or an unknown
    ///   interface; `.system` (EADDRINUSE: already joined); `.wrongThread`; `.socketClosed`.
    public func joinMulticastGroup(_ group: String, interface: String? = nil) throws(EventLoopError) {
        try checkUsable("DatagramSocket.joinMulticastGroup(_:interface:)")
        try changeMembership(group, interface: interface, join: true)
    }

    /// Leaves a group joined with ``joinMulticastGroup(_:interface:)``. Loop thread only.
    /// - Throws: like ``joinMulticastGroup(_:interface:)`` (EADDRNOTAVAIL: not joined).
    public func leaveMulticastGroup(_ group: String, interface: String? = nil) throws(EventLoopError) {
        try checkUsable("DatagramSocket.leaveMulticastGroup(_:interface:)")
        try changeMembership(group, interface: interface, join: false)
    }

    /// The socket's counters (receive and send batches among them). Loop thread only.
    public var statistics: Statistics {
        loop.preconditionOnLoop("DatagramSocket.statistics")
        return source.statistics
    }

    /// Datagrams waiting in the send queue. Loop thread only.
    public var queuedDatagrams: Int {
        loop.preconditionOnLoop("DatagramSocket.queuedDatagrams")
        return source.queue.count
    }

    /// Whether the socket is closed (by `close()` or the loop's shutdown). Loop thread only.
    public var isClosed: Bool {
        loop.preconditionOnLoop("DatagramSocket.isClosed")
        return source.isClosed
    }

    /// Closes the socket: no handler runs after this returns, the sequence ends, queued
    /// datagrams are dropped and waiting ``send(_:)`` calls throw `.socketClosed`. Idempotent.
    /// Loop thread only.
    public func close() {
        loop.preconditionOnLoop("DatagramSocket.close()")
        source.close()
    }

    /// `close()` from any task.
    public nonisolated(nonsending) func close() async {
        let state = self.state
        // `try?`: `onLoop` fails only when the loop has shut down, which closed the socket already.
        _ = try? await loop.onLoop { state.value.close() }
    }

    private func checkUsable(_ function: String) throws(EventLoopError) {
        guard loop.claimThread() else { throw .wrongThread(function: function) }
        guard !source.isClosed else { throw .socketClosed }
    }

    private func changeMembership(_ group: String, interface: String?, join: Bool) throws(EventLoopError) {
        guard let address = numericAddress(group, port: 0), isMulticast(address) else {
            throw .invalidAddress("\(group) (not a multicast address)")
        }
        var index: UInt32 = 0
        if let interface {
            guard let found = interfaceIndex(named: interface) else { throw .invalidAddress("\(interface) (no such interface)") }
            index = found
        }
        let code = changeMulticastMembership(source.fd, group: address, interfaceIndex: index, join: join)
        guard code == 0 else {
            throw .system(function: "\(join ? "join" : "leave") multicast group \(group)", errno: code)
        }
    }

    /// `datagrams()`: an `AsyncSequence` of ``DatagramEvent``s.
    public struct Datagrams: AsyncSequence, Sendable {
        public typealias Element = DatagramEvent
        public typealias Failure = Never
        let feed: LoopFeed<DatagramEvent>

        public func makeAsyncIterator() -> Iterator {
            feed.claim("DatagramSocket.datagrams()")
            return Iterator(feed: feed)
        }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let feed: LoopFeed<DatagramEvent>

            public nonisolated(nonsending) mutating func next() async -> DatagramEvent? { await feed.next() }

            /// `next()`, on the caller's executor (see `Connection.Lines.Iterator`).
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async -> DatagramEvent? {
                await feed.next()
            }
        }
    }
}

/// A source that only stands for the datagram sequence in its feed: cancelling the sequence
/// closes it, which ends nothing else (the socket stays open).
private final class PassiveSource: Source {}

/// The loop side of a `DatagramSocket`: the descriptor, its read and write events, the
/// receive buffers and the bounded send queue. Loop thread only.
final class DatagramSource: Source {
    let fd: Int32
    let family: SocketAddress.Family
    let options: DatagramSocket.Options
    var peer: SocketAddress?
    var statistics = DatagramSocket.Statistics()
    var onClosed: (() -> Void)?
    private(set) var queue: [Datagram] = []
    private var queueStart = 0
    private var handler: ((DatagramEvent) -> Void)?
    private var receiveBuffers: DatagramReceiveBuffers?
    private var isReadingPaused = false
    private var writeEvent: NativeEvent?
    private var isWriteArmed = false
    /// `send(_:)` calls waiting for room in the queue, in order.
    private var waitingSenders: [(Datagram, UnsafeContinuation<Result<Void, EventLoopError>, Never>)] = []

    init(loop: EventLoop, fd: Int32, family: SocketAddress.Family, options: DatagramSocket.Options) throws(EventLoopError) {
        self.fd = fd
        self.family = family
        self.options = options
        super.init(loop: loop, priority: options.priority)
        do {
            writeEvent = try NativeEvent(base: loop.base, fd: fd, readiness: .write, persistent: true, target: self)
        } catch {
            close()
            throw error
        }
    }

    override var keepsFiring: Bool { true }

    var pendingCount: Int { queue.count - queueStart }

    func startReading(_ handler: @escaping (DatagramEvent) -> Void) throws(EventLoopError) {
        requireUsage(self.handler == nil, "Mainspring: DatagramSocket: the socket already has a consumer (onReceive or datagrams)")
        let event = try NativeEvent(base: loop.base, fd: fd, readiness: .read, persistent: true, target: self)
        try event.add()
        native = event
        self.handler = handler
        receiveBuffers = DatagramReceiveBuffers(size: options.maximumDatagramSize, batch: options.receiveBatchSize)
    }

    func pauseReading() {
        guard !isReadingPaused else { return }
        isReadingPaused = true
        native?.delete()
    }

    func resumeReading() {
        guard isReadingPaused, !isClosed else { return }
        isReadingPaused = false
        resumeNative()
    }

    override func resumeNative() {
        guard !isReadingPaused else { return }
        super.resumeNative()
    }

    override func perform(_ readiness: Readiness) {
        if readiness.contains(.write) { flushQueue() }
        if readiness.contains(.read) { receive() }
    }

    /// Up to `maximumDatagramsPerWakeup` datagrams, in batches; the rest wait for the next
    /// poll (the event is level-triggered).
    private func receive() {
        guard let buffers = receiveBuffers else { return }
        var handled = 0
        let limit = max(1, options.maximumDatagramsPerWakeup)
        while handled < limit, !isClosed, !isReadingPaused {
            let wanted = min(buffers.batch, limit - handled)
            switch buffers.receive(fd, limit: wanted) {
            case .done(let count):
                statistics.receiveBatches += 1
                statistics.datagramsReceived += count
                for index in 0..<count {
                    let (bytes, isTruncated, length, sender) = buffers.datagram(at: index)
                    if isTruncated { statistics.datagramsTruncated += 1 }
                    handler?(.datagram(Datagram(received: bytes, from: sender, isTruncated: isTruncated, length: length)))
                    if isClosed { return }
                }
                handled += count
                if count < wanted { return }
            case .wouldBlock:
                return
            case .failed(let code):
                handler?(.error(errno: code))
                handled += 1
            }
        }
    }

    func trySend(_ datagram: Datagram) throws(EventLoopError) -> DatagramSocket.SendOutcome {
        try check(datagram)
        if pendingCount > 0 {
            guard pendingCount < max(1, options.sendQueueLimit) else { return .queueFull }
            enqueue(datagram)
            return .queued
        }
        switch sendBatch([datagram][...]) {
        case .done:
            statistics.datagramsSent += 1
            statistics.sendBatches += 1
            return .sent
        case .wouldBlock:
            enqueue(datagram)
            return .queued
        case .failed(let code):
            throw sendError(code, datagram)
        }
    }

    func trySend(contentsOf datagrams: ArraySlice<Datagram>) throws(EventLoopError) -> Int {
        var rest = datagrams
        while let first = rest.first, pendingCount == 0 {
            // Straight to the kernel, a batch at a time, while it takes them.
            var batch = rest.prefix(64)
            for (offset, datagram) in batch.enumerated() {
                do throws(EventLoopError) {
                    try check(datagram)
                } catch {
                    if offset == 0 { throw error }
                    batch = batch.prefix(offset)
                    break
                }
            }
            switch sendBatch(batch) {
            case .done(let count):
                statistics.datagramsSent += count
                statistics.sendBatches += 1
                rest = rest.dropFirst(count)
            case .wouldBlock:
                enqueue(first)
                rest = rest.dropFirst()
            case .failed(let code):
                if rest.startIndex > datagrams.startIndex { return rest.startIndex - datagrams.startIndex }
                throw sendError(code, first)
            }
        }
        var taken = rest.startIndex - datagrams.startIndex
        for datagram in rest {
            let outcome: DatagramSocket.SendOutcome
            do throws(EventLoopError) {
                outcome = try trySend(datagram)
            } catch {
                if taken == 0 { throw error }
                return taken
            }
            if outcome == .queueFull { break }
            taken += 1
        }
        return taken
    }

    /// Tests: the next this many send calls find the kernel's buffer full (loopback UDP never
    /// fills it: a datagram leaves the sender's buffer as soon as it is delivered or dropped).
    var injectedFullBuffers = 0

    private func sendBatch(_ datagrams: ArraySlice<Datagram>) -> DatagramCallResult {
        if injectedFullBuffers > 0 {
            injectedFullBuffers -= 1
            return .wouldBlock
        }
        return sendDatagramBatch(fd, datagrams)
    }

    func send(_ datagram: Datagram, resuming continuation: UnsafeContinuation<Result<Void, EventLoopError>, Never>) {
        guard !isClosed else { return continuation.resume(returning: .failure(.socketClosed)) }
        if waitingSenders.isEmpty {
            do throws(EventLoopError) {
                if try trySend(datagram) != .queueFull { return continuation.resume(returning: .success(())) }
            } catch {
                return continuation.resume(returning: .failure(error))
            }
        }
        waitingSenders.append((datagram, continuation))
    }

    private func check(_ datagram: Datagram) throws(EventLoopError) {
        if datagram.bytes.count > maximumUDPPayload(family) {
            throw .datagramTooLarge(size: datagram.bytes.count, limit: maximumUDPPayload(family))
        }
        if let address = datagram.address {
            if family == .ipv4 && address.family == .ipv6 {
                throw .invalidAddress("\(address) (an IPv6 destination for an IPv4 socket)")
            }
        } else if peer == nil {
            throw .invalidAddress("a datagram without a destination on a socket that is not connected")
        }
    }

    private func sendError(_ code: Int32, _ datagram: Datagram) -> EventLoopError {
        if isMessageTooLarge(code) { return .datagramTooLarge(size: datagram.bytes.count, limit: nil) }
        return .system(function: "sendmmsg to \(datagram.address.map(\.description) ?? peer.map(\.description) ?? "peer")",
                       errno: code)
    }

    private func enqueue(_ datagram: Datagram) {
        statistics.sendsQueued += 1
        queue.append(datagram)
        armWrite()
    }

    private func armWrite() {
        guard !isWriteArmed, let writeEvent else { return }
        do {
            try writeEvent.add()
            isWriteArmed = true
        } catch {
            registrationFailed(error)
        }
    }

    /// Sends queued datagrams, a batch per `sendmmsg`, while the kernel takes them; then lets
    /// waiting senders in.
    private func flushQueue() {
        while pendingCount > 0, !isClosed {
            switch sendBatch(queue[queueStart...]) {
            case .done(let count):
                statistics.datagramsSent += count
                statistics.sendBatches += 1
                queueStart += count
            case .wouldBlock:
                admitWaitingSenders()
                return
            case .failed(let code):
                queueStart += 1  // dropped, and reported
                handler?(.error(errno: code))
            }
        }
        queue.removeAll(keepingCapacity: queue.capacity <= 1_024)
        queueStart = 0
        if isWriteArmed {
            writeEvent?.delete()
            isWriteArmed = false
        }
        admitWaitingSenders()
    }

    private func admitWaitingSenders() {
        if queueStart > 256, queueStart * 2 > queue.count {
            queue.removeFirst(queueStart)
            queueStart = 0
        }
        while !waitingSenders.isEmpty, !isClosed {
            let (datagram, continuation) = waitingSenders[0]
            let outcome: DatagramSocket.SendOutcome
            do throws(EventLoopError) {
                outcome = try trySend(datagram)
            } catch {
                waitingSenders.removeFirst()
                continuation.resume(returning: .failure(error))
                continue
            }
            if outcome == .queueFull { return }
            waitingSenders.removeFirst()
            withLoop { $0.resumingInput { continuation.resume(returning: .success(())) } }
        }
    }

    override func didClose() {
        writeEvent?.delete()
        writeEvent = nil
        handler = nil
        queue = []
        queueStart = 0
        let senders = waitingSenders
        waitingSenders = []
        for (_, continuation) in senders { continuation.resume(returning: .failure(.socketClosed)) }
        closeDescriptor(fd)
        let onClosed = self.onClosed
        self.onClosed = nil
        onClosed?()
    }
}
