@_spi(MainspringHTTP) import MainspringCore
import Synchronization

/// A WebSocket configuration as the WebSockets made with it share it: a route's, one
/// reference in each of its WebSockets rather than a copy of the whole value in each.
final class SharedWebSocketConfiguration: Sendable {
    let value: WebSocket.Configuration

    init(_ value: WebSocket.Configuration) { self.value = value }
}

/// The loop side of one WebSocket: its connection, the decoder, the messages waiting for the
/// application, the closing handshake and the keep-alive. Loop thread only, except the atomic
/// flags (`@unchecked Sendable` only so that the loop's posts and the public handle carry it).
///
/// An idle WebSocket is mostly this object, so what only the closing handshake and the end use
/// is kept in a box made when first needed (`RareState`), the configuration is the route's,
/// shared, and the decoder holds no buffer between frames.
final class WebSocketCore: @unchecked Sendable {
    let loop: EventLoop
    let connection: Connection
    private let sharedConfiguration: SharedWebSocketConfiguration
    var configuration: WebSocket.Configuration { sharedConfiguration.value }
    /// A client masks its frames and reads unmasked ones; a server the other way round.
    let isClient: Bool
    private var decoder: WebSocketDecoder

    /// Messages read and not taken yet, oldest first from `queueHead`.
    private var queue: [WebSocket.Message] = []
    private var queueHead = 0
    private var messageWaiter: UnsafeContinuation<WebSocket.Message?, Never>?
    private var isReadingPaused = false
    private var hasStarted = false

    /// A close frame was sent (or the connection failed): nothing more is sent, messages that
    /// still arrive are dropped. Written on the loop, read anywhere.
    private let closing = Atomic<Bool>(false)
    /// Bytes `trySend` posted from other threads and not yet written.
    private let postedBytes = Atomic<Int>(0)
    private var closeSent = false
    private var pingTimer: TimerHandle?
    private var heardSinceTick = true
    private var pingOutstanding = false
    /// The server endpoint whose table of open WebSockets (the one its `close()` uses) holds
    /// this one, under `ObjectIdentifier(self)`: the entry is removed when the connection
    /// closes. nil on a client.
    weak var server: LoopEndpoint?

    /// What the closing handshake and the end need, made when first written (see the
    /// properties of the same names below).
    private final class RareState {
        var peerStatus: WebSocket.CloseStatus?
        var violation: WebSocketViolation?
        var finalStatus: WebSocket.CloseStatus?
        var closedWaiters: [UnsafeContinuation<WebSocket.CloseStatus, Never>] = []
        var closeTimer: TimerHandle?
    }

    private var rare: RareState?

    private var rareState: RareState {
        if let rare { return rare }
        let made = RareState()
        rare = made
        return made
    }

    /// The peer's close frame's status (1005 for an empty one), once it came.
    private var peerStatus: WebSocket.CloseStatus? {
        get { rare?.peerStatus }
        set { if rare != nil || newValue != nil { rareState.peerStatus = newValue } }
    }

    /// What this side found wrong with the peer's input, when it failed the connection.
    private var violation: WebSocketViolation? {
        get { rare?.violation }
        set { if rare != nil || newValue != nil { rareState.violation = newValue } }
    }

    /// How it ended, once the connection has closed.
    private(set) var finalStatus: WebSocket.CloseStatus? {
        get { rare?.finalStatus }
        set { if rare != nil || newValue != nil { rareState.finalStatus = newValue } }
    }

