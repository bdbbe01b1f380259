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
/// (they throw `.loop(.wrongThread)` elsewhere), its async ones hop there.
///
/// **Lifetime.** The library's rule for handles: dropping the last handle ends nothing that can
/// still run. A socket with a consumer (``onReceive(_:)`` or a `datagrams()` sequence) stays
/// open until `close()`, its consumer's end or the loop's shutdown; one with neither — nothing
/// could ever read it again — closes when its last handle goes, as `close()` closes it.
///
/// **In a simulation.** On a simulated loop (`MainspringTesting`) the socket is a UDP port of
/// the simulation's network, on the loop's host: no descriptor, datagrams on virtual time, lost,
/// duplicated or reordered as the network's settings and seed decide; the rest of this type —
/// its queue, consumers, truncation, statistics — is the same code. Multicast is refused there.
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
    private let state: LoopBound<DatagramSource>

    /// The loop side (tests reach its seams through it).
    var source: DatagramSource { state.value }

    deinit {
        // Posted, even on the loop's thread: the handle may go in the middle of the source's
        // own work (a handler that captured it being released).
        let state = self.state
        loop.execute { state.value.handleReleased() }
    }

    /// A UDP socket bound to `host` and `port` on `loop`. `host` is an IPv4 or IPv6 literal
    /// (`"0.0.0.0"`, `"::"` — dual-stack, `"127.0.0.1"`, `"::1"`) or `"localhost"` (127.0.0.1);
    /// a host name is refused (`.loop(.bindNeedsAddress)`: resolving it here would block the loop —
    /// resolve it first with ``EventLoop/resolve(_:port:timeout:)``); port 0 lets
    /// the kernel choose (read ``localAddress``). Datagrams wait in the kernel until
    /// ``onReceive(_:)`` or `datagrams()` starts reading. Loop thread only.
    /// - Throws: ``DatagramError/invalidAddress(_:)``, `.system` (the `bind`'s errno:
    ///   EADDRINUSE, EACCES…), `.loop` (`.wrongThread`, `.bindNeedsAddress`, `.libevent`).
    public convenience init(bindingTo host: String, port: UInt16, on loop: EventLoop, options: Options = Options())
        throws(DatagramError)
    {
        do throws(EventLoopError) {
            try self.init(binding: host, port: port, on: loop, options: options)
        } catch {
            throw DatagramError(error)
        }
    }

    /// `init(bindingTo:port:on:options:)` in the loop's terms.
    private init(binding host: String, port: UInt16, on loop: EventLoop, options: Options) throws(EventLoopError) {
        guard loop.claimThread() else { throw .wrongThread(function: "DatagramSocket.init(bindingTo:port:on:options:)") }
        let address = try listeningAddress(for: host, port: port)
        let (source, bound) = try loop.world.bindDatagram(address, port: port, on: loop, options: options)
        self.loop = loop
        self.localAddress = bound
        self.state = LoopBound(source)
    }

    /// `init(bindingTo:port:on:options:)` from any task: makes the socket on `loop` (no hop from
    /// a task already on it).
    public static func bind(to host: String, port: UInt16, on loop: EventLoop, options: Options = Options())
        async throws(DatagramError) -> DatagramSocket
    {
        try await loop.onLoop(closed: .loop(.loopClosed)) { () throws(DatagramError) in
            try DatagramSocket(bindingTo: host, port: port, on: loop, options: options)
        }
    }

    /// Connects the socket to `address` (`connect(2)`, which sends nothing): datagrams without
    /// an address go there, only its datagrams are received, and an ICMP port-unreachable from
    /// it is reported (``DatagramEvent/error(errno:)`` with ECONNREFUSED). Loop thread only.
    /// - Throws: `.closed`, `.system` with the connect's errno, `.loop(.wrongThread)`.
    public func connect(to address: SocketAddress) throws(DatagramError) {
        try checkUsable("DatagramSocket.connect(to:)")
        let code = source.transport.connect(to: address)
        guard code == 0 else { throw .system(function: "connect \(address)", errno: code) }
        source.peer = address
    }

    /// The peer given to ``connect(to:)``, if any. Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var connectedPeer: SocketAddress? {
        loop.preconditionOnLoop("DatagramSocket.connectedPeer")
        return source.peer
    }

    /// Calls `handler` on the loop, at ``Options/priority``, for each datagram and each error
    /// met, until `close()`. One consumer per socket: either this or `datagrams()`. Loop
    /// thread only.
    /// - Throws: `.closed`, `.loop` (`.wrongThread`, `.libevent`); a precondition failure when
    ///   the socket already has a consumer.
    public func onReceive(_ handler: @escaping (DatagramEvent) -> Void) throws(DatagramError) {
        try checkUsable("DatagramSocket.onReceive(_:)")
        do throws(EventLoopError) { try source.startReading(handler) } catch { throw .loop(error) }
    }

    /// The datagrams (and errors) as an async sequence, ending (`nil`) when the socket
    /// closes. Reading pauses while ``Options/maximumDatagramsPerWakeup`` events wait for the
    /// consumer (the kernel's buffer then fills and drops, as UDP does). One consumer per
    /// socket; cancelling the iterating task (or dropping the sequence) ends it and closes the
    /// socket, as for every sequence that is a source's one consumer (`Listener.connections`,
    /// `signals`, `lines(from:)`). Loop thread only (the async overload works from any task).
    /// - Throws: `.closed`, `.loop` (`.wrongThread`, `.libevent`).
    public func datagrams() throws(DatagramError) -> Datagrams {
        try checkUsable("DatagramSocket.datagrams()")
        let feed = LoopFeed<DatagramEvent>(loop: loop, bound: max(1, source.options.maximumDatagramsPerWakeup))
        let source = self.source
        do throws(EventLoopError) {
            try source.startReading { [weak feed] event in feed?.yield(event) }
        } catch {
            throw .loop(error)
        }
        feed.attach(source: source, pause: { [weak source] in source?.pauseReading() },
                    resume: { [weak source] in source?.resumeReading() })
        source.onClosed = { [weak feed] in feed?.finish() }
        return Datagrams(feed: feed)
    }

    /// `datagrams()` from any task.
    public nonisolated(nonsending) func datagrams() async throws(DatagramError) -> Datagrams {
        try await loop.onLoop(closed: .loop(.loopClosed)) { () throws(DatagramError) in try self.datagrams() }
    }

    /// Sends `datagram` without blocking: to the kernel at once when nothing waits before it
    /// (one `sendmmsg(2)`), otherwise into the bounded send queue. Loop thread only.
    /// - Returns: ``SendOutcome/sent``, ``SendOutcome/queued``, or ``SendOutcome/queueFull``
    ///   (not taken).
    /// - Throws: ``DatagramError/tooLarge(size:limit:)`` for a payload over the family's UDP
    ///   limit (65,507 bytes for IPv4) or one the kernel refuses with EMSGSIZE;
    ///   `.invalidAddress` for a datagram without an address on an unconnected socket or one of
    ///   the other family on an IPv4 socket; `.closed`; `.system` with the send's errno (EACCES
    ///   for a broadcast address without ``Options/allowsBroadcast``, ECONNREFUSED for a
    ///   connected peer that answered port-unreachable); `.loop(.wrongThread)`.
    public func trySend(_ datagram: Datagram) throws(DatagramError) -> SendOutcome {
        try checkUsable("DatagramSocket.trySend(_:)")
        return try source.trySend(datagram)
    }

    /// Sends `datagrams` in order, without blocking, in batches of up to 64 per `sendmmsg(2)`:
    /// how many were taken (sent or queued) — fewer than given once the queue is full; the rest
    /// were not taken. Loop thread only. Throws like ``trySend(_:)`` for the first datagram
    /// that fails (those before it were taken).
    public func trySend(contentsOf datagrams: [Datagram]) throws(DatagramError) -> Int {
        try checkUsable("DatagramSocket.trySend(contentsOf:)")
        return try source.trySend(contentsOf: datagrams[...])
    }

    /// Sends `datagram`, suspending while the send queue is full; returns once it is sent or
    /// queued (in order with other senders). Any task.
    /// A datagram queued is sent as the kernel takes it, while the socket is open: closing it
    /// (`close()`, the loop's end, or its last handle dropped with no consumer) drops what is
    /// still queued.
    /// - Throws: like ``trySend(_:)``; `.closed` when the socket closes while it waits;
    ///   `.cancelled` when the task is cancelled while it waits (the datagram is not sent; the
    ///   socket stays open for other senders); `.loop(.loopClosed)` when the loop is shut down.
    public nonisolated(nonsending) func send(_ datagram: Datagram) async throws(DatagramError) {
        let state = self.state
        let result: Result<Result<Void, DatagramError>, EventLoopError> = await loop.waitCancellably { once in
            state.value.send(datagram, resuming: once)
        }
        switch result {
        case .success(let sent): try sent.get()
        case .failure(let error): throw DatagramError(error)
        }
    }

    /// Sends each of `datagrams` in order, suspending while the send queue is full.
    public nonisolated(nonsending) func send(contentsOf datagrams: [Datagram]) async throws(DatagramError) {
        for datagram in datagrams { try await send(datagram) }
    }

    /// Joins the multicast `group` (an IPv4 or IPv6 multicast literal such as "239.1.2.3" or
    /// "ff02::1:3") on the interface named `interface` ("eth0"; nil lets the kernel pick), so
    /// that its datagrams to this socket's port arrive. Loop thread only.
    /// - Throws: `.invalidAddress` for an address that is not multicast or an unknown
    ///   interface; `.system` (EADDRINUSE: already joined); `.closed`; `.loop` (`.wrongThread`;
    ///   `.simulatedLoop`: the simulated network has no multicast).
    public func joinMulticastGroup(_ group: String, interface: String? = nil) throws(DatagramError) {
        try checkUsable("DatagramSocket.joinMulticastGroup(_:interface:)")
        try changeMembership(group, interface: interface, join: true)
    }

    /// Leaves a group joined with ``joinMulticastGroup(_:interface:)``. Loop thread only.
    /// - Throws: like ``joinMulticastGroup(_:interface:)`` (EADDRNOTAVAIL: not joined).
    public func leaveMulticastGroup(_ group: String, interface: String? = nil) throws(DatagramError) {
        try checkUsable("DatagramSocket.leaveMulticastGroup(_:interface:)")
        try changeMembership(group, interface: interface, join: false)
    }

    /// The socket's counters (receive and send batches among them). Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read them on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var statistics: Statistics {
        loop.preconditionOnLoop("DatagramSocket.statistics")
        return source.statistics
    }

    /// Datagrams waiting in the send queue. Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var queuedDatagrams: Int {
        loop.preconditionOnLoop("DatagramSocket.queuedDatagrams")
        return source.queue.count
    }

    /// Whether the socket is closed (by `close()` or the loop's shutdown). Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var isClosed: Bool {
        loop.preconditionOnLoop("DatagramSocket.isClosed")
        return source.isClosed
    }

    /// Closes the socket: the sequence ends, queued datagrams are dropped and waiting
    /// ``send(_:)`` calls throw ``DatagramError/closed``. Idempotent. Any thread: on the loop's thread no
    /// handler runs after this returns; from another thread the close is posted to the loop
    /// (one post), and a handler already due may run before it.
    public func close() {
        if loop.acceptsDirectCalls {
            source.close()
        } else {
            let state = self.state
            loop.execute { state.value.close() }
        }
    }

    /// `close()` from any task.
    public nonisolated(nonsending) func close() async {
        let state = self.state
        // `try?`: `onLoop` fails only when the loop has shut down, which closed the socket already.
        _ = try? await loop.onLoop { state.value.close() }
    }

    private func checkUsable(_ function: String) throws(DatagramError) {
        guard loop.claimThread() else { throw .loop(.wrongThread(function: function)) }
        guard !source.isClosed else { throw .closed }
    }

    private func changeMembership(_ group: String, interface: String?, join: Bool) throws(DatagramError) {
        guard let address = numericAddress(group, port: 0), isMulticast(address) else {
            throw .invalidAddress("'\(group)' is not a multicast address")
        }
        var index: UInt32 = 0
        if let interface {
            guard let found = interfaceIndex(named: interface) else {
                throw .invalidAddress("there is no network interface named '\(interface)'")
            }
            index = found
        }
        let code: Int32
        do throws(EventLoopError) {
            code = try source.transport.changeMembership(of: address, interfaceIndex: index, join: join)
        } catch {
            throw .loop(error)
        }
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
