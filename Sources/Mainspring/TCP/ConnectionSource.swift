#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// The parts of `Connection.Options` that a connection uses after it is made.
struct KeptOptions {
    let outputLimit: Int
    /// `idleTimeout` in nanoseconds (at least 1); 0 for none.
    let idleTimeoutNanoseconds: UInt64
    /// `closeTimeout` in nanoseconds (at least 1).
    let closeTimeoutNanoseconds: UInt64

    init(_ options: Connection.Options) {
        outputLimit = options.outputLimit
        idleTimeoutNanoseconds = options.idleTimeout.map { max(1, $0.clampedNanoseconds) } ?? 0
        closeTimeoutNanoseconds = max(1, options.closeTimeout.clampedNanoseconds)
    }
}

/// What a connection's descriptor is: a socket (both ways), or one end of a pipe to a child
/// process (one way: see `Subprocess`).
enum ConnectionRole: Equatable {
    case socket
    /// A child's stdout or stderr: read-only; it closes once the end of its input was delivered.
    case pipeReadEnd
    /// A child's stdin: write-only; `shutdownOutput()` closes it (a pipe has no half-close).
    case pipeWriteEnd
}

/// The loop side of a `Connection`: the socket, its buffers, the readers (callbacks, or the
/// task suspended in an async read), the senders waiting for the output to drain. Loop thread
/// only.
///
/// Its lifecycle is a `ConnectionState` (a value whose transitions say what to do); this class
/// applies them to the socket and runs the handlers and continuations.
///
/// ## Input
/// The input stays in libevent's buffer until a reader takes it: lines are split where they
/// lie (`InPlaceLineSplitter`) and drained only as they are delivered, byte chunks are removed
/// as they are read. So when a reader ends — a callback reader replaced or stopped, a task that
/// breaks out of `lines` — whatever it did not take is still there, whole, for the next
/// reader, of any kind. One reader at a time: callbacks, or one task's read.
///
/// ## Memory
/// Nothing of the input outlives a read: lines become the strings of their events, chunks are
/// copied into arrays of their exact size. An unfinished line waits in the input buffer (at
/// most `maxLineLength` + 1 bytes; a longer one is skipped as it arrives). Output is coalesced
/// in `pendingOutput` until the loop next polls (or its pass turns from `.input` callbacks to
/// other work); once written, an emptied buffer goes to the
/// loop's spares for the next connection that writes (one larger than `retainedCapacity`, after
/// a burst, is freed; while the spares are full, at most `maxSpareOutputBuffers`, a connection
/// keeps its emptied buffer), so an idle connection holds no buffer of its own. The first line waiting
/// to be taken is held inline (`LineQueue`), and what few connections use is in `rare`.
///
/// Its mutable state is touched only on the loop's thread, by one handler at a time: it is
/// declared `@exclusivity(unchecked)`, which saves a runtime access check (some 80
/// instructions) on every access (`RareState`'s members too).
final class ConnectionSource: Source {
    @exclusivity(unchecked) var socket: BufferedSocket?
    let remoteAddress: String
    /// What the connection keeps of its `Connection.Options` (the rest is used once, as it is
    /// made): 24 bytes, where a copy of the whole value would be 88 in every connection.
    /// Loop thread writes it only before the connection is shared (`Connection.adopt`).
    var kept: KeptOptions
    @exclusivity(unchecked) var state: ConnectionState
    /// The layer between the connection and its socket (TLS), if any: boxed, one word where
    /// the optional existential would be two in every connection.
    let layer: TransportLayer?
    /// The layer (`layer`'s transport), if any.
    var transport: (any ConnectionTransport)? { layer?.transport }
    /// `transport.details` (any thread reads it).
    var transportDetails: (any Sendable)? { layer?.transport.details }
    /// A socket, or one end of a child's pipe.
    let role: ConnectionRole

    // MARK: Read from any thread (by `Connection` handles)

