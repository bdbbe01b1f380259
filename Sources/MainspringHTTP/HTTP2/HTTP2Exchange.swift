import MainspringCore

/// One HTTP/2 stream of a server connection: the request as its frames arrive, then — handed to
/// the server as the engine's `ServerExchange` — its response, whole or streamed, as DATA frames
/// the stream's flow-control window lets out. Loop thread only.
final class HTTP2Exchange: ServerExchange {
    /// Held strongly, as an HTTP/1.1 exchange holds its connection: a handler may answer after
    /// the connection is gone (replying then does nothing). No cycle outlives the stream: the
    /// connection lets go of its streams as they close.
    let owner: HTTP2ServerConnection
    let streamID: Int32

    // MARK: The request, as it arrives

    var methodName = ""
    var path = ""
    var authority: String?
    var scheme = ""
    var fields: [(name: String, value: String)] = []
    /// The decoded size of the header list so far (RFC 9113 §6.5.2: name, value and 32 each).
    var headerListBytes = 0
    var requestBody: [UInt8] = []
    /// A `content-length` the request declared (checked against the body at its end).
    var declaredLength: Int?
    /// Where the request stands.
    var phase = Phase.headers
    /// When the stream opened, or its head ended (the loop's clock, ns): its header or body
    /// deadline counts from it.
    var phaseStartedAt: UInt64 = 0

    enum Phase {
        /// Its header block is arriving.
        case headers
        /// Its body is arriving.
        case body
        /// The engine answered it itself (a refusal) or it was dropped: what still arrives for it
        /// is read and dropped.
        case refused
        /// With the server (handed over by `received`), until its stream closes.
        case withServer
    }

    init(owner: HTTP2ServerConnection, streamID: Int32, now: UInt64) {
        self.owner = owner
        self.streamID = streamID
        phaseStartedAt = now
        fields.reserveCapacity(8)
    }

    // MARK: ServerExchange: what the server reads

    var heldLimit: ConcurrencyLimit?
    private(set) var method = HTTPMethod.get
    var uri: String { path }
    var pathAndQuery: (path: String, rawPath: String, query: [(name: String, value: String)]) {
        RequestHead.pathAndQuery(of: path)
    }
    var headers: [(name: String, value: String)] { fields }
    var body: [UInt8] { requestBody }
    var version: HTTPVersion { .http2 }
    var remoteAddress: String { owner.connection.remoteAddress }
    var isTakenOver: Bool { false }
    var isConnectionOpen: Bool { !isDone && !isClosed && owner.isOpen }
    var bufferedOutputBytes: Int { output.count - outputStart + (isClosed ? 0 : owner.bufferedOutputBytes) }

    /// Sets the method the request is routed by (its `:method`, parsed by the connection).
    func route(as method: HTTPMethod) { self.method = method }

    // MARK: The response

    /// The response's header list (`:status` goes before it when it is submitted).
    private var responseFields = HTTP2Fields()
    /// Body bytes not taken by nghttp2 yet (from `outputStart` on).
    private var output: [UInt8] = []
    private var outputStart = 0
    /// The body has ended (whole response, or `endChunked`).
    private var outputEnded = false
    /// The response was handed back (whole, ended, or dropped): replying does nothing.
    private(set) var isDone = false
    /// A response was submitted.
    private(set) var hasResponded = false
    /// The stream is closed (sent in full, or reset by either side).
    private(set) var isClosed = false
    /// A streamed response's body never goes out (`HEAD`, 1xx, 204, 304).
    private var dropsBody = false
    private var drainWaiters: [() -> Void] = []
    /// When the response last moved: its submission, or nghttp2 taking body bytes (the loop's
    /// clock, ns). A response that waits on its window longer than `idleTimeout` is reset.
    private(set) var outputMovedAt: UInt64 = 0

    /// Body bytes waiting for the stream's window.
    var pendingOutputBytes: Int { output.count - outputStart }

