// The HTTP/2 side of `HTTPClient`: one connection per host and port carries every request to
// it, each a stream (`HTTP2ClientStream`), over an nghttp2 client session
// (NGHTTP2/HTTP2Session.swift) on the client's loop — on real and simulated loops alike. The
// client uses it when TLS's ALPN agreed on `h2`, or for every `http` URL when told to use prior
// knowledge (`HTTPClient.Configuration.http2`).
//
// - Streams at once: as many as the server's SETTINGS_MAX_CONCURRENT_STREAMS allows; nghttp2
//   holds the requests past it until a stream closes (within each request's deadline).
// - Flow control is the reader's backpressure: a stream's window reopens only as its reader
//   takes the body (`consume`), so a response read slowly holds at most a window's worth.
// - Deadlines: each request's `ResponseDeadline`, as over HTTP/1.1, but one that runs out resets
//   its stream (CANCEL) and leaves the connection to the others.
// - A GOAWAY from the server ends the connection's use for new requests; the streams it did not
//   take fail as refused, and the client sends them again on a new connection (they never
//   reached the server's processing). The connection closes once its last stream has; an idle
//   one after the client's `idleTimeout`.
@_spi(MainspringHTTP) import MainspringCore
import Synchronization

/// One HTTP/2 connection of a client. Its session is touched on its loop's thread only;
/// `start`, `request`, `reset` and `consume` may be called from any thread (they hop).
final class HTTP2ClientConnection: HTTP2SessionDelegate, @unchecked Sendable {
    let loop: EventLoop
    let connection: Connection
    let key: PoolKey
    private let idleTimeout: Duration
    /// Loop thread only:
    private var session: HTTP2Session!
    private var streams: [Int32: HTTP2ClientStream] = [:]
    private var idleTimer: TimerHandle?
    /// Whether new requests may go on it (not after a GOAWAY, a close or a failure). Any thread.
    private let usable = Atomic<Bool>(true)
    /// Streams open or being opened. Any thread.
    private let active = Atomic<Int>(0)
    /// Told when the connection can take no more requests (the client forgets it).
    private let onRetired: @Sendable (HTTP2ClientConnection) -> Void

    var isUsable: Bool { usable.load(ordering: .acquiring) }
    var activeStreams: Int { active.load(ordering: .relaxed) }

    private init(connection: Connection, key: PoolKey, idleTimeout: Duration,
                 onRetired: @escaping @Sendable (HTTP2ClientConnection) -> Void)
    {
        loop = connection.loop
        self.connection = connection
        self.key = key
        self.idleTimeout = idleTimeout
        self.onRetired = onRetired
    }

    /// Speaks HTTP/2 on `connection` (its preface and SETTINGS go out at once). Any task.
    static func start(on connection: Connection, key: PoolKey, idleTimeout: Duration,
                      onRetired: @escaping @Sendable (HTTP2ClientConnection) -> Void) async throws(HTTPClientError)
        -> HTTP2ClientConnection
    {
        let made = HTTP2ClientConnection(connection: connection, key: key, idleTimeout: idleTimeout, onRetired: onRetired)
        try await made.onLoop { made.begin() }
        return made
    }

    /// Runs `work` on the loop (at once when already there).
    private func onLoop<T: Sendable>(_ work: @escaping @Sendable () -> T) async throws(HTTPClientError) -> T {
        if loop.isCurrent { return work() }
        do {
            return try await loop.submit(work)
        } catch {
            throw .clientClosed  // the loop is gone
        }
    }

    private func begin() {
        session = HTTP2Session(server: false, delegate: self, settings: HTTP2Session.Settings(enablePush: false),
                               consumesManually: true)
        connection.onClose { [self] _ in connectionClosed() }
        connection.readBytes { [self] event in
            switch event {
            case .bytes(let bytes):
                if session.receive(bytes) != .read {
                    retire()
                    connection.close()
                }
                flush()
            case .endOfFile:
                retire()
                connection.close()
            }
        }
        armIdleTimer()
        flush()
    }

    // MARK: Requests

    /// Sends a request and returns its stream (the response is read from it). Any task.
    /// - Throws: `.closedMidResponse` when the connection can take no more streams (the caller
    ///   tries another).
    func request(method: HTTPMethod, target: HTTPTarget, headers: HTTPHeaders, body: [UInt8], userAgent: String?,
                 deadline: RequestDeadline, responseTimeout: Duration, maxHeaderBytes: Int) async throws(HTTPClientError)
        -> HTTP2ClientStream
    {
        active.add(1, ordering: .relaxed)
        let stream = HTTP2ClientStream(connection: self, method: method, url: target.url, body: body, request: deadline,
                                       responseTimeout: responseTimeout, maxHeaderBytes: maxHeaderBytes)
        var fields = HTTP2Fields()
        fields.append(Array(":method".utf8), Array(method.rawValue.utf8))
        fields.append(Array(":scheme".utf8), Array((target.secure ? "https" : "http").utf8))
        fields.append(Array(":authority".utf8), Array(target.hostHeader.utf8))
        fields.append(Array(":path".utf8), Array(target.pathAndQuery.utf8))
        if let userAgent, !headers.contains("user-agent") { fields.append(lowercasing: "user-agent", userAgent) }
        if !headers.contains("content-length"), !body.isEmpty || method == .post || method == .put || method == .patch {
            fields.appendContentLength(body.count)
        }
        for (name, value) in headers where !name.caseInsensitiveEquals("host") {  // the `:authority`
            var name = name, value = value
            name.withUTF8 { name in
                value.withUTF8 { value in
                    if !HTTP2Fields.isConnectionSpecific(name) { fields.append(lowercasing: name, value) }
                }
            }
        }
        let submitted = try await onLoop { [fields] () -> Bool in
            guard self.isUsable, let id = self.session.submitRequest(fields: fields, hasBody: !body.isEmpty) else { return false }
            stream.streamID = id
            self.streams[id] = stream
            self.idleTimer?.cancel()
            self.idleTimer = nil
            self.flush()
            return true
        }
        guard submitted else {
            active.subtract(1, ordering: .relaxed)
            stream.closed(errorCode: nil, refused: true)
            throw .closedMidResponse("the HTTP/2 connection takes no more requests")
        }
        return stream
    }

