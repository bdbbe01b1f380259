import Synchronization

/// A TCP connection on a loop (libevent's bufferevent underneath): read lines or bytes, write
/// with backpressure, half-close, close, idle timeout, and one close notification — with
/// callbacks on the loop's thread, or from any task with `async` calls.
///
/// ## Two ways to use it
/// - **Callbacks** (the lower, fastest layer): `readLines`, `readBytes`, `write`, `writeLine`,
///   `onClose`. Loop thread only (a precondition names the call otherwise).
/// - **Async**: `for try await event in connection.lines`, `bytes`, `try await send(…)`,
///   `await closed`, `Connection.connect(…) async`. Any task, any thread;
///   fastest from a task that prefers the connection's loop
///   (`group.addTask(executorPreference: connection.loop) { … }`): then a line that is already
///   buffered, or a `send` below the output limit, costs no hop, no lock and no suspension, and
///   a task waiting for input is resumed with one post. From another thread each call costs a
///   round trip to the loop.
///
/// The handle is `Sendable`: it only carries the loop, the address and a reference to the
/// connection's loop-side state, which only the loop's thread touches.
///
/// ## Backpressure
/// Output is buffered. When more than `Options.outputLimit` bytes are waiting for a peer that
/// reads too slowly, the connection stops reading (and stops delivering what it already read)
/// until the output has drained to half the limit, and an async `send` suspends until then. So a
/// client that sends requests but never reads the replies costs at most about `outputLimit` of
/// memory, and cannot starve other connections. Input is read only as fast as it is consumed:
/// a handler or task that does not take it leaves it in the kernel, and the peer's sends block.
///
/// ## Lifecycle
/// Reading starts when you call `readLines` or `readBytes`, or iterate `lines` or `bytes` (one
/// consumer per connection). The peer's end of input arrives as `.endOfFile`; the connection
/// stays open so you can still reply. `close()` (any thread) sends what is buffered, then closes; `onClose`
/// runs exactly once with the reason, after which nothing else is delivered. When the last
/// handle on a connection goes away and no callback handler holds it, it is closed the same
/// way (what was written is still sent).
public final class Connection: @unchecked Sendable {
    /// Limits and timeouts of a connection.
    ///
    /// Checked when a listener or an outgoing connection is made with them: a `maxLineLength` or
    /// `outputLimit` below 1, or an `idleTimeout` that is zero or negative (a period, see
    /// <doc:Durations>), stops the program with a message naming it. `closeTimeout` is a wait:
    /// negative counts as zero (close without waiting for the output).
    public struct Options: Sendable, Equatable {
        /// The longest line `readLines` delivers; longer ones are reported as `.tooLong`.
        public var maxLineLength: Int
        /// Buffered output above which reading pauses until half of it has drained.
        public var outputLimit: Int
        /// Closes the connection (reason `.idleTimeout`) after this long without input; nil: never.
        public var idleTimeout: Duration?
        /// How long `close()` waits for buffered output to drain before closing anyway.
        public var closeTimeout: Duration

        /// Stops the program when an option breaks the rules above; `function` is the call.
        func check(_ function: StaticString) {
            requireUsage(maxLineLength > 0, "Mainspring: \(function): Connection.Options.maxLineLength must be at least 1, not \(maxLineLength)")
            requireUsage(outputLimit > 0, "Mainspring: \(function): Connection.Options.outputLimit must be at least 1, not \(outputLimit)")
            if let idleTimeout { _ = requirePositive(idleTimeout, "\(function): Connection.Options.idleTimeout") }
        }

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

    /// Why a connection closed. Delivered once, to `onClose`; returned by `await closed`; and
    /// thrown by the async operations that the close interrupted.
    public enum CloseReason: Error, Sendable, Equatable, CustomStringConvertible {
        /// `close()` was called (and the output was sent, or `closeTimeout` passed), or the last
        /// handle went away.
        case closed
        /// No input arrived for `Options.idleTimeout`.
        case idleTimeout
        /// The socket failed (`ECONNRESET`, `ECONNREFUSED`, …).
        case error(Int32)
        /// A task iterating or sending was cancelled, or the loop shut down with the connection
        /// still open (`EventLoopGroup.shutdown` after its grace period): closed at once, output
        /// not yet sent dropped.
        case cancelled

