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
/// ## One input, readers in turn
/// Reading starts with the first reader: `readLines` or `readBytes` (callbacks), or an async
/// read (`lines`, `bytes`, `readLine()`, `read(exactly:)`, `read(upTo:)`,
/// `read(until:limit:)`). The input has one reader at a time, and readers take turns: when one
/// ends — a callback reader replaced or stopped (`stopReading()`), a task that breaks out of
/// `lines` — what it did not take stays buffered, byte for byte, for the next. So a protocol
/// can read a header line, then a body of N bytes, then lines again. Two readers at once (a
/// callback reader while a task is suspended reading, or two suspended tasks) are a
/// precondition failure with a message.
///
/// ## Lifecycle
/// The peer's end of input arrives as `.endOfFile`; the connection stays open so you can still
/// reply. `close()` (any thread) sends what is buffered, then closes; `onClose`
/// runs exactly once with the reason, after which nothing else is delivered. When the last
/// handle on a connection goes away and no callback handler holds it, it is closed the same
/// way (what was written is still sent).
public final class Connection: @unchecked Sendable {
    /// Loop thread only: every member that touches it checks the thread, or hops to the loop.
    let source: ConnectionSource

    init(source: ConnectionSource) {
        self.source = source
        self.loop = source.loop
    }

    deinit {
        // Nobody can use the connection any more: close it, unless callbacks still hold it.
        guard !source.closedFlag.load(ordering: .acquiring) else { return }
        // Posted, even on the loop's thread: the handle may go away in the middle of the
        // source's own work (a handler that captured it being released).
        let source = LoopBound(source)
        loop.execute { source.value.handleReleased() }
    }

    /// Starts connecting to `host:port` from `loop` — an IPv4 or IPv6 literal, or a host name
    /// ("localhost", a name from /etc/hosts or DNS) — and returns the connection at once, before
    /// it is established: writes are buffered until it is. Loop thread only. The `async`
    /// ``connect(to:port:on:options:)-pf2q`` returns once the connection is established instead.
    ///
    /// A name is resolved off the loop (the system's resolver on a resolver thread, within
    /// `options.resolveTimeout`) and its addresses are tried with Happy Eyeballs (RFC 8305): the
    /// preferred family first, the other `options.connectionAttemptDelay` later if the first
    /// has not answered, the first to connect wins. A failure arrives as `onClose`: a literal's
    /// as `.error(ECONNREFUSED)` (its errno), a name's as `.connectFailed` with the
    /// `EventLoopError` that names the host and every address tried.
    /// - Throws: `EventLoopError.invalidAddress` (neither a literal nor a well-formed name),
    ///   `.wrongThread`, `.system`.
    public static func startConnecting(to host: String, port: UInt16, on loop: EventLoop, options: Options = .init())
        throws(EventLoopError) -> Connection
    {
        guard loop.claimThread() else {
            throw .wrongThread(function: "Connection.startConnecting(to:port:on:options:)")
        }
        let source = try ConnectionSource(loop: loop, connectingTo: host, port: port, options: options)
        return Connection(source: source)
    }

    /// The old name of ``startConnecting(to:port:on:options:)``: in `async` code the compiler
    /// picks the `async` ``connect(to:port:on:options:)-pf2q``, which waits for the connection, for
    /// this spelling.
    @available(*, deprecated, renamed: "startConnecting(to:port:on:options:)")
    public static func connect(to host: String, port: UInt16, on loop: EventLoop, options: Options = .init())
        throws(EventLoopError) -> Connection
    {
        try startConnecting(to: host, port: port, on: loop, options: options)
    }

    /// The loop the connection lives on (the handle keeps it alive). Any thread.
    public let loop: EventLoop

    /// The peer's address ("127.0.0.1:5000"), or the address connected to. Any thread.
    public var remoteAddress: String { source.remoteAddress }

    /// Whether the connection is still open. Any thread (on another thread the answer may be
    /// a moment old).
    public var isOpen: Bool { !source.closedFlag.load(ordering: .acquiring) }

