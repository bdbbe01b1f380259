#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// What a connection's `Connection` handles may read from any thread.
final class ConnectionShared: Sendable {
    /// Set once the connection has closed (any reason).
    let isClosed = Atomic<Bool>(false)
}

/// The loop side of a `Connection`: the socket, its buffers, the callback handlers and the
/// suspended tasks of the async API. Loop thread only.
///
/// ## Memory
/// Nothing of the input outlives a read: lines are split where libevent keeps the input (its
/// `evbuffer` chains, freed as they are drained), and byte chunks are copied into arrays of their
/// exact size. Only the unfinished tail of a line is kept (at most `maxLineLength`). Output is
/// coalesced in `pendingOutput` until the loop next polls; it and the queue of split lines give
/// back their capacity after a burst (above `retainedCapacity`), so an idle connection holds no
/// buffer of its own.
///
/// Its mutable state is touched only on the loop's thread, by one handler at a time: it is
/// declared `@exclusivity(unchecked)`, which saves a runtime access check (some 80
/// instructions) on every access.
final class ConnectionSource: Source {
    @exclusivity(unchecked) var socket: BufferedSocket?
    let target = Target()
    let remoteAddress: String
    let options: Connection.Options
    let shared = ConnectionShared()

    /// Text written since the loop last polled, handed to libevent in one piece just before the
    /// next poll (libevent only writes while it polls, so nothing is delayed): a line protocol
    /// writes a reply per request, and this makes a batch of pipelined requests one buffer
    /// append instead of one per reply.
    @exclusivity(unchecked) var pendingOutput: [UInt8] = []
    @exclusivity(unchecked) var flushScheduled = false
    @exclusivity(unchecked) var lineHandler: ((LineEvent) -> Void)?
    @exclusivity(unchecked) var bytesHandler: ((Connection.Input) -> Void)?
    @exclusivity(unchecked) var closeHandler: ((Connection.CloseReason) -> Void)?
    @exclusivity(unchecked) var splitter: LineSplitter
    /// Lines split but not yet delivered or taken (delivery stops while output is paused).
    @exclusivity(unchecked) var lineEvents: [LineEvent] = []
    @exclusivity(unchecked) var nextLineEvent = 0

    @exclusivity(unchecked) var isPausedForOutput = false
    @exclusivity(unchecked) var isReading = false
    /// libevent's input buffer is full (`inputLimit`): the socket is not read until the reader
    /// (callbacks or the async consumer) has taken some. libevent itself would stop reading, but
    /// would also call back again and again, inside one poll, for as long as nobody drains it.
    @exclusivity(unchecked) var isInputFull = false
    /// Whether reading is enabled on the bufferevent (see `updateReading`).
    @exclusivity(unchecked) var isReadEnabled = false
    @exclusivity(unchecked) var peerEnded = false
    @exclusivity(unchecked) var deliveredEndOfFile = false
    @exclusivity(unchecked) var isClosing = false
    @exclusivity(unchecked) var wantsOutputShutdown = false
    @exclusivity(unchecked) var closeReason: Connection.CloseReason?
    @exclusivity(unchecked) var pendingEvent: SocketEvent = []
    @exclusivity(unchecked) var pendingErrno: Int32 = 0
    /// Whether the socket is established (an outgoing connect may still be in progress).
    @exclusivity(unchecked) var isConnected: Bool

    // MARK: Suspended tasks (the async API)

    /// The task waiting in `lines` or `bytes` for input (one consumer per connection).
    @exclusivity(unchecked) var lineWaiter: UnsafeContinuation<Result<LineEvent?, Connection.CloseReason>, Never>?
    @exclusivity(unchecked) var bytesWaiter: UnsafeContinuation<Result<[UInt8]?, Connection.CloseReason>, Never>?
    /// Tasks waiting in `send` for the output to drain, in order, each with what it sends.
    @exclusivity(unchecked) var senders: [Sender] = []
    @exclusivity(unchecked) var firstSender = 0
    /// Tasks awaiting `closed` or an async `close()`.
    @exclusivity(unchecked) var closeWaiters: [UnsafeContinuation<Connection.CloseReason, Never>] = []
    /// The task awaiting an async `connect`.
    @exclusivity(unchecked) var connectWaiter: ((Result<Void, EventLoopError>) -> Void)?

