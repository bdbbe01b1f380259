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
