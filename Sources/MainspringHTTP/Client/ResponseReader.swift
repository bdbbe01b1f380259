import Mainspring
import Synchronization

/// A response's status line and header fields.
struct ResponseHead: Sendable {
    var status: Int
    var reason: String
    var headers: HTTPHeaders
    var url: String
}

/// A response whose body is read as it is iterated (``HTTPClient/stream(_:)``).
public struct HTTPClientStreamingResponse: Sendable {
    /// The status code.
    public let status: Int
    /// The reason phrase.
    public let reason: String
    /// The header fields (a chunked body's trailers are ``trailers`` once the body has ended).
    public let headers: HTTPHeaders
    /// The URL this response came from (after redirects).
    public let url: String
    let reader: ResponseReader

    init(status: Int, reason: String, headers: HTTPHeaders, url: String, reader: ResponseReader) {
        self.status = status
        self.reason = reason
        self.headers = headers
        self.url = url
        self.reader = reader
    }

    /// The body as it arrives, in pieces of at most 64 KiB (a chunked body's chunks may come in
    /// several). Throws ``HTTPClientError`` (a response timeout between pieces, the server
    /// closing mid-body, a malformed chunk). Iterate it once, from one task.
    public var body: Body { Body(reader: reader) }

    /// A chunked body's trailer fields, once ``body`` has ended.
    public var trailers: HTTPHeaders { reader.trailers }

    /// Stops reading: closes the connection (it cannot take another request with the rest of
    /// this body unread). Also what dropping the response unread does. Any thread.
    public func cancel() { reader.abandon() }

    /// The pieces of a streamed body.
    public struct Body: AsyncSequence, Sendable {
        public typealias Element = [UInt8]
        public typealias Failure = HTTPClientError
        let reader: ResponseReader

        public func makeAsyncIterator() -> Iterator { Iterator(reader: reader) }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let reader: ResponseReader

            public mutating func next() async throws(HTTPClientError) -> [UInt8]? { try await reader.next() }

            public mutating func next(isolation actor: isolated (any Actor)?) async throws(HTTPClientError) -> [UInt8]? {
                try await reader.next()
            }
        }
    }
}

/// Reads one response from a leased connection: the head, then the body by its framing, under
/// the response timeout; gives the connection back (or closes it) when done. Used by one task
/// at a time; `abandon` from anywhere.
final class ResponseReader: @unchecked Sendable {
    private enum Framing {
        case none
        case length(remaining: Int)
        case chunked(remainingInChunk: Int, started: Bool)
        case untilClose
        case done
    }

    private let client: HTTPClient
    private let lease: Lease
    private let method: HTTPMethod
    private let connection: Connection
    // One task at a time (the request's, then the body's consumer):
    private var framing: Framing = .none
    private var keepAlive = true
    private(set) var trailers = HTTPHeaders()
    private(set) var receivedNothing = true
    private var bodyReceived = 0
    /// Settled: released to the pool or closed. Any thread.
    private let settled = Atomic<Bool>(false)
    private let timeoutFired = TimeoutFlag()
    var timedOut: Bool { timeoutFired.value.load(ordering: .relaxed) }

    init(client: HTTPClient, lease: Lease, method: HTTPMethod) {
        self.client = client
        self.lease = lease
        self.method = method
        connection = lease.connection
    }

    deinit { abandon() }

    /// Closes the connection unless the response was read to its end.
    func abandon() {
        guard !settled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        client.release(lease, reusable: false)
    }

    private func finish() async {
        framing = .done
        var reusable = keepAlive
        if reusable { reusable = await client.isReusable(connection) }
        guard !settled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        client.release(lease, reusable: reusable)
    }

    // MARK: Reading under the timeout

    /// Runs `phase` — the whole head (interim `1xx` responses included), or one read of the
    /// body — under one response timeout: when it passes, the connection is closed and the
    /// phase's failure becomes ``HTTPClientError/responseTimeout(_:)``. The timer is one of the
    /// loop's (`EventLoop.sleep(for:)`), so it runs on the loop's clock — virtual time on a
    /// simulated loop — and a server that trickles its head a line at a time cannot stretch it.
    private func underResponseTimeout<T: Sendable>(_ phase: () async throws(HTTPClientError) -> T)
        async throws(HTTPClientError) -> T
    {
        let limit = client.configuration.responseTimeout
        let connection = self.connection
        let fired = timeoutFired
        let loop = client.loop
        let timer = Task {
            try await loop.sleep(for: limit)
            fired.value.store(true, ordering: .relaxed)
            connection.close()
        }
        defer { timer.cancel() }
        let result: T
        do {
            result = try await phase()
        } catch {
            if fired.value.load(ordering: .relaxed) { throw .responseTimeout(limit) }
            if client.isShutDown { throw .clientClosed }
            throw error
        }
        // A read of a connection closed here ends with nil rather than an error.
        if fired.value.load(ordering: .relaxed) { throw .responseTimeout(limit) }
        return result
    }