    struct Sender {
        let payload: Payload
        let continuation: UnsafeContinuation<Result<Void, Connection.CloseReason>, Never>
    }

    /// What a `send` writes.
    enum Payload {
        case bytes([UInt8])
        case text(String, newline: Bool)
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
    static let retainedLineEvents = 256

    init(loop: EventLoop, fd: Int32, peer: String, options: Connection.Options) throws(EventLoopError) {
        _ = ignoreSIGPIPE
        self.remoteAddress = peer
        self.options = options
        self.splitter = LineSplitter(maxLineLength: options.maxLineLength)
        self.isConnected = true
        super.init(loop: loop, priority: .input, keepsLoopBusy: true)
        target.source = self
        do {
            socket = try BufferedSocket(base: loop.base, fd: fd, target: target)
        } catch {
            closeDescriptor(fd)
            close()
            throw error
        }
        configureSocket()
    }

    init(loop: EventLoop, connectingTo host: String, port: UInt16, options: Connection.Options) throws(EventLoopError) {
        _ = ignoreSIGPIPE
        options.check("Connection.connect")
        self.remoteAddress = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        self.options = options
        self.splitter = LineSplitter(maxLineLength: options.maxLineLength)
        self.isConnected = false
        super.init(loop: loop, priority: .input, keepsLoopBusy: true)
        target.source = self
        do {
            socket = try BufferedSocket(connectingTo: host, port: port, base: loop.base, target: target)
        } catch {
            close()
            throw error
        }
        configureSocket()
    }

    var bufferedOutputBytes: Int { (socket?.outputLength ?? 0) + pendingOutput.count }

    /// Async operations suspended on this connection (each is one task).
    var suspendedTasks: Int {
        (lineWaiter == nil ? 0 : 1) + (bytesWaiter == nil ? 0 : 1) + (senders.count - firstSender)
            + closeWaiters.count + (connectWaiter == nil ? 0 : 1)
    }

    // MARK: Reading with callbacks

    func startReading(lines: ((LineEvent) -> Void)?, bytes: ((Connection.Input) -> Void)?) {
        guard !isClosed, !isClosing else { return }
        lineHandler = lines
        bytesHandler = bytes
        isReading = true
        updateReading()
        // Input may already be buffered (or the peer already gone): look at it next turn.
        withLoop { $0.enqueueNextTurn(source: self) }
    }

    func deliverInput() {
        guard isReading, !isPausedForOutput, let socket else { return }
        if lineHandler == nil && bytesHandler == nil {
            wakeAsyncReader()
            return
        }
        if nextLineEvent < lineEvents.count {
            deliverLines()
            if isClosed || isClosing || isPausedForOutput { return }
        }
        if let bytesHandler {
            let data = socket.readInput(upTo: Self.chunk)
            releaseInputHold(socket)
            if !data.isEmpty { bytesHandler(.bytes(data)) }
        } else if lineHandler != nil {
            _ = socket.splitInput(upTo: Self.chunk, into: &splitter) { lineEvents.append($0) }
            releaseInputHold(socket)
            deliverLines()
        }
        if isClosed || isClosing || isPausedForOutput { return }
        if self.socket?.inputLength ?? 0 > 0 {
            withLoop { $0.enqueueNextTurn(source: self) }  // more buffered: continue next turn, after polling
        } else if peerEnded && !deliveredEndOfFile {
            deliveredEndOfFile = true
            if let bytesHandler {
                bytesHandler(.endOfFile)
            } else if lineHandler != nil {
                splitter.finish { lineEvents.append($0) }
                deliverLines()
            }
        }
    }

    func deliverLines() {
        while nextLineEvent < lineEvents.count, !isClosed, !isPausedForOutput, let handler = lineHandler {
            let event = lineEvents[nextLineEvent]
            nextLineEvent += 1
            handler(event)
        }
        if nextLineEvent == lineEvents.count { resetLineEvents() }
    }

    func resetLineEvents() {
        lineEvents.removeAll(keepingCapacity: lineEvents.capacity <= Self.retainedLineEvents)
        nextLineEvent = 0
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
            finish(.error(code == 0 ? ECONNRESET : code))
        } else if event.contains(.timeout) {
            finish(isClosing ? .closed : .idleTimeout)
        } else {
            if event.contains(.connected) {
                isConnected = true
                if let waiter = connectWaiter {
                    connectWaiter = nil
                    waiter(.success(()))
                }
            }
            if event.contains(.endOfFile) {
                peerEnded = true
                if isClosing { return }
                deliverInput()
            }
        }
    }