    /// Set once the connection has closed (any reason).
    let closedFlag = Atomic<Bool>(false)
    /// Whether the output is over its limit (or the connection is closing): mirrors the loop's
    /// state at each change, for `isWritable` and `trySend` from other threads.
    let outputPausedFlag = Atomic<Bool>(false)
    // Two loop-thread members here, beside the one-byte ones before them: a class's members are
    // laid out in the order they are declared, and this fills what would be padding.
    @exclusivity(unchecked) var flushScheduled = false
    @exclusivity(unchecked) var pendingErrno: Int32 = 0
    /// Bytes that `trySend` from other threads accepted and posted, not yet written on the loop:
    /// counted against the limit so that a fast poster cannot queue without bound.
    let inFlightBytes = Atomic<Int>(0)
    /// Tickets of `waitUntilWritable` calls (so that a cancellation finds its own waiter).
    let nextWaitTicket = Atomic<Int>(0)

    /// Text written since the loop last polled, written in one piece just before the next poll,
    /// or once the pass's `.input` callbacks have run if other work follows them
    /// (`flushPendingOutput`: one `send(2)` or `SSL_write`, or one append to libevent's buffer,
    /// which writes only while it polls — so nothing is delayed): a line protocol writes a reply
    /// per request, and this makes a batch of pipelined requests one write instead of one per
    /// reply.
    @exclusivity(unchecked) var pendingOutput: [UInt8] = []
    @exclusivity(unchecked) var closeHandler: ((Connection.CloseReason) -> Void)?
    /// The state that few connections ever use (see `RareState`), made on first use.
    @exclusivity(unchecked) var rare: RareState?

    // MARK: Readers

    /// The callback reader, if one is installed.
    enum CallbackReader {
        case lines((LineEvent) -> Void)
        case bytes((Connection.Input) -> Void)
        /// One delivery of exactly this many bytes (or the end), then the reader is gone.
        case exactly(Int, (Connection.Input) -> Void)
    }

    @exclusivity(unchecked) var callbackReader: CallbackReader?
    @exclusivity(unchecked) var pendingEvent: SocketEvent = []
    /// Changes whenever the reader changes: a delivery loop stops when its reader is gone.
    @exclusivity(unchecked) var readerGeneration: UInt32 = 0
    /// The callback reader that was given `.endOfFile` (each reader is told once).
    @exclusivity(unchecked) var endReportedToGeneration: UInt32?
    @exclusivity(unchecked) var splitter: InPlaceLineSplitter
    /// Lines split (in place) and not yet delivered; the bytes of those delivered, to drain.
    @exclusivity(unchecked) var lines = LineQueue()
    /// libevent stops reading the socket at this much buffered input (the input limit, or more
    /// while a read needs to see more at once).
    @exclusivity(unchecked) var readLimit: Int

    // MARK: Suspended tasks (the async API)

    /// The task suspended in a read (one at a time), with what it waits for.
    @exclusivity(unchecked) var asyncRead: PendingRead?

    /// A connection's transport layer, in a box of its own (see `layer`).
    final class TransportLayer {
        let transport: any ConnectionTransport
        init(_ transport: any ConnectionTransport) { self.transport = transport }
    }

    /// A read a task is suspended in.
    enum PendingRead {
        case line(UnsafeContinuation<Result<LineEvent?, Connection.CloseReason>, Never>)
        case bytes(max: Int, UnsafeContinuation<Result<[UInt8]?, Connection.CloseReason>, Never>)
        case exactly(Int, UnsafeContinuation<Result<[UInt8]?, Connection.CloseReason>, Never>)
        case delimited([UInt8], limit: Int, UnsafeContinuation<Result<Connection.Delimited?, Connection.CloseReason>, Never>)
    }

    struct Sender {
        let payload: Payload
        let continuation: UnsafeContinuation<Result<Void, Connection.CloseReason>, Never>
    }

    /// What a `send` writes.
    enum Payload: Sendable {
        case bytes([UInt8])
        case text(String, newline: Bool)

        var count: Int {
            switch self {
            case .bytes(let bytes): bytes.count
            case .text(let text, let newline): text.utf8.count + (newline ? 1 : 0)
            }
        }
    }

    /// The answer to a pull of the async consumer.
    enum Pull<Element> {
        case element(Element)
        case end
        case failed(Connection.CloseReason)
        case wait

        /// What a reading consumer gets now — the element, nil at the end, or the close reason —
        /// or nil when it must wait.
        @inline(__always)
        var outcome: Result<Element?, Connection.CloseReason>? {
            switch self {
            case .element(let element): .success(element)
            case .end: .success(nil)
            case .failed(let reason): .failure(reason)
            case .wait: nil
            }
        }
    }

