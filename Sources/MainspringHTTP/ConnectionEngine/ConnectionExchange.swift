import MainspringCore

/// One request the connection engine read, until its response is written: the engine's
/// `ServerExchange`. Loop thread only.
final class ConnectionExchange: ServerExchange {
    private let owner: EngineConnection
    private let head: RequestHead
    let body: [UInt8]
    var heldLimit: ConcurrencyLimit?
    /// The response's header fields so far, as they go out (`name: value` CR LF each).
    private var fieldBytes: [UInt8] = []
    /// A `Connection` field was added; one whose value is `close`.
    private var hasConnectionField = false
    private var saysClose = false
    /// A `Content-Length` field was added.
    private var hasContentLength = false
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
    var version: HTTPVersion { head.minorVersion == 0 ? .http1_0 : .http1_1 }
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
        guard !isDone, !Self.breaksLine(name), !Self.breaksLine(value) else { return }
        switch name.utf8.count {
        case 10 where name.caseInsensitiveEquals("Connection"):
            hasConnectionField = true
            if value.caseInsensitiveEquals("close") { saysClose = true }
        case 14 where name.caseInsensitiveEquals("Content-Length"):
            hasContentLength = true
        default:
            break
        }
        if fieldBytes.isEmpty { fieldBytes.reserveCapacity(160) }
        fieldBytes.append(contentsOf: name.utf8)
        fieldBytes.append(0x3A)
        fieldBytes.append(0x20)
        fieldBytes.append(contentsOf: value.utf8)
        fieldBytes.append(0x0D)
        fieldBytes.append(0x0A)
    }

    func addContentLength(_ length: Int) {
        guard !isDone else { return }
        hasContentLength = true
        fieldBytes.append(contentsOf: "Content-Length: ".utf8)
        appendDecimal(length, to: &fieldBytes)
        fieldBytes.append(0x0D)
        fieldBytes.append(0x0A)
    }

    /// Whether `text` holds a CR or LF (a field that would smuggle in another: dropped).
    private static func breaksLine(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in bytes.contains { $0 == 0x0D || $0 == 0x0A } }
    }

    /// The status line and header fields, ready for `extra` bytes of body after them; whether
    /// the connection closes after the response.
    private func responseHead(status: Int, reason: String, chunked: Bool, endedByClose: Bool = false, extra: Int = 0)
        -> (bytes: [UInt8], closing: Bool)
    {
        let closing = !head.keepsAlive || saysClose || endedByClose  // the end of the connection ends the body
        var bytes: [UInt8] = []
        bytes.reserveCapacity(64 + fieldBytes.count + extra)
        if status == 200, head.minorVersion == 1 {
            bytes.append(contentsOf: Self.okLine)
        } else {
            bytes.append(contentsOf: "HTTP/1.".utf8)
            bytes.append(head.minorVersion == 0 ? 0x30 : 0x31)
            bytes.append(0x20)
            appendDecimal(status, to: &bytes)
            bytes.append(0x20)
            bytes.append(contentsOf: reason.utf8)
            bytes.append(0x0D)
            bytes.append(0x0A)
        }
        bytes.append(contentsOf: fieldBytes)
        if chunked { bytes.append(contentsOf: "Transfer-Encoding: chunked\r\n".utf8) }
        // A request whose `Connection` is `close` gets it back (not a proxy request: its
        // `Proxy-Connection` closes silently), an HTTP/1.0 one that asked for `keep-alive` gets
        // that; one that closes otherwise just closes (a draining server adds its own
        // `Connection: close`).
        if !hasConnectionField {
            if head.asksToClose {
                if !head.isProxyRequest { bytes.append(contentsOf: "Connection: close\r\n".utf8) }
            } else if head.asksKeepAlive, head.minorVersion == 0 {
                bytes.append(contentsOf: "Connection: keep-alive\r\n".utf8)
            }
        }
        bytes.append(0x0D)
        bytes.append(0x0A)
        return (bytes, closing)
    }

    private static let okLine = Array("HTTP/1.1 200 OK\r\n".utf8)

    func sendReply(status: Int, reason: String, body: [UInt8]) {
        guard !isDone, !isChunked else { return }
        isDone = true
        guard owner.isOpen else { return }
        let sendsBody = head.method != .head
        var (bytes, closing) = responseHead(status: status, reason: reason, chunked: false, extra: sendsBody ? body.count : 0)
        if sendsBody { bytes.append(contentsOf: body) }
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
        let hasLength = hasContentLength
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

    private(set) var isTakenOver = false

    func takeOverConnection(options: Connection.Options, adopted: @escaping (Connection, [UInt8]) -> Void) -> Bool {
        guard !isDone, !isChunked else { return false }
        isTakenOver = true
        guard let (connection, leftover) = owner.takeOver(self) else {
            isTakenOver = false
            return false
        }
        isDone = true
        connection.adopt(outputLimit: options.outputLimit, closeTimeout: options.closeTimeout)
        adopted(connection, leftover)
        return true
    }
}

/// Appends `value` (not negative) in decimal ASCII.
func appendDecimal(_ value: Int, to bytes: inout [UInt8]) {
    guard value >= 10 else {
        bytes.append(0x30 + UInt8(max(0, value)))
        return
    }
    var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                 UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    var count = 0
    var rest = value
    withUnsafeMutableBytes(of: &digits) { buffer in
        while rest > 0 {
            buffer[19 - count] = 0x30 + UInt8(rest % 10)
            rest /= 10
            count += 1
        }
        bytes.append(contentsOf: buffer[(20 - count)...])
    }
}