    func drained() {
        guard let socket else { return }
        if isClosing {
            if socket.outputLength == 0 { finish(.closed) }
            return
        }
        if wantsOutputShutdown && socket.outputLength == 0 { socket.shutdownWrite() }
        if isPausedForOutput && socket.outputLength <= options.outputLimit / 2 {
            isPausedForOutput = false
            socket.setWriteLowWatermark(0)
            resumeSenders()
            if isReading && !isPausedForOutput && !isClosed {
                updateReading()
                deliverInput()
            }
        }
    }

    /// Closes the socket and reports `reason`, once.
    func finish(_ reason: Connection.CloseReason) {
        guard closeReason == nil else { return }
        closeReason = reason
        shared.isClosed.store(true, ordering: .releasing)
        pendingOutput = []
        socket = nil  // bufferevent_free closes the fd
        let handler = closeHandler
        closeHandler = nil
        lineHandler = nil
        bytesHandler = nil
        close()
        handler?(reason)
    }

    /// The loop refused to poll the socket again: the connection closes with `.error(errno)`.
    override func failed(_ error: EventLoopError) {
        finish(.error(error.errnoCode))
    }

    /// Input buffered beyond this stops libevent reading the socket until we consume it.
    static let inputLimit = 4 * chunk

    func configureSocket() {
        socket?.setReadHighWatermark(Self.inputLimit)
        if let idle = options.idleTimeout {
            socket?.setTimeouts(readNanoseconds: max(1, idle.clampedNanoseconds), writeNanoseconds: nil)
        }
    }

    override func didClose() {
        if closeReason == nil {
            // Closed by the loop going away: no handler runs; suspended tasks see `.cancelled`.
            closeReason = .cancelled
            socket = nil
        }
        shared.isClosed.store(true, ordering: .releasing)
        lineHandler = nil
        bytesHandler = nil
        closeHandler = nil
        lineEvents = []
        nextLineEvent = 0
        pendingOutput = []
        let reason = closeReason ?? .cancelled
        if let waiter = lineWaiter {
            lineWaiter = nil
            waiter.resume(returning: reason == .closed ? .success(nil) : .failure(reason))
        }
        if let waiter = bytesWaiter {
            bytesWaiter = nil
            waiter.resume(returning: reason == .closed ? .success(nil) : .failure(reason))
        }
        failSenders(reason)
        let closing = closeWaiters
        closeWaiters = []
        for waiter in closing { waiter.resume(returning: reason) }
        if let waiter = connectWaiter {
            connectWaiter = nil
            waiter(.failure(connectFailure(reason)))
        }
    }

    /// Receives libevent's callbacks and fires the source (no user code inside the poll).
    ///
    /// Its reference to the source is `unowned(unsafe)`: the source owns the target and the
    /// socket whose callbacks reach it, and frees the socket (so the callbacks end) before it
    /// goes. A weak reference would give the source a side table, and every retain and release
    /// of it the slow path (some 75 instead of 20 instructions each, several per request).
    final class Target: BufferedSocketTarget {
        unowned(unsafe) var source: ConnectionSource?
        override func socketReadable() {
            guard let source else { return }
            source.inputArrived()
            source.fire(.read)
        }
        override func socketDrained() { source?.fire(.write) }
        override func socketEvent(_ event: SocketEvent, errno: Int32) {
            guard let source else { return }
            source.pendingEvent.formUnion(event)
            if event.contains(.error) { source.pendingErrno = errno }
            source.fire(.signal)
        }
    }
}

/// Lets a loop-bound close handler travel through `execute` to the same loop.
struct UncheckedHandler: @unchecked Sendable {
    let handler: (Connection.CloseReason) -> Void
    init(_ handler: @escaping (Connection.CloseReason) -> Void) { self.handler = handler }
    func call(_ reason: Connection.CloseReason) { handler(reason) }
}

extension ConnectionSource: PollPreparing {
    /// Hands the output written since the last poll to libevent (which writes only while it
    /// polls), in one piece.
    func prepareForPoll() {
        flushScheduled = false
        flushPendingOutput()
    }
}
