@_spi(MainspringHTTP) import MainspringCore

/// A WebSocket connection (RFC 6455) on a Mainspring loop: messages in as an `AsyncSequence`,
/// messages out with backpressure, pings answered, the closing handshake with a deadline.
///
/// A server gets one from a route (`HTTPRoutes.webSocket(_:match:configuration:shouldUpgrade:_:)`),
/// on the loop that read the upgrade request; a client makes one with
/// `connect(to:on:configuration:subprotocols:headers:)`.
///
/// ```swift
/// routes.webSocket("/ws/echo") { socket in
///     for await message in socket.messages {       // text and binary, fragments joined
///         try await socket.send(message)            // suspends while the peer reads slowly
///     }
/// }
/// ```
///
/// ## Threads
/// The handle is `Sendable`. Its state lives on its loop: every call works from any task, and
/// costs no hop from a task that prefers the loop (a route's handler runs in one), one round
/// trip to the loop otherwise.
///
/// ## Input
/// Frames are read as they arrive, checked (masking, reserved bits and opcodes, control frame
/// rules, UTF-8 of text fragment by fragment, the size limit against each frame's declared
/// length before it is buffered), pings answered with pongs at once. Whole messages wait in a
/// queue for `messages`; with `Configuration.maxQueuedMessages` waiting, reading pauses (TCP
/// slows the peer down). Bad input fails the connection with the RFC's code: 1002 for a
/// protocol error, 1007 for invalid UTF-8, 1009 for a message over `maxMessageBytes`.
///
/// ## Closing
/// `close(code:reason:)` sends a close frame and waits for the peer's, at most
/// `Configuration.closeTimeout`; the peer's close frame is answered with the same code. After a
/// close frame was sent, `send` throws `WebSocketError.closed` and messages that still arrive
/// are dropped. `closed` says how it ended (`CloseStatus`). A handle that goes away while open
/// closes with 1001; a route's WebSocket closes (1000) when its handler returns.
public final class WebSocket: Sendable {
    let core: WebSocketCore
    /// The subprotocol agreed in the handshake (`Sec-WebSocket-Protocol`), if any.
    public let subprotocol: String?
    /// The upgrade request, on the server side (nil on a client).
    public let request: HTTPRequest?

    init(core: WebSocketCore, subprotocol: String?, request: HTTPRequest?) {
        self.core = core
        self.subprotocol = subprotocol
        self.request = request
    }

    deinit {
        let core = self.core
        core.loop.execute { core.handleReleased() }
    }

    /// The loop the WebSocket lives on.
    public var loop: EventLoop { core.loop }

    /// Whether messages can still be sent: no close frame sent yet, the connection open. Any
    /// thread (elsewhere than the loop the answer may be a moment old).
    public var isOpen: Bool { !core.isClosing }

    // MARK: Receiving

    /// The peer's messages, in order, each whole; the sequence ends when the closing handshake
    /// starts (either side) or the connection is lost — then `closed` says why. Iterate it from
    /// one task at a time (two at once are a precondition failure). Cancelling the iterating
    /// task ends it and closes the WebSocket (1001).
    public var messages: Messages { Messages(socket: self) }

    /// `WebSocket.messages`: an `AsyncSequence` of `Message`s that does not throw.
    public struct Messages: AsyncSequence, Sendable {
        public typealias Element = Message
        public typealias Failure = Never
        let socket: WebSocket

        public func makeAsyncIterator() -> Iterator { Iterator(socket: socket) }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let socket: WebSocket

            /// The next message, or nil at the end.
            public nonisolated(nonsending) mutating func next() async -> Message? {
                await socket.receive()
            }

