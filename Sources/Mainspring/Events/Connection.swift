/// A TCP connection on a loop (libevent's bufferevent underneath): read lines or bytes, write
/// with backpressure, half-close, close, idle timeout, and one close notification.
///
/// ## Backpressure
/// Output is buffered. When more than `Options.outputLimit` bytes are waiting for a peer that
/// reads too slowly, the connection stops reading (and stops delivering what it already read)
/// until the output has drained to half the limit. So a client that sends requests but never
/// reads the replies costs at most about `outputLimit` of memory, and cannot starve other
/// connections.
///
/// ## Lifecycle
/// Reading starts when you call `readLines` or `readBytes`. The peer's end of input arrives as
/// `.endOfFile`; the connection stays open so you can still reply. `close()` sends what is
/// buffered, then closes; `onClose` runs exactly once with the reason, after which nothing else
/// is delivered.
///
/// Loop-bound: use a connection on its loop's thread only.
public final class Connection {
    /// Limits and timeouts of a connection.
    public struct Options: Sendable, Equatable {
        /// The longest line `readLines` delivers; longer ones are reported as `.tooLong`.
        public var maxLineLength: Int
        /// Buffered output above which reading pauses until half of it has drained.
        public var outputLimit: Int
        /// Closes the connection (reason `.idleTimeout`) after this long without input; nil: never.
        public var idleTimeout: Duration?
        /// How long `close()` waits for buffered output to drain before closing anyway.
        public var closeTimeout: Duration

        /// Options with the documented defaults: 64 KiB lines, 1 MiB output, no idle timeout,
        /// 10 s to flush on close.
        public init(maxLineLength: Int = 65_536, outputLimit: Int = 1 << 20, idleTimeout: Duration? = nil,
                    closeTimeout: Duration = .seconds(10))
        {
            self.maxLineLength = maxLineLength
            self.outputLimit = outputLimit
            self.idleTimeout = idleTimeout
            self.closeTimeout = closeTimeout
        }
    }

    /// Why a connection closed. Delivered once, to `onClose`.
    public enum CloseReason: Sendable, Equatable, CustomStringConvertible {
        /// `close()` was called (and the output was sent, or `closeTimeout` passed).
        case closed
        /// No input arrived for `Options.idleTimeout`.
        case idleTimeout
        /// The socket failed (`ECONNRESET`, `ECONNREFUSED`, …).
        case error(Int32)

        public var description: String {
            switch self {
            case .closed: return "closed"
            case .idleTimeout: return "idle timeout"
            case .error(let code): return "error \(code) (\(errnoName(code)))"
            }
        }
    }

    /// Bytes read from the peer, for `readBytes`.
    public enum Input: Sendable, Equatable {
        /// The next bytes from the peer, at most 64 KiB at a time.
        case bytes([UInt8])
        /// The peer closed its side of the connection; reported once, after the last bytes.
        case endOfFile
    }

    let source: ConnectionSource

    init(source: ConnectionSource) { self.source = source }

