import MainspringCore

/// One request the connection engine read, until its response is written: the engine's
/// `ServerExchange`. Loop thread only.
final class ConnectionExchange: ServerExchange {
    private let owner: EngineConnection
    private let head: RequestHead
    let body: [UInt8]
    var heldLimit: ConcurrencyLimit?
    private var responseFields: [(name: String, value: String)] = []
    /// The response is under way in chunks (or, for HTTP/1.0, ended by closing).
    private var isChunked = false
    /// The response went out in full, or the request was handed back otherwise.
    private var isDone = false
    private var drainWaiters: [() -> Void] = []

    init(owner: EngineConnection, head: RequestHead, body: [UInt8]) {
        self.owner = owner
        self.head = head
        self.body = body
    }

    var isConnectionOpen: Bool { !isDone && owner.isOpen }
    var method: HTTPMethod { head.method }
    var uri: String { head.target }
    var pathAndQuery: (path: String, rawPath: String, query: [(name: String, value: String)]) { head.pathAndQuery }
    var headers: [(name: String, value: String)] { head.fields }
    var remoteAddress: String { owner.connection.remoteAddress }
    var bufferedOutputBytes: Int { owner.bufferedOutputBytes }

    /// The engine was freed with this request in flight: replying does nothing.
    func markDead() { isDone = true }

    /// The connection closed under the request: a chunk's waiters learn it.
    func connectionLost() { runDrainWaiters() }

    private func runDrainWaiters() {
        let waiters = drainWaiters
        drainWaiters = []
        for waiter in waiters { waiter() }
    }

    /// Whether a response of `status` carries a body: not for `HEAD`, 1xx, 204 or 304
    /// (RFC 9110 §6.4.1).
    private func mayHaveBody(status: Int) -> Bool {
        head.method != .head && status >= 200 && status != 204 && status != 304
    }

    func addResponseHeader(_ name: String, _ value: String) {
        guard !isDone, !(name + value).utf8.contains(where: { $0 == 0x0D || $0 == 0x0A }) else { return }
        responseFields.append((name, value))
    }

    /// The status line and header fields; whether the connection closes after the response.
    private func responseHead(status: Int, reason: String, chunked: Bool, endedByClose: Bool = false)
        -> (bytes: [UInt8], closing: Bool)
    {
        var closing = !head.keepsAlive
        var hasConnection = false
        var text = "HTTP/1.\(head.minorVersion) \(status) \(reason)\r\n"
        for field in responseFields {
            if field.name.caseInsensitiveEquals("Connection") {
                hasConnection = true
                if field.value.caseInsensitiveEquals("close") { closing = true }
            }
            text += "\(field.name): \(field.value)\r\n"
        }
        if chunked { text += "Transfer-Encoding: chunked\r\n" }
        if endedByClose { closing = true }  // the end of the connection ends the body
        // A request whose `Connection` is `close` gets it back (not a proxy request:
        // its `Proxy-Connection` closes silently), an HTTP/1.0 one that asked for `keep-alive`
        // gets that; one that closes otherwise just closes (a draining server adds its own
        // `Connection: close`).
        if !hasConnection {
            if head.asksToClose {
                if !head.isProxyRequest { text += "Connection: close\r\n" }
            } else if head.asksKeepAlive, head.minorVersion == 0 {
                text += "Connection: keep-alive\r\n"
            }
        }
        text += "\r\n"
        return (Array(text.utf8), closing)
    }

    func sendReply(status: Int, reason: String, body: [UInt8]) {
        guard !isDone, !isChunked else { return }
        isDone = true
        guard owner.isOpen else { return }
        var (bytes, closing) = responseHead(status: status, reason: reason, chunked: false)
        if head.method != .head { bytes += body }
        owner.write(bytes)
        owner.responded(self, closing: closing)
    }

    /// Whether the response closes its connection (set by `startChunked`).
    private var closesAfterChunks = false
    /// How a streamed response's body goes out (set by `startChunked`).
    private var streamFraming = StreamFraming.chunked

    private enum StreamFraming {
        /// In chunks, with the terminator at the end (HTTP/1.1).
        case chunked
        /// As it is: the handler's `Content-Length` frames it, or (HTTP/1.0) the connection's end.
        case raw
        /// None at all: a `HEAD` request, or a status without a body (1xx, 204, 304).
        case none
    }

    func startChunked(status: Int, reason: String) {
        guard !isDone, !isChunked else { return }
        isChunked = true
        // Chunked only where a body may be and no length frames it.
        let hasLength = responseFields.contains { $0.name.caseInsensitiveEquals("Content-Length") }
        streamFraming = !mayHaveBody(status: status) ? .none : hasLength || head.minorVersion == 0 ? .raw : .chunked
        let (bytes, closing) = responseHead(status: status, reason: reason, chunked: streamFraming == .chunked,
                                            endedByClose: streamFraming == .raw && !hasLength)
        closesAfterChunks = closing
        if owner.isOpen { owner.write(bytes) }
    }

    func sendChunk(_ bytes: [UInt8], whenDrained: (() -> Void)?) {
        guard !isDone, isChunked, !bytes.isEmpty, owner.isOpen, streamFraming != .none else {
            whenDrained?()
            return
        }
        if streamFraming == .chunked {
            owner.write(Array("\(String(bytes.count, radix: 16))\r\n".utf8) + bytes + [0x0D, 0x0A])
        } else {
            owner.write(bytes)
        }
        guard let whenDrained else { return }
        drainWaiters.append(whenDrained)
        // One hook serves every waiter until the output has all left.
        if drainWaiters.count == 1 { owner.connection.whenOutputSent { [weak self] in self?.runDrainWaiters() } }
    }

    func endChunked() {
        guard !isDone, isChunked else { return }
        isDone = true
        guard owner.isOpen else { return }
        if streamFraming == .chunked { owner.write(Array("0\r\n\r\n".utf8)) }
        owner.responded(self, closing: closesAfterChunks)
    }

    func takeOverConnection(options: Connection.Options, adopted: @escaping (Connection, [UInt8]) -> Void) -> Bool {
        guard !isDone, !isChunked, let (connection, leftover) = owner.takeOver(self) else { return false }
        isDone = true
        connection.adopt(outputLimit: options.outputLimit, closeTimeout: options.closeTimeout)
        adopted(connection, leftover)
        return true
    }
}