    /// Bytes taken from the input per turn: bounds one callback's work.
    static let chunk = 65_536
    /// Bytes split per step for the async consumer: it waits for the first lines of a chunk,
    /// not for the whole chunk, and the queue of split lines stays small.
    static let asyncSlice = 4_096
    /// Capacity that buffers keep between bursts; above it they are released once empty.
    static let retainedCapacity = 4_096
    /// Input buffered beyond this stops libevent reading the socket until a reader takes some
    /// (at least 256 KiB, and room for a whole line of `maxLineLength`).
    static func inputLimit(maxLineLength: Int) -> Int {
        max(4 * chunk, maxLineLength + 2 + chunk)
    }

    /// The state every connection starts with; its socket comes next (see the initializers
    /// below), made by the loop's world (`LoopWorld`) or over a layer.
    private init(loop: EventLoop, peer: String, options: Connection.Options, role: ConnectionRole, connected: Bool,
                 transport: (any ConnectionTransport)?)
    {
        _ = ignoreSIGPIPE
        self.role = role
        self.remoteAddress = peer
        self.kept = KeptOptions(options)
        self.splitter = InPlaceLineSplitter(maxLineLength: options.maxLineLength)
        self.state = ConnectionState(connected: connected)
        self.readLimit = Self.inputLimit(maxLineLength: options.maxLineLength)
        self.layer = transport.map(TransportLayer.init)
        super.init(loop: loop, priority: .input, keepsLoopBusy: true)
    }

    /// A connection over `endpoint`, connected already: accepted, one of a pair, adopted, a
    /// child's pipe. On a failure the endpoint is released.
    convenience init(loop: EventLoop, endpoint: StreamEndpoint, peer: String, options: Connection.Options,
                     role: ConnectionRole = .socket) throws(EventLoopError)
    {
        self.init(loop: loop, peer: peer, options: options, role: role, connected: true, transport: nil)
        do {
            socket = try endpoint.makeSocket(on: loop.base, target: self)
        } catch {
            close()
            throw error
        }
        configureSocket()
    }

    /// A connection over an established bufferevent made by a package module's `transport`.
    convenience init(loop: EventLoop, adopting bufferevent: OpaquePointer, peer: String, options: Connection.Options,
                     transport: any ConnectionTransport, simulatedLayer: SimulatedLayerSocket? = nil)
    {
        options.check("Connection (TLS)")
        self.init(loop: loop, peer: peer, options: options, role: .socket, connected: true, transport: transport)
        let adopted = BufferedSocket(adopting: bufferevent, base: loop.base, target: self)
        if let simulatedLayer { adopted.adopt(simulatedLayer: simulatedLayer) }
        // Reading starts with the first reader, as on every connection: the layer may have
        // left it on (a handshake reads). Left on with no reader, a full input made libevent
        // call the read callback again at once, for ever (its high-watermark re-check), and
        // the loop never got out of its poll.
        adopted.disable(.read)
        socket = adopted
        configureSocket()
    }

    /// A connection to `host:port`, connecting: the loop's world starts the connect (a
    /// socket's, or a stream of the simulation's network) and finishes it later.
    convenience init(loop: EventLoop, connectingTo host: String, port: UInt16, options: Connection.Options)
        throws(EventLoopError)
    {
        options.check("Connection.connect")
        self.init(loop: loop, peer: hostAndPort(host, port), options: options, role: .socket, connected: false,
                  transport: nil)
        try loop.world.startConnect(self, to: host, port: port, options: options)
    }

    var bufferedOutputBytes: Int { (socket?.outputLength ?? 0) + pendingOutput.count }

    /// Async operations suspended on this connection (each is one task).
    var suspendedTasks: Int {
        (asyncRead == nil ? 0 : 1) + (senders.count - firstSender) + closeWaiters.count
            + (connectWaiter == nil ? 0 : 1) + writableWaiters.count
    }

    // MARK: Events

    override func perform(_ readiness: Readiness) {
        if readiness.contains(.signal) {
            let event = pendingEvent
            pendingEvent = []
            handle(event, errno: pendingErrno)
            if isClosed { return }
        }
        if readiness.contains(.write) { drained() }
        if readiness.contains(.read) { deliverInput() }
    }