    /// Connects to `host:port` (an IPv4 or IPv6 literal, or "localhost") from `loop`. The
    /// connection is usable at once: writes are buffered until it is established; a failure
    /// arrives as `onClose(.error(ECONNREFUSED))`. Loop thread only.
    /// - Throws: `EventLoopError.invalidAddress`, `.wrongThread`, `.system`.
    public static func connect(to host: String, port: UInt16, on loop: EventLoop, options: Options = .init())
        throws(EventLoopError) -> Connection
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Connection.connect(to:port:on:options:)") }
        let source = try ConnectionSource(loop: loop, connectingTo: host, port: port, options: options)
        return Connection(source: source)
    }

    /// The loop the connection lives on.
    public var loop: EventLoop { source.loop }

    /// The peer's address ("127.0.0.1:5000"), or the address connected to.
    public var remoteAddress: String { source.remoteAddress }

    /// Whether the connection is still open (`onClose` has not run).
    public var isOpen: Bool { !source.isClosed }

    /// Bytes written but not yet sent to the peer.
    public var bufferedOutputBytes: Int { source.bufferedOutputBytes }

    /// Whether reading is paused because the peer is not taking our output (see Backpressure).
    public var isReadingPaused: Bool { source.isPausedForOutput }

    /// Delivers the peer's input as lines, following the `LineEvent` rules (`maxLineLength`
    /// from the options), then `.endOfFile` once when the peer closes its side. Replaces any
    /// previous reader.
    public func readLines(_ handler: @escaping (LineEvent) -> Void) {
        source.loop.preconditionOnLoop("Connection.readLines(_:)")
        source.startReading(lines: handler, bytes: nil)
    }

    /// Delivers the peer's input as it arrives, in chunks of at most 64 KiB, then `.endOfFile`.
    public func readBytes(_ handler: @escaping (Input) -> Void) {
        source.loop.preconditionOnLoop("Connection.readBytes(_:)")
        source.startReading(lines: nil, bytes: handler)
    }

    /// Queues bytes for the peer. Never blocks; see Backpressure. Ignored once closing.
    public func write(_ bytes: some Sequence<UInt8>) {
        source.loop.preconditionOnLoop("Connection.write(_:)")
        source.write(Array(bytes))
    }

    /// Queues the UTF-8 bytes of `text`.
    public func write(_ text: String) {
        source.loop.preconditionOnLoop("Connection.write(_:)")
        source.write(text: text, newline: false)
    }

    /// Queues the UTF-8 bytes of `text` and a `\n`, without building a new string (the usual
    /// reply of a line protocol).
    public func writeLine(_ text: String) {
        source.loop.preconditionOnLoop("Connection.writeLine(_:)")
        source.write(text: text, newline: true)
    }

    /// Sends what is buffered, then half-closes: the peer reads end of file, and this side can
    /// still read.
    public func shutdownOutput() {
        source.loop.preconditionOnLoop("Connection.shutdownOutput()")
        source.shutdownOutput()
    }

    /// Stops reading, sends what is buffered (for at most `Options.closeTimeout`), then closes
    /// the socket and runs `onClose(.closed)`. Idempotent.
    public func close() {
        source.loop.preconditionOnLoop("Connection.close()")
        source.closeGracefully()
    }

    /// Runs `handler` once when the connection closes, with the reason. If it is already closed,
    /// `handler` runs on the next loop turn.
    public func onClose(_ handler: @escaping (CloseReason) -> Void) {
        source.loop.preconditionOnLoop("Connection.onClose(_:)")
        source.setCloseHandler(handler)
    }
}

@available(*, unavailable)
extension Connection: Sendable {}

/// The loop side of a `Connection`.
final class ConnectionSource: Source {
    private var socket: BufferedSocket?
    private let target = Target()
    let remoteAddress: String
    let options: Connection.Options

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
    private var buffer: [UInt8] = []
    /// Lines split but not yet delivered (delivery stops while output is paused).
    private var lineEvents: [LineEvent] = []
    private var nextLineEvent = 0

    private(set) var isPausedForOutput = false
    private var isReading = false
    private var peerEnded = false
    private var deliveredEndOfFile = false
    private var isClosing = false
    private var wantsOutputShutdown = false
    private var closeReason: Connection.CloseReason?
    private var pendingEvent: SocketEvent = []
    private var pendingErrno: Int32 = 0

    /// Bytes taken from the input buffer per turn: bounds one callback's work.
    private static let chunk = 65_536

