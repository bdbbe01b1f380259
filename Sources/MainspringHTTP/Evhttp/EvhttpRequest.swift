// The bridge between one evhttp request and Swift: reading what evhttp parsed (method, target,
// query, header fields, body, peer) into Swift values, and answering it — a whole response, or a
// chunked one with a callback per drained chunk (the streaming writer's backpressure).
internal import CLibevent
import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// A request evhttp read in full, until its response is handed back. Loop thread only.
///
/// The `evhttp_request` is owned by evhttp; this handle may touch it until it hands it back with
/// its final send (`sendReply`, `endChunked`). If the connection was lost meanwhile, evhttp
/// detached the request and frees it on that final send; if evhttp was freed, the handle is dead
/// and sending does nothing.
final class EvhttpRequest: ServerExchange {
    private var raw: OpaquePointer?
    let connection: EvhttpConnection
    private(set) var isChunked = false
    /// The response went out in full (`on_complete`).
    private(set) var wasWritten = false
    private var drainWaiters: [() -> Void] = []
    /// The route's concurrency limit whose place this request holds until it finishes.
    var heldLimit: ConcurrencyLimit?

    init(raw: OpaquePointer, connection: EvhttpConnection) {
        self.raw = raw
        self.connection = connection
    }

    /// Whether a reply can still reach the client.
    var isConnectionOpen: Bool { raw != nil && !connection.isClosed }

    var bufferedOutputBytes: Int { connection.bufferedOutputBytes }

    func markDead() { raw = nil }
    func markWritten() { wasWritten = true }
    func connectionLost() {
        let waiters = drainWaiters
        drainWaiters = []
        for waiter in waiters { waiter() }
    }

    // MARK: Reading

    var method: HTTPMethod {
        guard let raw else { return .get }
        switch evhttp_request_get_command(raw) {
        case EVHTTP_REQ_GET: return .get
        case EVHTTP_REQ_POST: return .post
        case EVHTTP_REQ_HEAD: return .head
        case EVHTTP_REQ_PUT: return .put
        case EVHTTP_REQ_DELETE: return .delete
        case EVHTTP_REQ_OPTIONS: return .options
        case EVHTTP_REQ_TRACE: return .trace
        case EVHTTP_REQ_CONNECT: return .connect
        case EVHTTP_REQ_PATCH: return .patch
        default: return .get
        }
    }

    /// The request target as sent.
    var uri: String {
        guard let raw, let text = evhttp_request_get_uri(raw) else { return "/" }
        return String(cString: text)
    }

    /// The path, percent-decoded ("+" stays "+"), and the decoded query items.
    var pathAndQuery: (path: String, rawPath: String, query: [(name: String, value: String)]) {
        guard let raw, let uri = evhttp_request_get_evhttp_uri(raw) else { return ("/", "/", []) }
        let rawPath = evhttp_uri_get_path(uri).map { String(cString: $0) } ?? "/"
        var path = rawPath
        // Decoding only changes `%XX` sequences: a path without `%` is its own decoding.
        if rawPath.utf8.contains(UInt8(ascii: "%")), let decoded = evhttp_uridecode(rawPath, 0, nil) {
            path = String(cString: decoded)
            Glibc.free(decoded)
        }
        var items: [(name: String, value: String)] = []
        if let query = evhttp_uri_get_query(uri) {
            let list = UnsafeMutablePointer<evkeyvalq>.allocate(capacity: 1)
            list.pointee.tqh_first = nil
            list.pointee.tqh_last = UnsafeMutableRawPointer(list).assumingMemoryBound(to: UnsafeMutablePointer<evkeyval>?.self)
            if evhttp_parse_query_str(query, list) == 0 { items = Self.pairs(list) }
            evhttp_clear_headers(list)
            list.deallocate()
        }
        return (path.isEmpty ? "/" : path, rawPath, items)
    }

    /// The request's header fields, in order.
    var headers: [(name: String, value: String)] {
        guard let raw, let list = evhttp_request_get_input_headers(raw) else { return [] }
        return Self.pairs(list)
    }

    private static func pairs(_ list: UnsafeMutablePointer<evkeyvalq>) -> [(name: String, value: String)] {
        var result: [(name: String, value: String)] = []
        var entry = list.pointee.tqh_first
        while let pair = entry {
            result.append((String(cString: pair.pointee.key), String(cString: pair.pointee.value)))
            entry = pair.pointee.next.tqe_next
        }
        return result
    }