    func addResponseHeader(_ name: String, _ value: String) {
        guard !isDone else { return }
        var name = name, value = value
        name.withUTF8 { name in
            value.withUTF8 { value in
                guard Self.isAllowedInHTTP2(name), !value.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else { return }
                responseFields.append(lowercasing: name, value)
            }
        }
    }

    func addContentLength(_ length: Int) {
        guard !isDone else { return }
        responseFields.appendContentLength(length)
    }

    /// Whether a field named `name` may travel in HTTP/2: not an empty name or one with a
    /// space, colon, CR, LF or NUL, nor a connection-specific one.
    private static func isAllowedInHTTP2(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        guard !name.isEmpty, !name.contains(where: { $0 <= 0x20 || $0 == 0x3A }) else { return false }
        return !HTTP2Fields.isConnectionSpecific(name)
    }

    func sendReply(status: Int, reason: String, body: [UInt8]) {
        guard !isDone, !hasResponded else { return }
        isDone = true
        guard !isClosed, owner.isOpen else { return }
        hasResponded = true
        output = body
        outputEnded = true
        outputMovedAt = owner.now
        owner.submit(self, status: status, fields: responseFields, hasBody: !body.isEmpty && method != .head)
    }

    func startChunked(status: Int, reason: String) {
        guard !isDone, !hasResponded else { return }
        hasResponded = true
        dropsBody = method == .head || status < 200 || status == 204 || status == 304
        outputMovedAt = owner.now
        guard !isClosed, owner.isOpen else { return }
        owner.submit(self, status: status, fields: responseFields, hasBody: !dropsBody)
    }

    func sendChunk(_ bytes: [UInt8], whenDrained: (() -> Void)?) {
        guard !isDone, hasResponded, !bytes.isEmpty, !dropsBody, !isClosed, owner.isOpen else {
            whenDrained?()
            return
        }
        if outputStart == output.count {
            output = bytes
            outputStart = 0
        } else {
            output.append(contentsOf: bytes)
        }
        if let whenDrained { drainWaiters.append(whenDrained) }
        owner.resume(self)
    }

    func endChunked() {
        guard !isDone, hasResponded else { return }
        isDone = true
        outputEnded = true
        guard !dropsBody, !isClosed, owner.isOpen else { return }
        owner.resume(self)
    }

    /// No WebSocket over HTTP/2 (RFC 8441 is not spoken): a WebSocket route answers it `500`.
    func takeOverConnection(options: Connection.Options, adopted: @escaping (Connection, [UInt8]) -> Void) -> Bool {
        false
    }

    // MARK: What the connection asks

    /// nghttp2 wants up to `buffer.count` bytes of the body: as much as there is.
    func readBody(into buffer: UnsafeMutableRawBufferPointer, now: UInt64) -> HTTP2DataRead {
        let count = min(buffer.count, output.count - outputStart)
        if count == 0 { return outputEnded ? .bytes(0, end: true) : .deferred }
        output.withUnsafeBytes { all in
            buffer.baseAddress!.copyMemory(from: all.baseAddress! + outputStart, byteCount: count)
        }
        outputStart += count
        outputMovedAt = now
        if outputStart == output.count {
            output.removeAll(keepingCapacity: !outputEnded)
            outputStart = 0
            if !drainWaiters.isEmpty { owner.whenSent(self) }
        }
        return .bytes(count, end: outputEnded && outputStart == output.count)
    }

    /// What was taken has left the connection: the chunks' writers may write more.
    func runDrainWaiters() {
        guard outputStart == output.count || isClosed else { return }
        let waiters = drainWaiters
        drainWaiters = []
        for waiter in waiters { waiter() }
    }

    /// The stream closed: whether its response went out in full.
    func closed(cleanly: Bool) -> Bool {
        isClosed = true
        let written = cleanly && hasResponded && outputEnded && output.count == outputStart
        isDone = true
        output = []
        outputStart = 0
        runDrainWaiters()
        return written
    }
}