    /// A read's failure as the client reports it: the connection closed mid-response.
    private func closedMidResponse(_ reason: Connection.CloseReason) -> HTTPClientError {
        .closedMidResponse("connection \(reason) \(progress)")
    }

    private var progress: String {
        switch framing {
        case .none: return receivedNothing ? "before the status line" : "in the head"
        case .length(let remaining): return "\(bodyReceived) body bytes of \(bodyReceived + remaining)"
        case .chunked: return "after \(bodyReceived) bytes of a chunked body"
        case .untilClose, .done: return "after \(bodyReceived) body bytes"
        }
    }

    /// A line (without CRLF) within `budget` bytes; `.headersTooLarge`-style failure by the caller.
    private func line(limit: Int) async throws(HTTPClientError) -> (text: String, size: Int)? {
        let found: Connection.Delimited?
        do {
            found = try await connection.read(until: [10], limit: max(1, limit))
        } catch {
            throw closedMidResponse(error)
        }
        switch found {
        case nil:
            return nil
        case .tooLong:
            return ("", Int.max)
        case .found(var bytes):
            receivedNothing = false
            let size = bytes.count + 1  // and its \n
            if bytes.last == 13 { bytes.removeLast() }
            return (String(decoding: bytes, as: UTF8.self), size)
        }
    }

    // MARK: The head

    /// Reads the head under one response timeout. Interim responses (`100 Continue`, `103`)
    /// are skipped, and count against the same timeout and the same `maxHeaderBytes`: a server
    /// that sends them without end fails the request instead of keeping it forever.
    func readHead(url: String) async throws(HTTPClientError) -> ResponseHead {
        try await underResponseTimeout { () throws(HTTPClientError) in try await readHeadLines(url: url) }
    }

    private func readHeadLines(url: String) async throws(HTTPClientError) -> ResponseHead {
        let maxHead = client.configuration.maxHeaderBytes
        var budget = maxHead
        while true {
            guard let statusLine = try await line(limit: budget) else {
                throw .closedMidResponse(progress)
            }
            if statusLine.size == Int.max { throw .headersTooLarge(limit: maxHead) }
            budget -= statusLine.size
            let (version, status, reason) = try parseStatusLine(statusLine.text)
            var headers = HTTPHeaders()
            while true {
                guard let field = try await line(limit: budget) else { throw .closedMidResponse(progress) }
                if field.size > budget { throw .headersTooLarge(limit: maxHead) }
                budget -= field.size
                if field.text.isEmpty { break }
                let (name, value) = try parseField(field.text)
                headers.add(name, value)
            }
            if (100..<200).contains(status) && status != 101 { continue }  // 100 Continue, 103: the real one follows
            try frame(status: status, version: version, headers: headers)
            if case .done = framing { await finish() } else if case .none = framing { await finish() }
            return ResponseHead(status: status, reason: reason, headers: headers, url: url)
        }
    }

    private func parseStatusLine(_ line: String) throws(HTTPClientError) -> (minor: Int, status: Int, reason: String) {
        let start = String(line.prefix(80))
        let bytes = Array(line.utf8)
        // "HTTP/1.x NNN[ reason]"
        guard bytes.count >= 12, line.hasPrefix("HTTP/1."), bytes[8] == 32,
              let minor = Int(String(decoding: bytes[7...7], as: UTF8.self)),
              bytes[9...11].allSatisfy({ $0 >= 48 && $0 <= 57 }),
              bytes.count == 12 || bytes[12] == 32,
              let status = Int(String(decoding: bytes[9...11], as: UTF8.self)), status >= 100
        else { throw .malformedStatusLine(start) }
        let reason = bytes.count > 13 ? String(decoding: bytes[13...], as: UTF8.self) : ""
        return (minor, status, reason)
    }

    private func parseField(_ line: String) throws(HTTPClientError) -> (String, String) {
        guard let colon = line.firstIndex(of: ":"), colon != line.startIndex else {
            throw .malformedHeader(String(line.prefix(80)))
        }
        let name = String(line[..<colon])
        guard !name.contains(where: { $0 == " " || $0 == "\t" }) else { throw .malformedHeader(String(line.prefix(80))) }
        let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        return (name, value)
    }