    /// Bytes written but not yet sent to the peer: what the connection holds for a peer that
    /// reads slowly. Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var bufferedOutputBytes: Int {
        loop.preconditionOnLoop("Connection.bufferedOutputBytes")
        return source.bufferedOutputBytes
    }

    /// Buffered output above which the connection stops reading and `send` suspends, until half
    /// of it has drained (`Options.outputLimit`). Any thread.
    public var outputLimit: Int { source.kept.outputLimit }

    /// Input received and not yet taken by a reader. Loop thread only. (A keep-alive client
    /// checks that nothing follows a response before it reuses the connection.)
    package var bufferedInputBytes: Int {
        loop.preconditionOnLoop("Connection.bufferedInputBytes")
        return source.socket?.inputLength ?? 0
    }

    /// Whether the peer has ended its side (its end of file has arrived, delivered or not).
    /// Loop thread only.
    package var peerHasEnded: Bool {
        loop.preconditionOnLoop("Connection.peerHasEnded")
        return source.state.peerEnded
    }

    /// Whether reading is paused because the peer is not taking our output (see Backpressure).
    /// Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var isReadingPaused: Bool {
        loop.preconditionOnLoop("Connection.isReadingPaused")
        return source.state.isOutputPaused
    }

    /// Delivers the peer's input as lines, following the `LineEvent` rules (`maxLineLength`
    /// from the options), then `.endOfFile` once when the peer closes its side. Loop thread
    /// only.
    ///
    /// Replaces the current callback reader: the input the previous reader did not take is
    /// delivered to this one (call it from inside a handler to switch framing mid-stream, say
    /// after a header line). Not while a task is suspended reading the connection (a
    /// precondition failure: one reader at a time).
    @available(*, noasync, message: "loop thread only; in async code read `lines` or `readLine()`")
    public func readLines(_ handler: @escaping (LineEvent) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.readLines(_:)") }
        source.startReading(.lines(handler))
    }

    /// Delivers the peer's input as it arrives, in chunks of at most 64 KiB, then `.endOfFile`.
    /// Replaces the current callback reader, as `readLines` does (nothing is lost in the
    /// switch). Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code read `bytes` or `read(upTo:)`")
    public func readBytes(_ handler: @escaping (Input) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.readBytes(_:)") }
        source.startReading(.bytes(handler))
    }

    /// Delivers exactly `count` bytes once, as one `.bytes` (an N-byte body after a header line,
    /// say), or `.endOfFile` if the input ends first (the bytes that did arrive then stay
    /// buffered for the next reader); then this reader is done — install the next one from
    /// `handler` (`readLines` again, say). Replaces the current callback reader, as `readLines`
    /// does. Bytes beyond libevent's input buffer (256 KiB) are gathered as they arrive, so a
    /// body costs its own size once. Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code use `read(exactly:)`")
    public func readBytes(exactly count: Int, _ handler: @escaping (Input) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.readBytes(exactly:_:)") }
        requireUsage(count >= 0, "Mainspring: Connection.readBytes(exactly:_:) needs a count of at least 0, not \(count)")
        source.startReading(.exactly(count, handler))
    }

    /// Ends the callback reader (`readLines` or `readBytes`): nothing more is delivered to it,
    /// and what it did not take stays buffered — byte for byte — for the next reader, callbacks
    /// or async. The socket is still read meanwhile, up to the input limit (256 KiB), then left
    /// in the kernel. Idempotent. Any thread: on the loop's thread it takes effect at once;
    /// from another it is posted to the loop (one post), and a callback already due may run
    /// before it.
    public func stopReading() {
        if source.withLoop({ $0.acceptsDirectCalls }) {
            source.stopReading()
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.stopReading() }
        }
    }

    /// Queues bytes for the peer. Never blocks; see Backpressure. Ignored once closing.
    ///
    /// Any thread. On the loop's thread the bytes are queued at once; from another thread (a
    /// task, say) the write is posted to the loop — one post at `.input` priority, as `execute`
    /// costs — and what one thread writes, sends (`send`, `trySend`) and then closes goes out in
    /// that order. In async code, `send(_:)` waits for room too.
    public func write(_ bytes: some Sequence<UInt8>) {
        let bytes = Array(bytes)
        if source.withLoop({ $0.acceptsDirectCalls }) {
            source.write(bytes)
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.write(bytes) }
        }
    }

    /// Queues the UTF-8 bytes of `text`. Any thread, as the byte-sequence `write(_:)`.
    public func write(_ text: String) {
        if source.withLoop({ $0.acceptsDirectCalls }) {
            source.write(text: text, newline: false)
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.write(text: text, newline: false) }
        }
    }

    /// Queues the UTF-8 bytes of `text` and a `\n`, without building a new string (the usual
    /// reply of a line protocol). Any thread, as the byte-sequence `write(_:)`.
    public func writeLine(_ text: String) {
        if source.withLoop({ $0.acceptsDirectCalls }) {
            source.write(text: text, newline: true)
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.write(text: text, newline: true) }
        }
    }

    /// Queues the UTF-8 bytes of a slice of a string and a `\n`: a reply that is part of its
    /// request (an echo) goes out without a string of its own (no allocation for text of
    /// more than 15 bytes). Any thread, as the byte-sequence `write(_:)` (from another thread the slice
    /// is copied into a string of its own, for the post).
    public func writeLine(_ text: Substring) {
        if source.withLoop({ $0.acceptsDirectCalls }) {
            source.write(text: text, newline: true)
        } else {
            let source = LoopBound(source)
            let text = String(text)
            loop.execute(priority: .input) { source.value.write(text: text, newline: true) }
        }
    }

    /// Sends what is buffered, then half-closes: the peer reads end of file, and this side can
    /// still read.
    ///
    /// A pipe has no half-close: on a child's standard input (``Subprocess/standardInput``)
    /// this is `close()` — the child reads end of file once what was written is sent — and on a
    /// child's standard output or error it does nothing.
    ///
    /// Any thread, as `close()`: on the loop's thread it starts at once, from elsewhere (a task)
    /// it is posted to the loop, in order with this thread's other posted calls (writes,
    /// `trySend`, `close()`): all of them post at `.input`.
    public func shutdownOutput() {
        if loop.acceptsDirectCalls {
            source.shutdownOutput()
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.shutdownOutput() }
        }
    }

    /// Stops reading, sends what is buffered (for at most `Options.closeTimeout`), then closes
    /// the socket and runs `onClose(.closed)`. Idempotent. Any thread: on the loop's thread the
    /// close starts at once, from elsewhere it is posted to the loop; it never waits — `await
    /// closed` does.
    public func close() {
        if loop.acceptsDirectCalls {
            source.closeGracefully()
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.closeGracefully() }
        }
    }

    /// Closes the connection **now**, dropping whatever output has not been sent yet, and runs
    /// `onClose(.cancelled)`; reads and sends in progress end with `.cancelled`. For "this peer
    /// must go, whatever it was owed" — a protocol violation, a shutdown past its deadline; to
    /// say goodbye first, `close()` (which sends what was queued, within `closeTimeout`).
    /// Idempotent; a no-op once closed. Any thread, as `close()`.
    public func abort() {
        if loop.acceptsDirectCalls {
            source.finish(.cancelled)
        } else {
            let source = LoopBound(source)
            loop.execute(priority: .input) { source.value.finish(.cancelled) }
        }
    }

    /// Runs `handler` once when the connection closes, with the reason. If it is already closed,
    /// `handler` runs on the next loop turn.
    @available(*, noasync, message: "loop thread only; in async code await `closed`")
    public func onClose(_ handler: @escaping (CloseReason) -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.onClose(_:)") }
        source.setCloseHandler(handler)
    }

    // MARK: Bounded fan-out

    /// Whether a write now would be taken: the connection is open and its buffered output is
    /// not over `outputLimit`. Any thread (elsewhere than the loop the answer may be a moment
    /// old).
    public var isWritable: Bool {
        !source.closedFlag.load(ordering: .acquiring) && !source.outputPausedFlag.load(ordering: .relaxed)
    }

    /// Queues `bytes` unless the output is over `outputLimit` (or the connection is closing or
    /// closed): never suspends, never buffers without bound. Returns whether they were taken.
    /// Any thread.
    ///
    /// The form for fan-out — one message to many connections, each with its own slow-consumer
    /// policy: drop the message for a connection that is full, or close it, or wait for it
    /// with `waitUntilWritable(timeout:)`. On the connection's loop the answer is exact. From
    /// another thread the bytes are posted to the loop and counted against the limit while on
    /// their way, so a connection never holds more than about twice `outputLimit` plus one
    /// message, however fast the caller offers.
    @discardableResult
    public func trySend(_ bytes: [UInt8]) -> Bool { offer(.bytes(bytes)) }

    /// `trySend(_:)` for the UTF-8 bytes of `text`.
    @discardableResult
    public func trySend(_ text: String) -> Bool { offer(.text(text, newline: false)) }

    /// `trySend(_:)` for the UTF-8 bytes of `text` and a `\n`.
    @discardableResult
    public func trySend(line text: String) -> Bool { offer(.text(text, newline: true)) }

    private func offer(_ payload: ConnectionSource.Payload) -> Bool {
        if loop.acceptsDirectCalls { return source.offer(payload) }
        let source = self.source
        guard !source.closedFlag.load(ordering: .acquiring), !source.outputPausedFlag.load(ordering: .relaxed) else {
            return false
        }
        let size = payload.count
        let inFlight = source.inFlightBytes.add(size, ordering: .relaxed).newValue
        if inFlight > outputLimit && inFlight > size {
            source.inFlightBytes.subtract(size, ordering: .relaxed)
            return false
        }
        let unchecked = LoopBound(source)
        loop.execute(priority: .input) {
            unchecked.value.deliverOffered(payload, accounted: size)
        } orElse: {
            // Only the atomic counter, which any thread may touch.
            unchecked.value.inFlightBytes.subtract(size, ordering: .relaxed)
        }
        return true
    }

    /// Makes ``outputMovedAt`` follow the output on a real loop too (a simulated loop's network
    /// reports it always): a callback each time the kernel takes some. Loop thread only.
    package func tracksOutputMovement() {
        loop.preconditionOnLoop("Connection.tracksOutputMovement()")
        source.socket?.reportOutputTaken(to: source)
    }

    /// Applies a new owner's `outputLimit` and `closeTimeout` to a connection made with other
    /// options (a WebSocket upgrade takes over a connection its server accepted). Loop thread
    /// only, while no other thread holds the connection (its `outputLimit` is read unlocked).
    package func adopt(outputLimit: Int, closeTimeout: Duration) {
        loop.preconditionOnLoop("Connection.adopt(outputLimit:closeTimeout:)")
        var options = Connection.Options()
        options.outputLimit = outputLimit
        options.closeTimeout = closeTimeout
        options.idleTimeout = source.kept.idleTimeoutNanoseconds == 0 ? nil : .nanoseconds(Int64(source.kept.idleTimeoutNanoseconds))
        source.kept = KeptOptions(options)
    }

    /// When output last left the connection (the loop's clock, ns): on a simulated loop, or on
    /// a real one after ``tracksOutputMovement()``; nil otherwise, or before any has. For a
    /// response's stall deadline. Loop thread only.
    package var outputMovedAt: UInt64? {
        let moved = source.rare?.outputMovedAt ?? 0
        return moved == 0 ? nil : moved
    }

    /// Runs `handler` once everything written so far has left the connection's buffers — handed
    /// to the kernel, or on a simulated loop to the simulation's network: on the next turn if it
    /// has now. Dropped if the connection closes first. Loop thread only. (The HTTP server's
    /// streamed responses use it for a chunk's "drained".)
    package func whenOutputSent(_ handler: @escaping () -> Void) {
        loop.preconditionOnLoop("Connection.whenOutputSent(_:)")
        source.whenOutputSent(handler)
    }

    /// Runs `handler` once the connection is writable: on the next turn if it is now,
    /// otherwise when its output has drained to half of `outputLimit`. Dropped if the
    /// connection closes first. Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code use `waitUntilWritable(timeout:)`")
    public func onWritable(_ handler: @escaping () -> Void) {
        source.withLoop { $0.preconditionOnLoop("Connection.onWritable(_:)") }
        source.whenWritable(handler)
    }
}
