import MainspringCore
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
    let reader: any ResponseBody

    init(status: Int, reason: String, headers: HTTPHeaders, url: String, reader: any ResponseBody) {
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
        let reader: any ResponseBody

        public func makeAsyncIterator() -> Iterator { Iterator(reader: reader) }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let reader: any ResponseBody

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
final class ResponseReader: ResponseBody, @unchecked Sendable {
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
    /// The exchange's response timeout (one loop timer).
    private let deadline: ResponseDeadline
    var timedOut: Bool { deadline.fired }

    init(client: HTTPClient, lease: Lease, method: HTTPMethod, request: RequestDeadline) {
        self.client = client
        self.lease = lease
        self.method = method
        connection = lease.connection
        deadline = ResponseDeadline(loop: client.loop, limit: client.configuration.responseTimeout, request: request,
                                    connection: lease.connection)
    }

    deinit { abandon() }

    /// Closes the connection unless the response was read to its end.
    func abandon() {
        guard !settled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        deadline.settle()
        client.release(lease, reusable: false)
    }

    private func finish() async {
        framing = .done
        var reusable = keepAlive
        if reusable { reusable = await client.isReusable(connection) }
        guard !settled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        deadline.settle()
        client.release(lease, reusable: reusable)
    }

    // MARK: Reading under the timeout

    /// Runs `phase` — the whole head (interim `1xx` responses included), or one read of the
    /// body — under one response timeout: when it passes, the connection is closed and the
    /// phase's failure becomes ``HTTPClientError/responseTimeout(_:)``. One timer of the loop
    /// serves every phase of the exchange (``ResponseDeadline``), so it runs on the loop's clock
    /// — virtual time on a simulated loop — and a server that trickles its head a line at a time
    /// cannot stretch it. A read that the calling task's cancellation ended is
    /// ``HTTPClientError/cancelled`` (the connection is closed: the rest of the response is
    /// not read).
    @inline(__always)
    private func underResponseTimeout<T: Sendable>(_ current: HTTPClientError.RequestPhase, timed: Bool = true,
                                                   _ phase: () async throws(HTTPClientError) -> T)
        async throws(HTTPClientError) -> T
    {
        deadline.beginPhase(current, timed: timed)
        let result: T
        do {
            result = try await phase()
        } catch {
            throw failure(error)
        }
        deadline.endPhase()
        // A read of a connection closed here ends with nil rather than an error.
        if let timeout = deadline.timeoutError { throw timeout }
        return result
    }

    /// Queues the request's bytes on the connection (`send` waits only while an earlier
    /// exchange's output is over the limit), held to the request's deadline; the response
    /// timeout starts once they are queued. A failure is `sendFailed` (or what closed the
    /// connection).
    func send(_ bytes: [UInt8]) async throws(HTTPClientError) {
        try await underResponseTimeout(.awaitingResponse, timed: false) { () throws(HTTPClientError) in
            do throws(Connection.CloseReason) {
                try await connection.send(bytes)
            } catch {
                throw .sendFailed(error)
            }
        }
    }

    /// What a phase's failure is reported as: a timeout, the client's shutdown and the task's
    /// cancellation close the connection, and the read then fails for that.
    private func failure(_ error: HTTPClientError) -> HTTPClientError {
        deadline.endPhase()
        if let timeout = deadline.timeoutError { return timeout }
        if client.isShutDown { return .clientClosed }
        if Task.isCancelled { return .cancelled }
        return error
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

    /// A line (without its LF, and without a CR before it unless `keepingCR`) within `limit`
    /// bytes, as bytes; `size` is `Int.max` when
    /// `limit` bytes came without a line end (the caller's `.headersTooLarge`-style failure).
    private func line(limit: Int, keepingCR: Bool = false) async throws(HTTPClientError) -> (bytes: [UInt8], size: Int)? {
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
            return ([], Int.max)
        case .found(var bytes):
            receivedNothing = false
            let size = bytes.count + 1  // and its \n
            if !keepingCR, bytes.last == 13 { bytes.removeLast() }
            return (bytes, size)
        }
    }

    /// The start of a line for an error's text.
    private static func excerpt(_ bytes: some Collection<UInt8>) -> String {
        String(decoding: bytes.prefix(80), as: UTF8.self)
    }

    // MARK: The head

    /// Reads the head under one response timeout. Interim responses (`100 Continue`, `103`)
    /// are skipped, and count against the same timeout and the same `maxHeaderBytes`: a server
    /// that sends them without end fails the request instead of keeping it forever.
    func readHead(url: String) async throws(HTTPClientError) -> ResponseHead {
        try await underResponseTimeout(.awaitingResponse) { () throws(HTTPClientError) in try await readHeadLines(url: url) }
    }

    private func readHeadLines(url: String) async throws(HTTPClientError) -> ResponseHead {
        let maxHead = client.configuration.maxHeaderBytes
        var budget = maxHead
        var interim = 0
        while true {
            guard let statusLine = try await line(limit: budget) else {
                throw .closedMidResponse(progress)
            }
            if statusLine.size == Int.max { throw .headersTooLarge(limit: maxHead) }
            budget -= statusLine.size
            let (version, status, reason) = try parseStatusLine(statusLine.bytes)
            let (headers, declared) = try await readFields(budget: &budget, limit: maxHead)
            if (100..<200).contains(status) && status != 101 {  // 100 Continue, 103: the real one follows
                interim += 1
                let limit = client.configuration.maxInterimResponses
                if interim > limit { throw .tooManyInterimResponses(limit: limit) }
                continue
            }
            frame(status: status, version: version, declared: declared, headers: headers)
            if case .done = framing { await finish() } else if case .none = framing { await finish() }
            return ResponseHead(status: status, reason: reason, headers: headers, url: url)
        }
    }

    /// Reads field lines up to the blank line, within `budget` bytes (`limit` names the
    /// configured maximum in the error), and reads them as the server reads a request's
    /// (`HeadFields`: the same rules for a field line and for framing).
    private func readFields(budget: inout Int, limit: Int) async throws(HTTPClientError)
        -> (HTTPHeaders, HeadFields.DeclaredFraming)
    {
        var raw: [UInt8] = []
        while true {
            guard let field = try await line(limit: budget, keepingCR: true) else { throw .closedMidResponse(progress) }
            if field.size > budget { throw .headersTooLarge(limit: limit) }
            budget -= field.size
            raw += field.bytes
            raw.append(0x0A)
            if field.bytes.allSatisfy({ $0 == 0x0D }) { break }
        }
        return try raw.withUnsafeBufferPointer { buffer throws(HTTPClientError) in
            var head = HeadBytes(buffer)
            switch HeadFields.read(&head) {
            case .failure(let problem):
                throw Self.error(for: problem, in: head)
            case .success(let fields):
                if let line = fields.lineWithoutColon {
                    throw .malformedHeader(Self.excerpt(UnsafeBufferPointer(rebasing: buffer[line])))
                }
                return (HTTPHeaders(fields: fields.fields), fields.framing)
            }
        }
    }

    /// The client's error for a head's fields refused by `HeadFields`.
    private static func error(for problem: HeadFields.Problem, in head: HeadBytes) -> HTTPClientError {
        switch problem {
        case .malformed(_, let line): .malformedHeader(excerpt(UnsafeBufferPointer(rebasing: head.buffer[line])))
        case .lengthNotANumber(let value): .invalidContentLength(head.string(value))
        case .lengthsDiffer: .invalidContentLength("two Content-Length fields with different values")
        case .lengthAndEncoding: .malformedHeader("Transfer-Encoding beside Content-Length")
        case .codingNotChunked(let value): .malformedHeader("Transfer-Encoding: \(head.string(value)) (only chunked is read)")
        case .chunkedTwice: .malformedHeader("Transfer-Encoding: chunked more than once")
        }
    }

    /// `HTTP/1.x NNN[ reason]`: the minor version, the status, the reason phrase.
    private func parseStatusLine(_ bytes: [UInt8]) throws(HTTPClientError) -> (minor: Int, status: Int, reason: String) {
        let prefix: [UInt8] = Array("HTTP/1.".utf8)
        func digit(_ byte: UInt8) -> Int? { byte >= 48 && byte <= 57 ? Int(byte - 48) : nil }
        guard bytes.count >= 12, bytes.starts(with: prefix), bytes[8] == 32,
              let minor = digit(bytes[7]),
              let hundreds = digit(bytes[9]), let tens = digit(bytes[10]), let ones = digit(bytes[11]),
              bytes.count == 12 || bytes[12] == 32
        else { throw .malformedStatusLine(Self.excerpt(bytes)) }
        let status = hundreds * 100 + tens * 10 + ones
        guard status >= 100 else { throw .malformedStatusLine(Self.excerpt(bytes)) }
        let reason = bytes.count > 13 ? String(decoding: bytes[13...], as: UTF8.self) : ""
        return (minor, status, reason)
    }

    /// How the body is read: not at all (HEAD, 204, 304), chunked, by its length, or until the
    /// connection ends (which then does not go back to the pool).
    private func frame(status: Int, version minor: Int, declared: HeadFields.DeclaredFraming, headers: HTTPHeaders) {
        let connectionField = headers.values(of: "connection")
        keepAlive = minor >= 1 ? !HTTPHeaders.list(connectionField, contains: "close")
                               : HTTPHeaders.list(connectionField, contains: "keep-alive")
        if method == .head || status == 204 || status == 304 {
            framing = .done
            return
        }
        switch declared {
        case .chunked:
            framing = .chunked(remainingInChunk: 0, started: false)
        case .length(let length):
            framing = length == 0 ? .done : .length(remaining: length)
        case .none:
            keepAlive = false
            framing = .untilClose
        }
    }

    // MARK: The body

    /// The next piece of the body, under one response timeout; nil at its end (the connection
    /// then goes back to the pool).
    func next() async throws(HTTPClientError) -> [UInt8]? {
        if case .done = framing { return nil }
        if case .none = framing { return nil }
        return try await underResponseTimeout(.readingBody) { () throws(HTTPClientError) in try await nextPiece() }
    }

    private func read(upTo count: Int) async throws(HTTPClientError) -> [UInt8]? {
        do {
            return try await connection.read(upTo: count)
        } catch {
            throw closedMidResponse(error)
        }
    }

    /// Up to `remaining` bytes of the body (64 KiB at most), counted; the server closing first
    /// ends the response (`closedMidResponse`).
    @inline(__always)
    private func bodyPiece(upTo remaining: Int) async throws(HTTPClientError) -> [UInt8] {
        let piece = try await read(upTo: min(remaining, 65_536))
        guard let piece, !piece.isEmpty else {
            let what = progress
            abandon()
            throw .closedMidResponse(what)
        }
        bodyReceived += piece.count
        return piece
    }

    private func nextPiece() async throws(HTTPClientError) -> [UInt8]? {
        switch framing {
        case .none, .done:
            return nil
        case .length(let remaining):
            let piece = try await bodyPiece(upTo: remaining)
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
                    guard let end = try await line(limit: 2), end.bytes.isEmpty else {
                        abandon()
                        throw .malformedChunk("no CRLF after a chunk")
                    }
                }
                guard let sizeLine = try await line(limit: 1_024) else {
                    let what = progress
                    abandon()
                    throw .closedMidResponse(what)
                }
                let text = String(decoding: sizeLine.bytes, as: UTF8.self)
                let hex = text.split(separator: ";", maxSplits: 1).first.map {
                    $0.trimmingCharacters(in: .whitespaces)
                } ?? ""
                guard sizeLine.size != Int.max, !hex.isEmpty, hex.count <= 15, let size = Int(hex, radix: 16) else {
                    abandon()
                    throw .malformedChunk(String(text.prefix(80)))
                }
                if size == 0 {
                    try await readTrailers()
                    await finish()
                    return nil
                }
                remaining = size
            }
            let piece = try await bodyPiece(upTo: remaining)
            framing = .chunked(remainingInChunk: remaining - piece.count, started: true)
            return piece
        }
    }

    private func readTrailers() async throws(HTTPClientError) {
        var budget = client.configuration.maxHeaderBytes
        do throws(HTTPClientError) {
            let (fields, _) = try await readFields(budget: &budget, limit: client.configuration.maxHeaderBytes)
            trailers = fields
        } catch {
            abandon()
            throw error
        }
    }

}