    /// Resets `stream` (CANCEL) unless it has closed. Any thread.
    func reset(_ stream: HTTP2ClientStream) {
        let work: @Sendable () -> Void = { [self] in
            guard stream.streamID != 0, streams[stream.streamID] === stream else { return }
            session.reset(streamID: stream.streamID, code: .cancel)
            flush()
        }
        if loop.isCurrent { work() } else { loop.execute(priority: .input, work) }
    }

    /// The reader of `stream` took `count` bytes: its window reopens by that much. Any thread.
    func consume(_ stream: HTTP2ClientStream, count: Int) {
        let work: @Sendable () -> Void = { [self] in
            guard connection.isOpen else { return }
            if streams[stream.streamID] === stream {
                session.consume(streamID: stream.streamID, count: count)
            } else {
                // The stream has closed since (its last bytes were read after its end): the
                // connection's window still counts them.
                session.consumeConnection(count: count)
            }
            flush()
        }
        if loop.isCurrent { work() } else { loop.execute(priority: .input, work) }
    }

    /// Closes the connection (the client shuts down): its streams fail. Any thread.
    func close() {
        retire()
        connection.close()
    }

    // MARK: The loop's side

    private func flush() {
        var output: [UInt8] = []
        let ok = session.send(to: &output)
        if !output.isEmpty { connection.write(output) }
        if !ok || !session.wantsRead && !session.wantsWrite {
            retire()
            connection.close()
        }
    }

    /// No new request goes on this connection.
    private func retire() {
        guard usable.exchange(false, ordering: .acquiringAndReleasing) else { return }
        onRetired(self)
    }

    private func connectionClosed() {
        retire()
        idleTimer?.cancel()
        idleTimer = nil
        let open = streams.values
        streams = [:]
        for stream in open {
            active.subtract(1, ordering: .relaxed)
            stream.closed(errorCode: nil, refused: true)
        }
    }

    private func armIdleTimer() {
        idleTimer?.cancel()
        idleTimer = loop.schedule(after: max(.milliseconds(1), idleTimeout)) { [self] in
            idleTimer = nil
            guard streams.isEmpty else { return }
            retire()
            session.goAway(code: .noError)
            flush()
            connection.close()
        }
    }

    func http2Begins(_ frame: HTTP2FrameHead) -> Bool { true }

    func http2BeginsHeaders(streamID: Int32, category: HTTP2HeadersCategory) {
        streams[streamID]?.beginsHeaders(trailers: category == .trailers)
    }

    func http2Header(streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        streams[streamID]?.header(name: name, value: value) ?? true
    }

    func http2Received(_ frame: HTTP2ReceivedFrame) {
        switch frame.type {
        case .headers:
            guard let stream = streams[frame.streamID] else { return }
            if frame.headersCategory == .trailers {
                stream.trailersEnded()
            } else {
                stream.headersEnded(endsStream: frame.endsStream)
            }
        case .data:
            if frame.endsStream { streams[frame.streamID]?.bodyEnded() }
        case .goAway:
            retire()  // the streams it did not take close as refused
        default:
            break
        }
    }

    func http2Data(streamID: Int32, _ bytes: UnsafeRawBufferPointer) {
        if let stream = streams[streamID] {
            stream.received(bytes)
        } else {
            session.consume(streamID: streamID, count: bytes.count)  // nobody reads it: the window reopens now
        }
    }

    func http2Closed(streamID: Int32, errorCode: UInt32) {
        guard let stream = streams.removeValue(forKey: streamID) else { return }
        active.subtract(1, ordering: .relaxed)
        if errorCode == 0 {
            stream.bodyEnded()
        } else {
            stream.closed(errorCode: errorCode, refused: errorCode == HTTP2Error.refusedStream.rawValue)
        }
        if streams.isEmpty {
            if isUsable { armIdleTimer() } else { connection.close() }
        }
    }

    func http2ReadBody(streamID: Int32, into buffer: UnsafeMutableRawBufferPointer) -> HTTP2DataRead {
        streams[streamID]?.readRequestBody(into: buffer) ?? .bytes(0, end: true)
    }

    /// An HTTP/2 error code's name (RFC 9113 §7).
    static func errorName(_ code: UInt32) -> String {
        let names = ["NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
                     "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
                     "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"]
        return code < names.count ? names[Int(code)] : "0x\(String(code, radix: 16))"
    }
}