    private func frame(status: Int, version minor: Int, headers: HTTPHeaders) throws(HTTPClientError) {
        let connectionTokens = headers.values(of: "connection").flatMap { $0.lowercased().split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
        keepAlive = minor >= 1 ? !connectionTokens.contains("close") : connectionTokens.contains("keep-alive")
        if method == .head || status == 204 || status == 304 {
            framing = .done
            return
        }
        if let encoding = headers["transfer-encoding"], encoding.lowercased().contains("chunked") {
            framing = .chunked(remainingInChunk: 0, started: false)
            return
        }
        let lengths = Set(headers.values(of: "content-length").flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) })
        if !lengths.isEmpty {
            guard lengths.count == 1, let text = lengths.first, let length = Int(text), length >= 0 else {
                throw .invalidContentLength(headers.values(of: "content-length").joined(separator: ", "))
            }
            framing = length == 0 ? .done : .length(remaining: length)
            return
        }
        keepAlive = false
        framing = .untilClose
    }

    // MARK: The body

    /// The next piece of the body, under one response timeout; nil at its end (the connection
    /// then goes back to the pool).
    func next() async throws(HTTPClientError) -> [UInt8]? {
        if case .done = framing { return nil }
        if case .none = framing { return nil }
        return try await underResponseTimeout { () throws(HTTPClientError) in try await nextPiece() }
    }

    private func read(upTo count: Int) async throws(HTTPClientError) -> [UInt8]? {
        do {
            return try await connection.read(upTo: count)
        } catch {
            throw closedMidResponse(error)
        }
    }

    private func nextPiece() async throws(HTTPClientError) -> [UInt8]? {
        switch framing {
        case .none, .done:
            return nil
        case .length(let remaining):
            let piece = try await read(upTo: min(remaining, 65_536))
            guard let piece, !piece.isEmpty else {
                let what = progress
                abandon()
                throw .closedMidResponse(what)
            }
            bodyReceived += piece.count
            if piece.count == remaining {
                await finish()
            } else {
                framing = .length(remaining: remaining - piece.count)
            }
            return piece
        case .untilClose:
            let piece = try await read(upTo: 65_536)
            guard let piece, !piece.isEmpty else {
                framing = .done
                abandon()
                return nil
            }
            bodyReceived += piece.count
            return piece
        case .chunked(let remainingInChunk, let started):
            var remaining = remainingInChunk
            if remaining == 0 {
                if started {  // the CRLF after the previous chunk's data
                    guard let end = try await line(limit: 2), end.text.isEmpty else {
                        abandon()
                        throw .malformedChunk("no CRLF after a chunk")
                    }
                }
                guard let sizeLine = try await line(limit: 1_024) else {
                    let what = progress
                    abandon()
                    throw .closedMidResponse(what)
                }
                let hex = sizeLine.text.split(separator: ";", maxSplits: 1).first.map {
                    $0.trimmingCharacters(in: .whitespaces)
                } ?? ""
                guard sizeLine.size != Int.max, !hex.isEmpty, hex.count <= 15, let size = Int(hex, radix: 16) else {
                    abandon()
                    throw .malformedChunk(String(sizeLine.text.prefix(80)))
                }
                if size == 0 {
                    try await readTrailers()
                    await finish()
                    return nil
                }
                remaining = size
            }
            let piece = try await read(upTo: min(remaining, 65_536))
            guard let piece, !piece.isEmpty else {
                let what = progress
                abandon()
                throw .closedMidResponse(what)
            }
            bodyReceived += piece.count
            framing = .chunked(remainingInChunk: remaining - piece.count, started: true)
            return piece
        }
    }

    private func readTrailers() async throws(HTTPClientError) {
        var budget = client.configuration.maxHeaderBytes
        while true {
            guard let field = try await line(limit: budget) else {
                let what = progress
                abandon()
                throw .closedMidResponse(what)
            }
            if field.size > budget {
                abandon()
                throw .headersTooLarge(limit: client.configuration.maxHeaderBytes)
            }
            budget -= field.size
            if field.text.isEmpty { return }
            let (name, value) = try parseField(field.text)
            trailers.add(name, value)
        }
    }

    /// Reads and drops the rest of the body (a redirect's), up to `limit` bytes; past that the
    /// connection is closed instead.
    func discard(upTo limit: Int) async throws(HTTPClientError) {
        var dropped = 0
        while let piece = try await next() {
            dropped += piece.count
            if dropped > limit {
                abandon()
                return
            }
        }
    }
}

/// Whether a response timeout fired (shared with its timer's task).
final class TimeoutFlag: Sendable {
    let value = Atomic<Bool>(false)
}