            /// `next()`, on the caller's executor.
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async -> Message? {
                await socket.receive()
            }
        }
    }

    /// The next message, or nil once the closing handshake has started or the connection is
    /// gone. What one step of `messages` does.
    public nonisolated(nonsending) func receive() async -> Message? {
        let core = self.core
        if Task.isCancelled {
            startClosing(code: .goingAway, reason: "")
            return nil
        }
        if core.loop.isCurrent, let ready = core.takeReady() { return ready }
        return await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Message?, Never>) in
                core.loop.executeNowOrPostForHTTP({ core.waitForMessage(continuation) },
                                                  orElse: { continuation.resume(returning: nil) })
            }
        } onCancel: {
            core.loop.execute { core.readerCancelled() }
        }
    }

    // MARK: Sending

    /// Sends a text message. Returns once it is queued for the socket; suspends first while
    /// more than `Configuration.outputLimit` bytes wait for the peer, until half have drained
    /// (each concurrent sender adds at most its one message over the limit).
    /// - Throws: `WebSocketError.closed` once a close frame was sent or the connection is gone;
    ///   `.cancelled` when the task is cancelled while it waits (the message stays queued, the
    ///   WebSocket closes with 1001).
    public nonisolated(nonsending) func send(text: String) async throws(WebSocketError) {
        if core.compresses { return try await send(message: .text, Array(text.utf8)) }
        var text = text
        let frame = text.withUTF8 { core.encode(.text, UnsafeRawBufferPointer($0)) }
        try await send(encoded: frame)
    }

    /// Sends a binary message; see `send(text:)`.
    public nonisolated(nonsending) func send(binary bytes: [UInt8]) async throws(WebSocketError) {
        if core.compresses { return try await send(message: .binary, bytes) }
        let frame = bytes.withUnsafeBytes { core.encode(.binary, $0) }
        try await send(encoded: frame)
    }

    /// Sends `message` as it is (text or binary); see `send(text:)`.
    public nonisolated(nonsending) func send(_ message: Message) async throws(WebSocketError) {
        switch message {
        case .text(let text): try await send(text: text)
        case .binary(let bytes): try await send(binary: bytes)
        }
    }

    private nonisolated(nonsending) func send(encoded frame: [UInt8]) async throws(WebSocketError) {
        let core = self.core
        try await send { core.write(encoded: frame) }
    }

    /// A message compressed on the loop (permessage-deflate).
    private nonisolated(nonsending) func send(message opcode: WebSocketOpcode, _ payload: [UInt8]) async throws(WebSocketError) {
        let core = self.core
        try await send { core.write(message: opcode, payload) }
    }

    /// Runs `write` on the loop, then waits while the output is over the limit.
    private nonisolated(nonsending) func send(
        _ write: @escaping @Sendable () -> (written: Bool, mustWait: Bool)
    ) async throws(WebSocketError) {
        let core = self.core
        let outcome: (written: Bool, mustWait: Bool)
        if core.loop.isCurrent {
            outcome = write()
        } else {
            outcome = await withUnsafeContinuation { continuation in
                core.loop.execute(priority: .normal, { continuation.resume(returning: write()) },
                                  orElse: { continuation.resume(returning: (false, false)) })
            }
        }
        guard outcome.written else { throw .closed(core.loop.isCurrent ? core.finalStatus : nil) }
        if outcome.mustWait {
            let writable: Bool
            do {
                writable = try await core.connection.waitUntilWritable()
            } catch {
                throw .closed(nil)
            }
            if !writable && Task.isCancelled {
                // The library's rule for a cancelled send: the message is queued (it goes out
                // before the close frame) and the WebSocket closes, as for a cancelled reader.
                startClosing(code: .goingAway, reason: "")
                throw .cancelled
            }
        }
    }

    /// Sends a text message unless more than `Configuration.outputLimit` bytes wait for the
    /// peer (or the WebSocket is closing): never suspends, never buffers without bound. Returns
    /// whether it was taken. Any thread. The form for fan-out to many peers, each with its own
    /// slow-consumer policy (drop the message, or close the slow peer).
    public func trySend(text: String) -> Bool {
        if core.compresses { return offer(message: .text, Array(text.utf8)) }
        var text = text
        return offer(text.withUTF8 { core.encode(.text, UnsafeRawBufferPointer($0)) })
    }

    /// `trySend(text:)` for a binary message.
    public func trySend(binary bytes: [UInt8]) -> Bool {
        if core.compresses { return offer(message: .binary, bytes) }
        return offer(bytes.withUnsafeBytes { core.encode(.binary, $0) })
    }

    private func offer(message opcode: WebSocketOpcode, _ payload: [UInt8]) -> Bool {
        core.loop.isCurrent ? core.offer(message: opcode, payload) : core.offerFromElsewhere(message: opcode, payload)
    }

    /// Whether permessage-deflate was agreed: this side's messages are compressed, the peer's
    /// may be.
    public var isCompressed: Bool { core.compresses }

    private func offer(_ frame: [UInt8]) -> Bool {
        core.loop.isCurrent ? core.offer(encoded: frame) : core.offerFromElsewhere(encoded: frame)
    }

    /// Sends a ping with `payload` (at most 125 bytes; longer is cut). The peer's pong is
    /// consumed by the keep-alive. Any thread.
    public func ping(_ payload: [UInt8] = []) {
        let core = self.core
        let cut = Array(payload.prefix(125))
        if core.loop.isCurrent { core.ping(cut) } else { core.loop.execute { core.ping(cut) } }
    }

    // MARK: Closing

    /// Starts the closing handshake with `code` and `reason` (cut to 123 bytes of UTF-8), without
    /// waiting: the peer's close frame is waited for at most `Configuration.closeTimeout`, then
    /// the connection closes. Idempotent; any thread. `await closed` waits for the end;
    /// ``closeAndWait(code:reason:)`` does both.
    public func close(code: CloseCode = .normalClosure, reason: String = "") {
        startClosing(code: code, reason: reason)
    }

    /// ``close(code:reason:)->()`` under a name of its own: starts the closing handshake and
    /// returns at once. In `async` code, `close(code:reason:)` resolves to the deprecated waiting
    /// form until it goes (0.3); this spelling is the one that never waits, from anywhere.
    public func startClosing(code: CloseCode = .normalClosure, reason: String = "") {
        let core = self.core
        if core.loop.isCurrent {
            core.startClose(code: code, reason: reason)
        } else {
            core.loop.execute { core.startClose(code: code, reason: reason) }
        }
    }

    /// Starts the closing handshake (see ``close(code:reason:)->()``) and returns how the WebSocket
    /// ended, once it has: within `Configuration.closeTimeout` (plus a loop turn). Any task.
    @discardableResult
    public nonisolated(nonsending) func closeAndWait(code: CloseCode = .normalClosure, reason: String = "") async
        -> CloseStatus
    {
        startClosing(code: code, reason: reason)
        return await closed
    }

    /// The old name of ``closeAndWait(code:reason:)``. In `async` code it is the one the compiler
    /// picks for `close(code:reason:)`, so a task that must not wait cannot reach the form that
    /// returns at once by this spelling.
    @available(*, deprecated, renamed: "closeAndWait(code:reason:)")
    @discardableResult
    public nonisolated(nonsending) func close(code: CloseCode = .normalClosure, reason: String = "") async -> CloseStatus {
        await closeAndWait(code: code, reason: reason)
    }

    /// How the WebSocket ended: suspends until the connection has closed. Any number of tasks
    /// may await it; cancellation does not end the wait.
    public var closed: CloseStatus {
        get async {
            let core = self.core
            return await withUnsafeContinuation { continuation in
                core.loop.executeNowOrPostForHTTP({ core.waitForClose(continuation) }, orElse: {
                    continuation.resume(returning: CloseStatus(code: .abnormalClosure, reason: "the loop shut down"))
                })
            }
        }
    }
}

extension EventLoop {
    /// Runs `work` at once on the loop's thread, else posts it (`fallback` if the loop drops it).
    func executeNowOrPostForHTTP(_ work: @escaping @Sendable () -> Void, orElse fallback: @escaping @Sendable () -> Void) {
        if isCurrent { work() } else { execute(priority: .normal, work, orElse: fallback) }
    }
}