    func handle(_ event: SocketEvent, errno code: Int32) {
        if event.contains(.error) {
            switch transport?.interpretFailure(errno: code) ?? .socketError {
            case .closed(let reason):
                finish(reason)
            case .endOfInput:
                if state.peerDidEnd() { deliverInput() }
            case .socketError:
                finish(.error(code == 0 ? ECONNRESET : code))
            }
        } else if event.contains(.timeout) {
            finish(state.isClosing ? closingReason : state.timeoutReason)
        } else {
            if event.contains(.connected), state.connected() {
                applyReadChange()
                if let waiter = connectWaiter {
                    connectWaiter = nil
                    waiter(.success(()))
                }
            }
            if event.contains(.endOfFile), state.peerDidEnd() {
                deliverInput()
            }
        }
    }

    /// Makes the socket's read side what the state wants.
    func applyReadChange() {
        guard let change = state.readChange(), let socket else { return }
        switch change {
        case .enable:
            do {
                try socket.enable(.read)
            } catch {
                registrationFailed(error)
            }
        case .disable:
            socket.disable(.read)
        }
    }

    /// Closes the socket and reports `reason`, once.
    func finish(_ reason: Connection.CloseReason) {
        let graceful = state.isClosing && reason == closingReason
        guard state.finish(reason) else { return }
        if graceful, let socket { endLayerOutput(socket) }
        closedFlag.store(true, ordering: .releasing)
        outputPausedFlag.store(true, ordering: .relaxed)
        pendingOutput = []
        // The lines a reader took were read: drained before the socket goes, so that what is
        // left is only what nobody read (a simulated socket resets its peer only for that, as
        // a kernel does for bytes left in its receive buffer).
        if let socket { lines.settle(socket) }
        lines.clear()
        gathered = []
        socket = nil  // bufferevent_free closes the fd
        let handler = closeHandler
        closeHandler = nil
        callbackReader = nil
        writableHandlers = []
        outputSentHandlers = []
        close()
        handler?(reason)
    }

    /// The loop refused to poll the socket again: the connection closes with `.error(errno)`.
    override func failed(_ error: EventLoopError) {
        finish(.error(error.errnoCode))
    }

    override func didClose() {
        if state.finish(.cancelled) {
            // Closed by the loop going away: no handler runs; suspended tasks see `.cancelled`.
            socket = nil
        }
        closedFlag.store(true, ordering: .releasing)
        outputPausedFlag.store(true, ordering: .relaxed)
        callbackReader = nil
        closeHandler = nil
        writableHandlers = []
        lines.clear()
        gathered = []
        pendingOutput = []
        let reason = state.closeReason ?? .cancelled
        endAsyncRead(with: reason)
        failSenders(reason)
        failWritableWaiters(reason)
        let closing = closeWaiters
        closeWaiters = []
        for waiter in closing { waiter.resume(returning: reason) }
        if let waiter = connectWaiter {
            connectWaiter = nil
            waiter(.failure(connectFailure(reason)))
        }
    }

    // MARK: The socket's callbacks (inside the poll: they only record and fire)

    // The socket's callback argument is this source, unretained: the source frees the socket
    // (so the callbacks end) before it goes. (A weak reference, through an object in between,
    // would cost a side table and every retain and release of the source the slow path.)

    override func socketReadable() {
        inputArrived()
        fire(.read)
    }

    override func socketDrained() { fire(.write) }

    /// Output left the buffer (the simulation's network took it, or on a real socket the kernel,
    /// once `reportOutputTaken` was asked for): when it happened.
    override func socketOutputTaken() {
        withLoop { loop in rareState.outputMovedAt = loop.monotonicNow() }
    }

    override func socketEvent(_ event: SocketEvent, errno: Int32) {
        pendingEvent.formUnion(event)
        if event.contains(.error) { pendingErrno = errno }
        fire(.signal)
    }
}

extension ConnectionSource: PollPreparing {
    /// Hands the output written since the last poll to the socket, in one piece (see
    /// `flushPendingOutput`).
    func prepareForPoll() {
        flushScheduled = false
        flushPendingOutput()
    }
}