    var body: [UInt8] {
        guard let raw, let buffer = evhttp_request_get_input_buffer(raw) else { return [] }
        let length = evbuffer_get_length(buffer)
        guard length > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: length) { storage, count in
            count = max(0, evbuffer_copyout(buffer, storage.baseAddress, length))
        }
    }

    /// `host:port` of the client (`[v6]:port` for IPv6): the connection's, formatted once.
    var remoteAddress: String {
        guard let raw else { return "" }
        return connection.peerAddress(of: raw)
    }

    // MARK: Replying

    /// Adds a header field to the response (before `sendReply` or `startChunked`). evhttp refuses
    /// values with CR or LF (header injection): such a field is dropped.
    func addResponseHeader(_ name: String, _ value: String) {
        guard let raw, !connection.isClosed, let list = evhttp_request_get_output_headers(raw) else { return }
        _ = name.withCString { name in value.withCString { value in evhttp_add_header(list, name, value) } }
    }

    /// Sends a whole response (with the header fields added before) and hands the request back.
    /// `body` is not sent for HEAD.
    func sendReply(status: Int, reason: String, body: [UInt8]) {
        guard let raw else { return }
        self.raw = nil
        if !connection.isClosed, !body.isEmpty, let output = evhttp_request_get_output_buffer(raw) {
            body.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
        }
        // The response is handed to the socket right after, so evhttp's additions to the
        // connection's output need no nudge each.
        connection.withOutputNudgesSuspended {
            reason.withCString { evhttp_send_reply(raw, Int32(status), $0, nil) }
        }
        // evhttp has set its "written" callback: hand the response to the socket now rather
        // than on the next poll (what follows — the request's completion, the next request on
        // the connection — only records and posts, as inside libevent).
        connection.flushNow()
    }

    /// Starts a chunked response (or, for HTTP/1.0 clients, one ended by closing).
    func startChunked(status: Int, reason: String) {
        guard let raw, !isChunked else { return }
        isChunked = true
        evhttp_send_reply_start(raw, Int32(status), reason)
    }

    /// Sends one chunk; `whenDrained` runs (on the loop) once it has left evhttp's buffer, or
    /// at once if the connection is gone.
    func sendChunk(_ bytes: [UInt8], whenDrained: (() -> Void)?) {
        guard let raw, isChunked, !bytes.isEmpty, !connection.isClosed, let chunk = evbuffer_new() else {
            whenDrained?()
            return
        }
        bytes.withUnsafeBytes { _ = evbuffer_add(chunk, $0.baseAddress, $0.count) }
        if let whenDrained {
            drainWaiters.append(whenDrained)
            evhttp_send_reply_chunk_with_cb(raw, chunk, chunkDrainedTrampoline, Unmanaged.passUnretained(self).toOpaque())
        } else {
            evhttp_send_reply_chunk(raw, chunk)
        }
        evbuffer_free(chunk)
    }

    fileprivate func chunkDrained() {
        guard !drainWaiters.isEmpty else { return }
        let waiters = drainWaiters
        drainWaiters = []
        for waiter in waiters { waiter() }
    }

    /// Ends a chunked response and hands the request back.
    func endChunked() {
        guard let raw, isChunked else { return }
        self.raw = nil
        evhttp_send_reply_end(raw)
    }
}

extension EvhttpRequest {
    /// Takes this request's connection away from evhttp (a WebSocket upgrade); evhttp frees its
    /// connection and this request at once, without sending anything (the request then
    /// finishes unwritten, as if its connection were lost). `adopted` gets the connection,
    /// with `options`, and the bytes that came after the request: at once for a plain socket;
    /// over HTTPS, whose session stays in its OpenSSL bufferevent, once evhttp has let go of
    /// that (a loop turn later; never, the connection closed, if the server is freed first).
    /// False, with nothing changed, when it cannot be taken (see
    /// `EvhttpConnection.takeOverSocket`); also false, the connection gone, when a plain
    /// socket cannot become a `Connection`. Loop thread.
    func takeOverConnection(options: Connection.Options, adopted: @escaping (Connection, [UInt8]) -> Void) -> Bool {
        guard let raw, let evcon = evhttp_request_get_connection(raw),
              let taken = connection.takeOverSocket(options: options, adopted: adopted)
        else {
            return false
        }
        self.raw = nil
        evhttp_connection_free(evcon)
        let descriptor: Int32, leftover: [UInt8]
        switch taken {
        case .layered(let copy, let number):
            // evhttp has shut the placeholder down: the session's socket goes back under its number.
            move(copy, onto: number)
            return true
        case .descriptor(let copy, let bytes):
            descriptor = copy
            leftover = bytes
        }
        do {
            adopted(try Connection.adopting(descriptor: descriptor, on: connection.server.loop, options: options), leftover)
            return true
        } catch {
            // A check that failed leaves the descriptor ours; one that failed to register it
            // with the loop (libevent) closed it already.
            if case .libevent = error {} else { closeDescriptor(descriptor) }
            return false
        }
    }
}

// MARK: - Trampolines (inside libevent: record, hand off)

private let chunkDrainedTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, argument in
    guard let argument else { return }
    // Retained for the call: the waiters may release the last other reference to the request.
    Unmanaged<EvhttpRequest>.fromOpaque(argument).takeUnretainedValue().chunkDrained()
}
