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
final class ConnectionSource: Source {
    private var socket: BufferedSocket?
    private let target = Target()
    let remoteAddress: String
    let options: Connection.Options
    let shared = ConnectionShared()

    /// Text written since the loop last polled, handed to libevent in one piece just before the
    /// next poll (libevent only writes while it polls, so nothing is delayed): a line protocol
    /// writes a reply per request, and this makes a batch of pipelined requests one buffer
    /// append instead of one per reply.
    private var pendingOutput: [UInt8] = []
    private var flushScheduled = false
    private var lineHandler: ((LineEvent) -> Void)?
    private var bytesHandler: ((Connection.Input) -> Void)?
    private var closeHandler: ((Connection.CloseReason) -> Void)?
    private var splitter: LineSplitter
    /// Lines split but not yet delivered or taken (delivery stops while output is paused).
    private var lineEvents: [LineEvent] = []
    private var nextLineEvent = 0

    private(set) var isPausedForOutput = false
    private var isReading = false
    /// libevent's input buffer is full (`inputLimit`): the socket is not read until the reader
    /// (callbacks or the async consumer) has taken some. libevent itself would stop reading, but
    /// would also call back again and again, inside one poll, for as long as nobody drains it.
    private var isInputFull = false
    /// Whether reading is enabled on the bufferevent (see `updateReading`).
    private var isReadEnabled = false
    private var peerEnded = false
    private var deliveredEndOfFile = false
    private var isClosing = false
    private var wantsOutputShutdown = false
    private var closeReason: Connection.CloseReason?
    private var pendingEvent: SocketEvent = []
    private var pendingErrno: Int32 = 0
    /// Whether the socket is established (an outgoing connect may still be in progress).
    private var isConnected: Bool

    // MARK: Suspended tasks (the async API)

    /// The task waiting in `lines` or `bytes` for input (one consumer per connection).
    private var lineWaiter: UnsafeContinuation<Result<LineEvent?, Connection.CloseReason>, Never>?
    private var bytesWaiter: UnsafeContinuation<Result<[UInt8]?, Connection.CloseReason>, Never>?
    /// Tasks waiting in `send` for the output to drain, in order, each with what it sends.
    private var senders: [Sender] = []
    private var firstSender = 0
    /// Tasks awaiting `closed` or an async `close()`.
    private var closeWaiters: [UnsafeContinuation<Connection.CloseReason, Never>] = []
    /// The task awaiting an async `connect`.
    private var connectWaiter: ((Result<Void, EventLoopError>) -> Void)?

    private struct Sender {
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
    }