        public var description: String {
            switch self {
            case .closed: return "closed"
            case .idleTimeout: return "idle timeout"
            case .error(let code): return "error \(code) (\(errnoName(code)))"
            case .cancelled: return "cancelled"
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

    /// Loop thread only: every member that touches it checks the thread, or hops to the loop.
    let source: ConnectionSource
    /// Which consumer reads the input: none yet, callbacks, or one async iteration.
    let inputConsumer = Atomic<UInt8>(InputConsumer.none.rawValue)

    enum InputConsumer: UInt8 {
        case none, callbacks, lines, bytes
    }

    init(source: ConnectionSource) {
        self.source = source
        self.loop = source.loop
        self.remoteAddress = source.remoteAddress
    }

    deinit {
        // Nobody can use the connection any more: close it, unless callbacks still hold it.
        guard !source.shared.isClosed.load(ordering: .acquiring) else { return }
        // Posted, even on the loop's thread: the handle may go away in the middle of the
        // source's own work (a handler that captured it being released).
        let source = UncheckedSource(source)
        loop.execute { source.value.handleReleased() }
    }

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

    /// The loop the connection lives on (the handle keeps it alive). Any thread.
    public let loop: EventLoop

    /// The peer's address ("127.0.0.1:5000"), or the address connected to. Any thread.
    public let remoteAddress: String

    /// Whether the connection is still open. Any thread (on another thread the answer may be
    /// a moment old).
    public var isOpen: Bool { !source.shared.isClosed.load(ordering: .acquiring) }

    /// Bytes written but not yet sent to the peer. Loop thread only.
    public var bufferedOutputBytes: Int {
        loop.preconditionOnLoop("Connection.bufferedOutputBytes")
        return source.bufferedOutputBytes
    }

    /// Whether reading is paused because the peer is not taking our output (see Backpressure).
    /// Loop thread only.
    public var isReadingPaused: Bool {
        loop.preconditionOnLoop("Connection.isReadingPaused")
        return source.isPausedForOutput
    }

    /// Delivers the peer's input as lines, following the `LineEvent` rules (`maxLineLength`
    /// from the options), then `.endOfFile` once when the peer closes its side. Replaces any
    /// previous reader. Loop thread only; not with an async iteration of `lines` or `bytes`
    /// (precondition).
    public func readLines(_ handler: @escaping (LineEvent) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.readLines(_:)") }
        claimInput(.callbacks, "Connection.readLines(_:)")
        source.startReading(lines: handler, bytes: nil)
    }

    /// Delivers the peer's input as it arrives, in chunks of at most 64 KiB, then `.endOfFile`.
    /// Loop thread only; not with an async iteration of `lines` or `bytes` (precondition).
    public func readBytes(_ handler: @escaping (Input) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.readBytes(_:)") }
        claimInput(.callbacks, "Connection.readBytes(_:)")
        source.startReading(lines: nil, bytes: handler)
    }

    /// Makes `consumer` the reader of the input, or stops the program: one async iteration per
    /// connection, and no mixing of callbacks and iteration.
    func claimInput(_ consumer: InputConsumer, _ function: StaticString) {
        let (claimed, current) = inputConsumer.compareExchange(
            expected: InputConsumer.none.rawValue, desired: consumer.rawValue, ordering: .relaxed)
        if claimed || (consumer == .callbacks && current == InputConsumer.callbacks.rawValue) { return }
        let holder = switch InputConsumer(rawValue: current) {
        case .lines: "an iteration of `lines`"
        case .bytes: "an iteration of `bytes`"
        default: "readLines/readBytes callbacks"
        }
        usageFailure("Mainspring: \(function): this connection's input already has a consumer (\(holder)); "
            + "a connection's input is read once, by one iteration of `lines` or `bytes`, or by callbacks")
    }

    /// Queues bytes for the peer. Never blocks; see Backpressure. Ignored once closing.
    public func write(_ bytes: some Sequence<UInt8>) {
        source.withLoop { $0.preconditionOnLoop("Connection.write(_:)") }
        source.write(Array(bytes))
    }

    /// Queues the UTF-8 bytes of `text`.
    public func write(_ text: String) {
        source.withLoop { $0.preconditionOnLoop("Connection.write(_:)") }
        source.write(text: text, newline: false)
    }

    /// Queues the UTF-8 bytes of `text` and a `\n`, without building a new string (the usual
    /// reply of a line protocol).
    public func writeLine(_ text: String) {
        source.withLoop { $0.preconditionOnLoop("Connection.writeLine(_:)") }
        source.write(text: text, newline: true)
    }

    /// Sends what is buffered, then half-closes: the peer reads end of file, and this side can
    /// still read.
    public func shutdownOutput() {
        source.withLoop { $0.preconditionOnLoop("Connection.shutdownOutput()") }
        source.shutdownOutput()
    }

    /// Stops reading, sends what is buffered (for at most `Options.closeTimeout`), then closes
    /// the socket and runs `onClose(.closed)`. Idempotent. Any thread: on the loop's thread the
    /// close starts at once, from elsewhere it is posted to the loop; it never waits — `await
    /// closed` does.
    public func close() {
        if loop.isCurrent {
            source.closeGracefully()
        } else {
            let source = UncheckedSource(source)
            loop.execute { source.value.closeGracefully() }
        }
    }

    /// Runs `handler` once when the connection closes, with the reason. If it is already closed,
    /// `handler` runs on the next loop turn.
    public func onClose(_ handler: @escaping (CloseReason) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.onClose(_:)") }
        source.setCloseHandler(handler)
    }
}

/// Carries the loop-side state to the loop's thread (only used there).
struct UncheckedSource: @unchecked Sendable {
    let value: ConnectionSource
    init(_ value: ConnectionSource) { self.value = value }
}