    init(loop: EventLoop, fd: Int32, peer: String, options: Connection.Options) throws(EventLoopError) {
        _ = ignoreSIGPIPE
        self.remoteAddress = peer
        self.options = options
        self.splitter = LineSplitter(maxLineLength: options.maxLineLength)
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

    // MARK: Reading

    func startReading(lines: ((LineEvent) -> Void)?, bytes: ((Connection.Input) -> Void)?) {
        guard !isClosed, !isClosing else { return }
        lineHandler = lines
        bytesHandler = bytes
        isReading = true
        if !isPausedForOutput { socket?.enable(.read) }
        // Input may already be buffered (or the peer already gone): look at it next turn.
        loop.enqueueNextTurn(source: self)
    }

    private func deliverInput() {
        guard isReading, !isPausedForOutput, let socket else { return }
        if nextLineEvent < lineEvents.count {
            deliverLines()
            if isClosed || isClosing || isPausedForOutput { return }
        }
        if buffer.isEmpty { buffer = [UInt8](repeating: 0, count: Self.chunk) }
        let n = socket.read(into: &buffer)
        if n > 0 {
            if let bytesHandler {
                bytesHandler(.bytes(Array(buffer[0..<n])))
            } else if lineHandler != nil {
                splitter.append(buffer[0..<n]) { lineEvents.append($0) }
                deliverLines()
            }
        }
        if isClosed || isClosing || isPausedForOutput { return }
        if socket.inputLength > 0 {
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
        if nextLineEvent == lineEvents.count {
            lineEvents.removeAll(keepingCapacity: true)
            nextLineEvent = 0
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

    /// Output is handed to libevent before the loop next polls, or at once past 64 KiB or past
    /// the output limit (so that backpressure sees it).
    private func scheduleFlush() {
        if pendingOutput.count >= Self.chunk || pendingOutput.count + (socket?.outputLength ?? 0) > options.outputLimit {
            flushPendingOutput()
        } else if !flushScheduled {
            flushScheduled = true
            loop.beforeNextPoll { [weak self] in
                self?.flushScheduled = false
                self?.flushPendingOutput()
            }
        }
    }

    /// Hands the buffered output to libevent.
    private func flushPendingOutput() {
        guard !pendingOutput.isEmpty, let socket else { return }
        do {
            try socket.write(pendingOutput)
        } catch {
            pendingOutput.removeAll()
            finish(.error(12 /* ENOMEM */))
            return
        }
        pendingOutput.removeAll(keepingCapacity: true)
        didWrite(socket)
    }



    private func didWrite(_ socket: BufferedSocket) {
        if !isPausedForOutput && socket.outputLength > options.outputLimit {
            isPausedForOutput = true
            socket.disable(.read)
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
        socket.disable(.read)
        if socket.outputLength == 0 {
            finish(.closed)
        } else {
            socket.setWriteLowWatermark(0)
            socket.setTimeouts(readNanoseconds: nil, writeNanoseconds: max(1, options.closeTimeout.clampedNanoseconds))
        }
    }

    func setCloseHandler(_ handler: @escaping (Connection.CloseReason) -> Void) {
        if let closeReason {
            loop.execute { [handler = UncheckedHandler(handler)] in handler.call(closeReason) }
        } else {
            closeHandler = handler
        }
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
            finish(.error(code == 0 ? 104 /* ECONNRESET */ : code))
        } else if event.contains(.timeout) {
            finish(isClosing ? .closed : .idleTimeout)
        } else if event.contains(.endOfFile) {
            peerEnded = true
            if isClosing { return }
            deliverInput()
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
            if isReading {
                socket.enable(.read)
                deliverInput()
            }
        }
    }

    /// Closes the socket and reports `reason`, once.
    private func finish(_ reason: Connection.CloseReason) {
        guard closeReason == nil else { return }
        closeReason = reason
        pendingOutput.removeAll()
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
            // Closed by the loop going away: no handler runs.
            closeReason = .closed
            socket = nil
        }
        lineHandler = nil
        bytesHandler = nil
        closeHandler = nil
    }

    /// Receives libevent's callbacks and fires the source (no user code inside the poll).
    private final class Target: BufferedSocketTarget {
        weak var source: ConnectionSource?
        override func socketReadable() { source?.fire(.read) }
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

#if canImport(Glibc)
import Glibc
#endif

/// "ECONNRESET"-style text for an errno, for messages.
func errnoName(_ code: Int32) -> String { String(cString: strerror(code)) }