    /// Bytes taken from the input per turn: bounds one callback's work.
    private static let chunk = 65_536
    /// Bytes split per step for the async consumer: it waits for the first lines of a chunk,
    /// not for the whole chunk, and the queue of split lines stays small.
    private static let asyncSlice = 4_096
    /// Capacity that buffers keep between bursts; above it they are released once empty.
    private static let retainedCapacity = 4_096
    private static let retainedLineEvents = 256

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
        loop.enqueueNextTurn(source: self)
    }

    private func deliverInput() {
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
            loop.enqueueNextTurn(source: self)  // more buffered: continue next turn, after polling
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

    private func deliverLines() {
        while nextLineEvent < lineEvents.count, !isClosed, !isPausedForOutput, let handler = lineHandler {
            let event = lineEvents[nextLineEvent]
            nextLineEvent += 1
            handler(event)
        }
        if nextLineEvent == lineEvents.count { resetLineEvents() }
    }

    private func resetLineEvents() {
        lineEvents.removeAll(keepingCapacity: lineEvents.capacity <= Self.retainedLineEvents)
        nextLineEvent = 0
    }

    // MARK: Reading from a task

    /// The async consumer starts: reading is enabled (it stops again while the consumer does
    /// not take what was read, once libevent's input buffer is full).
    func startAsyncReading() {
        guard !isClosed, !isClosing else { return }
        isReading = true
        updateReading()
    }

    /// Enables or disables reading the socket: on while someone reads, and neither the output
    /// (over its limit) nor the async consumer (not taking a full input buffer) holds it back.
    private func updateReading() {
        guard let socket else { return }
        let wanted = isReading && !isClosing && !isPausedForOutput && !isInputFull
        guard wanted != isReadEnabled else { return }
        isReadEnabled = wanted
        if wanted { socket.enable(.read) } else { socket.disable(.read) }
    }

    /// Inside the poll (libevent's read callback): stop reading a full input buffer at once.
    func inputArrived() {
        guard !isInputFull, let socket, socket.inputLength >= Self.inputLimit else { return }
        isInputFull = true
        updateReading()
    }

    /// After the reader took input: a full input buffer that held reading back has room.
    private func releaseInputHold(_ socket: BufferedSocket) {
        if isInputFull && socket.inputLength < Self.inputLimit {
            isInputFull = false
            updateReading()
        }
    }

    /// The next line event for the task iterating `lines`, if one is ready or can be split from
    /// the input now.
    func pullLine() -> Pull<LineEvent> {
        if let reason = closeReason { return reason == .closed ? .end : .failed(reason) }
        if isClosing { return .end }
        if nextLineEvent < lineEvents.count { return .element(takeLineEvent()) }
        if deliveredEndOfFile { return .end }
        guard !isPausedForOutput, let socket else { return .wait }
        var split = 0
        while lineEvents.isEmpty && split < Self.chunk {
            let taken = socket.splitInput(upTo: Self.asyncSlice, into: &splitter) { lineEvents.append($0) }
            if taken == 0 { break }
            split += taken
        }
        if split > 0 { releaseInputHold(socket) }
        if lineEvents.isEmpty && peerEnded && socket.inputLength == 0 {
            deliveredEndOfFile = true
            splitter.finish { lineEvents.append($0) }
        }
        if nextLineEvent < lineEvents.count { return .element(takeLineEvent()) }
        // A chunk of one long line, with more to come: go on after the next poll.
        if split >= Self.chunk { loop.enqueueNextTurn(source: self) }
        return .wait
    }

    private func takeLineEvent() -> LineEvent {
        let event = lineEvents[nextLineEvent]
        nextLineEvent += 1
        if nextLineEvent == lineEvents.count { resetLineEvents() }
        return event
    }

    /// The next chunk for the task iterating `bytes`.
    func pullBytes() -> Pull<[UInt8]> {
        if let reason = closeReason { return reason == .closed ? .end : .failed(reason) }
        if deliveredEndOfFile || isClosing { return .end }
        guard !isPausedForOutput, let socket else { return .wait }
        let data = socket.readInput(upTo: Self.chunk)
        if !data.isEmpty {
            releaseInputHold(socket)
            return .element(data)
        }
        if peerEnded {
            deliveredEndOfFile = true
            return .end
        }
        return .wait
    }

    func parkLineConsumer(_ continuation: UnsafeContinuation<Result<LineEvent?, Connection.CloseReason>, Never>) {
        precondition(lineWaiter == nil, "Mainspring: Connection.lines has one consumer at a time")
        lineWaiter = continuation
    }

    func parkBytesConsumer(_ continuation: UnsafeContinuation<Result<[UInt8]?, Connection.CloseReason>, Never>) {
        precondition(bytesWaiter == nil, "Mainspring: Connection.bytes has one consumer at a time")
        bytesWaiter = continuation
    }

    /// Input arrived (or the peer ended, or output drained): resumes the waiting consumer if
    /// there is something for it now.
    private func wakeAsyncReader() {
        if let waiter = lineWaiter {
            let result: Result<LineEvent?, Connection.CloseReason>
            switch pullLine() {
            case .wait: return
            case .element(let event): result = .success(event)
            case .end: result = .success(nil)
            case .failed(let reason): result = .failure(reason)
            }
            lineWaiter = nil
            loop.resumingInput { waiter.resume(returning: result) }
        } else if let waiter = bytesWaiter {
            let result: Result<[UInt8]?, Connection.CloseReason>
            switch pullBytes() {
            case .wait: return
            case .element(let data): result = .success(data)
            case .end: result = .success(nil)
            case .failed(let reason): result = .failure(reason)
            }
            bytesWaiter = nil
            loop.resumingInput { waiter.resume(returning: result) }
        }
    }

    // MARK: Writing

    func write(_ bytes: [UInt8]) {
        guard !isClosed, !isClosing, socket != nil, !bytes.isEmpty else { return }
        pendingOutput.append(contentsOf: bytes)
        scheduleFlush()
    }

    func write(text: String, newline: Bool) {
        guard !isClosed, !isClosing, socket != nil else { return }
        pendingOutput.append(contentsOf: text.utf8)
        if newline { pendingOutput.append(0x0A) }
        scheduleFlush()
    }

    private func write(_ payload: Payload) {
        switch payload {
        case .bytes(let bytes): write(bytes)
        case .text(let text, let newline): write(text: text, newline: newline)
        }
    }

    /// An async `send`: written at once unless the output is over its limit (or other senders
    /// wait already, which keeps them in order).
    func trySend(_ payload: Payload) -> Pull<Void> {
        if let reason = closeReason { return .failed(reason) }
        if isClosing || socket == nil { return .failed(.closed) }
        if isPausedForOutput || firstSender < senders.count { return .wait }
        write(payload)
        if let reason = closeReason { return .failed(reason) }
        return .element(())
    }

    func parkSender(_ payload: Payload,
                    _ continuation: UnsafeContinuation<Result<Void, Connection.CloseReason>, Never>)
    {
        senders.append(Sender(payload: payload, continuation: continuation))
    }

    /// Output drained below half the limit: the waiting senders write, in order, until the
    /// output is over the limit again.
    private func resumeSenders() {
        while firstSender < senders.count, !isPausedForOutput, closeReason == nil, !isClosing {
            let sender = senders[firstSender]
            firstSender += 1
            write(sender.payload)
            let result: Result<Void, Connection.CloseReason> = closeReason.map { .failure($0) } ?? .success(())
            loop.resumingInput { sender.continuation.resume(returning: result) }
        }
        if firstSender == senders.count {
            senders.removeAll(keepingCapacity: senders.capacity <= 16)
            firstSender = 0
        }
    }

    /// Output is handed to libevent before the loop next polls, or at once past 64 KiB or past
    /// the output limit (so that backpressure sees it).
    private func scheduleFlush() {
        if pendingOutput.count >= Self.chunk || pendingOutput.count + (socket?.outputLength ?? 0) > options.outputLimit {
            flushPendingOutput()
        } else if !flushScheduled {
            flushScheduled = true
            loop.beforeNextPoll(self)
        }
    }

    /// Hands the buffered output to libevent.
    private func flushPendingOutput() {
        guard !pendingOutput.isEmpty, let socket else { return }
        do {
            try socket.write(pendingOutput)
        } catch {
            pendingOutput.removeAll()
            finish(.error(ENOMEM))
            return
        }
        pendingOutput.removeAll(keepingCapacity: pendingOutput.capacity <= Self.retainedCapacity)
        didWrite(socket)
    }

    private func didWrite(_ socket: BufferedSocket) {
        if !isPausedForOutput && socket.outputLength > options.outputLimit {
            isPausedForOutput = true
            updateReading()
            socket.setWriteLowWatermark(options.outputLimit / 2)
        }
    }

    func shutdownOutput() {
        flushPendingOutput()
        guard !isClosed, let socket else { return }
        wantsOutputShutdown = true
        if socket.outputLength == 0 { socket.shutdownWrite() }
    }

    func closeGracefully() {
        flushPendingOutput()
        guard !isClosed, !isClosing, let socket else { return }
        isClosing = true
        isReading = false
        updateReading()
        endAsyncOperationsForClosing()
        if socket.outputLength == 0 {
            finish(.closed)
        } else {
            socket.setWriteLowWatermark(0)
            socket.setTimeouts(readNanoseconds: nil, writeNanoseconds: max(1, options.closeTimeout.clampedNanoseconds))
        }
    }

    /// Closing: no more input for the consumer, no more output for the senders.
    private func endAsyncOperationsForClosing() {
        if let waiter = lineWaiter {
            lineWaiter = nil
            waiter.resume(returning: .success(nil))
        }
        if let waiter = bytesWaiter {
            bytesWaiter = nil
            waiter.resume(returning: .success(nil))
        }
        failSenders(.closed)
    }

    private func failSenders(_ reason: Connection.CloseReason) {
        let waiting = senders[firstSender...]
        senders = []
        firstSender = 0
        for sender in waiting { sender.continuation.resume(returning: .failure(reason)) }
    }

    func setCloseHandler(_ handler: @escaping (Connection.CloseReason) -> Void) {
        if let closeReason {
            loop.execute { [handler = UncheckedHandler(handler)] in handler.call(closeReason) }
        } else {
            closeHandler = handler
        }
    }

    /// The reason, if closed already; otherwise `continuation` is resumed with it on close.
    func awaitClose(_ continuation: UnsafeContinuation<Connection.CloseReason, Never>) {
        if let closeReason {
            continuation.resume(returning: closeReason)
        } else {
            closeWaiters.append(continuation)
        }
    }

    /// `done` runs once an outgoing connection is established or has failed (it resumes a task).
    func awaitConnect(_ done: @escaping (Result<Void, EventLoopError>) -> Void) {
        if let closeReason {
            done(.failure(connectFailure(closeReason)))
        } else if isConnected {
            done(.success(()))
        } else {
            connectWaiter = done
        }
    }

    private func connectFailure(_ reason: Connection.CloseReason) -> EventLoopError {
        if case .error(let code) = reason { return .system(function: "connect \(remoteAddress)", errno: code) }
        return .loopClosed
    }

    /// A task using the connection was cancelled: the connection closes at once (output that was
    /// not sent is dropped) and every suspended operation ends with `.cancelled`.
    func cancel() {
        finish(.cancelled)
    }

    /// The last `Connection` handle is gone: nobody can read, write or close it any more, so it
    /// closes (gracefully) — unless a callback handler still holds on to it.
    func handleReleased() {
        guard !isClosed, lineHandler == nil, bytesHandler == nil, closeHandler == nil else { return }
        closeGracefully()
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

    private func handle(_ event: SocketEvent, errno code: Int32) {
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

    private func drained() {
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
    private func finish(_ reason: Connection.CloseReason) {
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

    /// Input buffered beyond this stops libevent reading the socket until we consume it.
    private static let inputLimit = 4 * chunk

    private func configureSocket() {
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
    private final class Target: BufferedSocketTarget {
        weak var source: ConnectionSource?
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
private struct UncheckedHandler: @unchecked Sendable {
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