    private var closedWaiters: [UnsafeContinuation<WebSocket.CloseStatus, Never>] {
        get { rare?.closedWaiters ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.closedWaiters = newValue } }
    }

    private var closeTimer: TimerHandle? {
        get { rare?.closeTimer }
        set { if rare != nil || newValue != nil { rareState.closeTimer = newValue } }
    }

    /// permessage-deflate's compressor for this side's messages, when it was agreed.
    private let deflater: Deflater?

    /// `agreement`: permessage-deflate as the handshake agreed it (nil: no compression).
    init(connection: Connection, configuration: SharedWebSocketConfiguration, isClient: Bool,
         agreement: DeflateAgreement? = nil)
    {
        self.loop = connection.loop
        self.connection = connection
        self.sharedConfiguration = configuration
        self.isClient = isClient
        var inflater: Inflater?
        if let agreement {
            inflater = Inflater()
            deflater = isClient
                ? Deflater(windowBits: agreement.clientMaxWindowBits, contextTakeover: !agreement.clientNoContextTakeover)
                : Deflater(windowBits: agreement.serverMaxWindowBits, contextTakeover: !agreement.serverNoContextTakeover)
        } else {
            deflater = nil
        }
        decoder = WebSocketDecoder(expectsMaskedFrames: !isClient, maxMessageBytes: configuration.value.maxMessageBytes,
                                   inflater: inflater)
    }

    /// Whether this side compresses its messages (permessage-deflate was agreed): they are then
    /// encoded on the loop, in the order they are written (the compressor's window spans them).
    var compresses: Bool { deflater != nil }

    /// Starts reading (after `leftover`, bytes that came with the handshake) and the keep-alive.
    /// Loop thread.
    func start(leftover: [UInt8]) {
        hasStarted = true
        connection.onClose { [self] reason in connectionClosed(reason) }
        if !leftover.isEmpty {
            heardSinceTick = true
            decoder.append(leftover)
        }
        drainDecoder()
        if !isReadingPaused && finalStatus == nil { connection.readBytes { [self] input in received(input) } }
        if let interval = configuration.pingInterval {
            pingTimer = loop.schedule(every: interval) { [weak self] _ in self?.keepAliveTick() }
        }
    }

    /// Whether a close frame was sent or the connection is gone. Any thread.
    var isClosing: Bool { closing.load(ordering: .acquiring) }

    // MARK: Input

    private func received(_ input: Connection.Input) {
        switch input {
        case .bytes(let bytes):
            heardSinceTick = true
            decoder.append(bytes)
            drainDecoder()
        case .endOfFile:
            // The peer ended the TCP connection: after the closing handshake that is how it
            // ends (a server closes first); before it, the connection was lost.
            connection.close()
        }
    }

    /// Takes every event the decoder has, unless reading is paused for the application.
    private func drainDecoder() {
        while !isReadingPaused && finalStatus == nil {
            let event: WebSocketEvent?
            do throws(WebSocketViolation) {
                event = try decoder.next()
            } catch {
                fail(error)
                return
            }
            guard let event else { return }
            handle(event)
        }
    }

    private func handle(_ event: WebSocketEvent) {
        switch event {
        case .message(let message):
            guard !closeSent else { return }
            if let waiter = messageWaiter {
                messageWaiter = nil
                waiter.resume(returning: message)
                return
            }
            queue.append(message)
            if queue.count - queueHead >= configuration.maxQueuedMessages { pauseReading() }
        case .ping(let payload):
            if !closeSent { writeFrame(.pong, payload) }
        case .pong:
            pingOutstanding = false
        case .close(let status):
            peerStatus = status ?? WebSocket.CloseStatus(code: .noStatusReceived)
            if !closeSent {
                // Echo the peer's code and reason (RFC 6455 §5.5.1); an empty close frame gets
                // an empty one.
                writeFrame(.close, status.map { WebSocketFrame.closePayload($0.code, reason: $0.reason) } ?? [])
                markCloseSent()
            }
            endMessages()
            if isClient {
                // The server ends the TCP connection first; wait for it, not forever.
                armCloseTimer()
            } else {
                connection.close()
            }
        }
    }

    /// Fails the connection for bad input: a close frame with the violation's code, then the
    /// connection closes once it is sent.
    private func fail(_ found: WebSocketViolation) {
        if !closeSent {
            violation = found
            writeFrame(.close, WebSocketFrame.closePayload(found.code, reason: found.reason))
            markCloseSent()
        }
        endMessages()
        connection.close()
    }

    private func pauseReading() {
        guard !isReadingPaused else { return }
        isReadingPaused = true
        connection.stopReading()
    }

    private func resumeReadingIfRoom() {
        guard isReadingPaused, queue.count - queueHead < configuration.maxQueuedMessages, finalStatus == nil else { return }
        isReadingPaused = false
        drainDecoder()
        if !isReadingPaused && finalStatus == nil { connection.readBytes { [self] input in received(input) } }
    }

    // MARK: Messages for the application (loop thread)

    /// The next message if one is ready, `.some(nil)` at the end, nil when the caller must wait.
    func takeReady() -> WebSocket.Message?? {
        if queueHead < queue.count {
            let message = queue[queueHead]
            queueHead += 1
            if queueHead == queue.count {
                queue.removeAll(keepingCapacity: true)
                queueHead = 0
            }
            resumeReadingIfRoom()
            return .some(message)
        }
        if closeSent || peerStatus != nil || finalStatus != nil { return .some(nil) }
        return nil
    }

    func waitForMessage(_ continuation: UnsafeContinuation<WebSocket.Message?, Never>) {
        if let ready = takeReady() {
            continuation.resume(returning: ready)
            return
        }
        requireUsage(messageWaiter == nil, "WebSocket.messages: iterated by two tasks at once (one reader at a time)")
        messageWaiter = continuation
    }

    /// The task waiting for a message was cancelled: it gets nil, and the WebSocket closes
    /// (1001), as a connection closes when its reader is cancelled.
    func readerCancelled() {
        guard let waiter = messageWaiter else { return }
        messageWaiter = nil
        waiter.resume(returning: nil)
        startClose(code: .goingAway, reason: "")
    }

    private func endMessages() {
        guard let waiter = messageWaiter else { return }
        messageWaiter = nil
        waiter.resume(returning: takeReady() ?? nil)
    }

    // MARK: Output (loop thread)

    private func writeFrame(_ opcode: WebSocketOpcode, _ payload: [UInt8]) {
        connection.write(payload.withUnsafeBytes {
            WebSocketFrame.encode(opcode: opcode, payload: $0, maskingKey: isClient ? UInt32.random(in: .min ... .max) : nil)
        })
    }

    /// Writes a data frame (already encoded) unless closing. Returns false when closing;
    /// `mustWait` is true when the output is now over the limit.
    func write(encoded frame: [UInt8]) -> (written: Bool, mustWait: Bool) {
        guard !closeSent, finalStatus == nil else { return (false, false) }
        connection.write(frame)
        return (true, !connection.isWritable)
    }

    /// `trySend` on the loop: writes the frame unless closing or over the output limit.
    func offer(encoded frame: [UInt8]) -> Bool {
        guard !closeSent, finalStatus == nil, connection.isWritable else { return false }
        connection.write(frame)
        return true
    }

    /// `trySend` from another thread: counted against the limit while on its way to the loop.
    func offerFromElsewhere(encoded frame: [UInt8]) -> Bool {
        post(counting: frame.count) { frame }
    }

    /// Posts the frame `make` makes on the loop, its `count` bytes counted against the output
    /// limit while on their way (false, posting nothing, when that would go over it or the
    /// socket is closing or full).
    private func post(counting count: Int, _ make: @escaping @Sendable () -> [UInt8]) -> Bool {
        guard !isClosing, connection.isWritable else { return false }
        let posted = postedBytes.wrappingAdd(count, ordering: .relaxed).newValue
        if posted - count > configuration.outputLimit {
            postedBytes.wrappingSubtract(count, ordering: .relaxed)
            return false
        }
        loop.execute { [self] in
            postedBytes.wrappingSubtract(count, ordering: .relaxed)
            if !closeSent && finalStatus == nil { connection.write(make()) }
        }
        return true
    }

    /// Encodes a data message as this side must send it (masked by a client). Without
    /// compression, any thread; with it, the loop's thread only, in sending order.
    func encode(_ opcode: WebSocketOpcode, _ payload: UnsafeRawBufferPointer) -> [UInt8] {
        let maskingKey = isClient ? UInt32.random(in: .min ... .max) : nil
        guard let deflater else { return WebSocketFrame.encode(opcode: opcode, payload: payload, maskingKey: maskingKey) }
        let compressed = deflater.compress(payload)
        return compressed.withUnsafeBytes {
            WebSocketFrame.encode(reserved: 0x40, opcode: opcode, payload: $0, maskingKey: maskingKey)
        }
    }

    /// `write(encoded:)` for a message encoded here, on the loop (compressed).
    func write(message opcode: WebSocketOpcode, _ payload: [UInt8]) -> (written: Bool, mustWait: Bool) {
        guard !closeSent, finalStatus == nil else { return (false, false) }
        return write(encoded: payload.withUnsafeBytes { encode(opcode, $0) })
    }

    /// `offer(encoded:)` for a message encoded here, on the loop (compressed).
    func offer(message opcode: WebSocketOpcode, _ payload: [UInt8]) -> Bool {
        guard !closeSent, finalStatus == nil, connection.isWritable else { return false }
        connection.write(payload.withUnsafeBytes { encode(opcode, $0) })
        return true
    }

    /// `offerFromElsewhere(encoded:)` for a message encoded on the loop (compressed).
    func offerFromElsewhere(message opcode: WebSocketOpcode, _ payload: [UInt8]) -> Bool {
        post(counting: payload.count) { [self] in payload.withUnsafeBytes { encode(opcode, $0) } }
    }

    func ping(_ payload: [UInt8]) {
        guard !closeSent, finalStatus == nil else { return }
        writeFrame(.ping, payload)
    }

    // MARK: Closing (loop thread)

    private func markCloseSent() {
        closeSent = true
        closing.store(true, ordering: .releasing)
    }

    /// Starts the closing handshake: a close frame, then the peer's is waited for (and a
    /// client waits for the server to end the connection) at most `closeTimeout`.
    func startClose(code: WebSocket.CloseCode, reason: String) {
        guard finalStatus == nil else { return }
        if !closeSent {
            let payload = code == .noStatusReceived ? [] : WebSocketFrame.closePayload(code, reason: reason)
            writeFrame(.close, payload)
            markCloseSent()
        }
        endMessages()
        if peerStatus != nil && !isClient {
            connection.close()
        } else {
            armCloseTimer()
        }
    }

    private func armCloseTimer() {
        guard closeTimer == nil, finalStatus == nil else { return }
        closeTimer = loop.schedule(after: configuration.closeTimeout) { [weak self] in
            self?.closeTimer = nil
            self?.connection.close()
        }
    }

    private func keepAliveTick() {
        if heardSinceTick || isReadingPaused {
            heardSinceTick = false
            pingOutstanding = false
            return
        }
        if pingOutstanding {
            // Nothing at all for two intervals, a ping unanswered: the peer is gone.
            pingTimer?.cancel()
            pingTimer = nil
            fail(WebSocketViolation(code: .goingAway, reason: "no answer to ping"))
            return
        }
        pingOutstanding = true
        ping([])
    }

    private func connectionClosed(_ reason: Connection.CloseReason) {
        markCloseSent()
        closeTimer?.cancel()
        closeTimer = nil
        pingTimer?.cancel()
        pingTimer = nil
        let status = peerStatus ?? WebSocket.CloseStatus(
            code: .abnormalClosure, reason: violation?.description ?? (reason == .closed ? "" : reason.description))
        finalStatus = status
        endMessages()
        let waiters = closedWaiters
        closedWaiters = []
        for waiter in waiters { waiter.resume(returning: status) }
        if let server {
            self.server = nil
            server.webSocketClosed(self)
        }
    }

    func waitForClose(_ continuation: UnsafeContinuation<WebSocket.CloseStatus, Never>) {
        if let finalStatus {
            continuation.resume(returning: finalStatus)
        } else {
            closedWaiters.append(continuation)
        }
    }

    /// The public handle went away: close as a `close()` would, if not closed already.
    func handleReleased() {
        guard hasStarted else {
            connection.close()
            return
        }
        startClose(code: .goingAway, reason: "")
    }
}
