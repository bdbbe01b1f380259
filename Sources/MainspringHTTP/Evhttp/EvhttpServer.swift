// Sources/MainspringHTTP/Evhttp/ is the only folder of MainspringHTTP that imports CLibevent: it
// wraps libevent's HTTP server (evhttp) for one loop. Everything here runs on that loop's thread.
//
// What runs inside libevent (the C callbacks, "trampolines" below) only records what happened and
// hands it to the loop: the server's delegate posts the request to the loop with `execute`, so no
// user handler ever runs inside `event_base_loop` (a handler may spin the loop; fairness applies).
//
// Each accepted connection gets its socket bufferevent wrapped in a pass-through *filter*
// bufferevent (evhttp's `bevcb` hook). The filter is where Mainspring sees each connection: it
// counts connections (the filter's free callback is the one exact "connection closed" signal
// evhttp 2.1 offers), bounds the request head before evhttp buffers it (431), and stamps when a
// request started arriving, for the slow-client deadlines. evhttp still does all the parsing.
internal import CLibevent
@_spi(MainspringHTTP) import Mainspring
import Dispatch
#if canImport(Glibc)
import Glibc
#endif

/// Limits one loop's evhttp enforces (see `HTTPServer.Configuration`).
struct EvhttpLimits {
    var maxHeaderBytes: Int
    var maxBodyBytes: Int
    var idleTimeout: Duration
    var headerTimeout: Duration
    var bodyTimeout: Duration
    /// Connections accepted per loop turn before the listener yields to the loop.
    var acceptBurst: Int
}

/// What a loop's evhttp server tells its owner. Called inside libevent callbacks (except where
/// noted): record and hand off, never run user code.
protocol EvhttpServerDelegate: AnyObject {
    /// A request was read in full (and routed nowhere yet).
    func evhttpReceived(_ request: EvhttpRequest)
    /// A request handed over by `evhttpReceived` is over: its response was written, or its
    /// connection was lost, or the server was freed. Exactly once per request.
    func evhttpFinished(_ request: EvhttpRequest, written: Bool)
    /// Mainspring's head guard answered a request itself (431), or libevent's parser did (400,
    /// 413).
    func evhttpAnsweredByGuard(status: Int)
    /// A connection was accepted. Returns whether the listener may keep accepting.
    func evhttpConnectionOpened() -> Bool
    /// A connection closed (for any reason).
    func evhttpConnectionClosed(timedOut: Bool)
}

/// A listening TCP socket shared by every loop of a server: each loop's evhttp accepts from its
/// own duplicate of it, so a loop that is stuck in a long callback simply stops taking new
/// connections and the others take them.
final class ListeningSocket: @unchecked Sendable {
    let fd: Int32
    let port: UInt16

    init(host: String, port: UInt16, backlog: Int32) throws(HTTPServerError) {
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let info = list else {
            throw .invalidAddress("\(host): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(list) }
        let fd = socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system(function: "socket", errno: errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) != 0 {
            let code = errno
            close(fd)
            throw .system(function: "bind \(host):\(port)", errno: code)
        }
        if listen(fd, backlog) != 0 {
            let code = errno
            close(fd)
            throw .system(function: "listen", errno: code)
        }
        var bound = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        var boundPort: UInt16 = 0
        if Int32(bound.ss_family) == AF_INET {
            boundPort = withUnsafePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) } }
        } else {
            boundPort = withUnsafePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) } }
        }
        self.fd = fd
        self.port = boundPort
    }

    /// A close-on-exec duplicate of the socket, for one loop's evhttp (which closes it).
    func duplicate() throws(HTTPServerError) -> Int32 {
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw .system(function: "dup", errno: errno) }
        return copy
    }

    deinit { close(fd) }
}

/// One loop's evhttp: its `struct evhttp`, the connections it has open, and the deadlines of
/// requests that are arriving. Loop thread only (`@unchecked Sendable` only so that the loop's own
/// posts can carry it).
final class EvhttpServer: @unchecked Sendable {
    private var raw: OpaquePointer?
    private let base: OpaquePointer
    let limits: EvhttpLimits
    weak var delegate: EvhttpServerDelegate?
    private var bound: OpaquePointer?
    /// Open connections, by their filter bufferevent.
    private var connections: [OpaquePointer: EvhttpConnection] = [:]
    private var acceptedThisTurn = 0
    private var isPausedForBurst = false
    private var isPausedForLimit = false
    private let loop: EventLoop

    init(loop: EventLoop, limits: EvhttpLimits) throws(HTTPServerError) {
        self.loop = loop
        self.base = loop.eventBasePointer
        self.limits = limits
        guard let http = evhttp_new(base) else { throw .libevent(function: "evhttp_new") }
        raw = http
        // evhttp's own limits sit just above the guard's, which answers first (431).
        evhttp_set_max_headers_size(http, limits.maxHeaderBytes + 1)
        evhttp_set_max_body_size(http, limits.maxBodyBytes)
        var timeout = timeval(tv_sec: Int(limits.idleTimeout.components.seconds),
                              tv_usec: Int(limits.idleTimeout.components.attoseconds / 1_000_000_000_000))
        if timeout.tv_sec == 0 && timeout.tv_usec == 0 { timeout.tv_usec = 1 }
        evhttp_set_timeout_tv(http, &timeout)
        let everyMethod = EVHTTP_REQ_GET.rawValue | EVHTTP_REQ_POST.rawValue | EVHTTP_REQ_HEAD.rawValue
            | EVHTTP_REQ_PUT.rawValue | EVHTTP_REQ_DELETE.rawValue | EVHTTP_REQ_OPTIONS.rawValue
            | EVHTTP_REQ_TRACE.rawValue | EVHTTP_REQ_CONNECT.rawValue | EVHTTP_REQ_PATCH.rawValue
        evhttp_set_allowed_methods(http, UInt16(everyMethod))
        // A body over the limit is read and dropped before the 413 goes out: a client still
        // sending would otherwise get a reset instead of the answer.
        _ = evhttp_set_flags(http, EVHTTP_SERVER_LINGERING_CLOSE)
        let argument = Unmanaged.passUnretained(self).toOpaque()
        evhttp_set_gencb(http, requestTrampoline, argument)
        evhttp_set_bevcb(http, connectionTrampoline, argument)
    }

    deinit { free() }

    /// Starts accepting on a duplicate of `socket`.
    func accept(on socket: ListeningSocket) throws(HTTPServerError) {
        guard let raw else { throw .closed }
        let fd = try socket.duplicate()
        guard let handle = evhttp_accept_socket_with_handle(raw, fd) else {
            close(fd)
            throw .libevent(function: "evhttp_accept_socket_with_handle")
        }
        bound = handle
    }

    /// Stops accepting new connections (those already open are not affected). Idempotent.
    func stopAccepting() {
        guard let raw, let handle = bound else { return }
        evhttp_del_accept_socket(raw, handle)
        bound = nil
    }

    /// Connections open on this loop.
    var connectionCount: Int { connections.count }

    /// Requests handed over and not finished on this loop.
    var requestsInFlight: Int { connections.values.reduce(0) { $0 + ($1.current == nil ? 0 : 1) } }

    /// Frees evhttp: closes the listening socket and every connection. Requests still in flight
    /// are finished as not written (their handles go dead: replying to them does nothing).
    func free() {
        guard let http = raw else { return }
        raw = nil
        bound = nil
        for connection in connections.values {
            if let request = connection.current {
                connection.current = nil
                request.markDead()
                delegate?.evhttpFinished(request, written: false)
            }
            connection.detach()
            delegate?.evhttpConnectionClosed(timedOut: false)
        }
        connections.removeAll()
        evhttp_free(http)
    }

    // MARK: Connections

    fileprivate func makeConnection() -> OpaquePointer? {
        guard let underlying = bufferevent_socket_new(base, -1, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else { return nil }
        let connection = EvhttpConnection(server: self, underlying: underlying)
        let context = Unmanaged.passRetained(connection).toOpaque()
        guard let filter = bufferevent_filter_new(underlying, inputFilterTrampoline, outputFilterTrampoline,
                                                  Int32(BEV_OPT_CLOSE_ON_FREE.rawValue), contextFreedTrampoline, context)
        else {
            Unmanaged<EvhttpConnection>.fromOpaque(context).release()
            bufferevent_free(underlying)
            return nil
        }
        connection.attach(filter: filter, base: base, context: context)
        connections[filter] = connection
        acceptedThisTurn += 1
        let mayContinue = delegate?.evhttpConnectionOpened() ?? true
        if !mayContinue {
            pauseListener(forLimit: true)
        } else if acceptedThisTurn >= limits.acceptBurst {
            pauseListener(forLimit: false)
        }
        return filter
    }

    fileprivate func connectionClosed(_ connection: EvhttpConnection) {
        guard let filter = connection.filter else { return }
        connections[filter] = nil
        if let request = connection.current {
            connection.current = nil
            request.connectionLost()
            delegate?.evhttpFinished(request, written: false)
        }
        delegate?.evhttpConnectionClosed(timedOut: connection.timedOut)
    }

    /// The accept burst of this turn is over: lets the listener accept again after the loop's
    /// other ready work (a loop that is busy polls less often, so it takes fewer connections).
    private func pauseListener(forLimit: Bool) {
        guard let handle = bound else { return }
        evconnlistener_disable(evhttp_bound_socket_get_listener(handle))
        if forLimit {
            isPausedForLimit = true
        } else if !isPausedForBurst {
            isPausedForBurst = true
            loop.execute(priority: .input) { [weak self] in
                guard let self else { return }
                self.isPausedForBurst = false
                self.acceptedThisTurn = 0
                self.resumeListenerIfAllowed()
            }
        }
    }

    /// The connection limit allows accepting again (called by the owner on the loop's thread).
    func resumeAfterLimit() {
        isPausedForLimit = false
        acceptedThisTurn = 0
        resumeListenerIfAllowed()
    }

    private func resumeListenerIfAllowed() {
        guard !isPausedForLimit, !isPausedForBurst, let handle = bound else { return }
        evconnlistener_enable(evhttp_bound_socket_get_listener(handle))
    }

    // MARK: Deadlines

    /// Closes connections whose request is arriving too slowly (head or body past its timeout)
    /// and those the head guard answered once their answer is out. Runs as a loop callback
    /// (a timer), not inside libevent. Returns whether a connection is still open.
    func sweep(now: UInt64) -> Bool {
        let header = limits.headerTimeout.nanoseconds
        let body = limits.bodyTimeout.nanoseconds
        var expired: [EvhttpConnection] = []
        for connection in connections.values where connection.current == nil {
            if connection.answeredAt != 0 {
                if connection.outputIsEmpty || now &- connection.answeredAt > 2_000_000_000 { expired.append(connection) }
            } else if connection.headBytes > 0 && !connection.headComplete {
                if now &- connection.headStartedAt > header { expired.append(connection) }
            } else if connection.headComplete {
                if now &- connection.bodyStartedAt > body { expired.append(connection) }
            }
        }
        for connection in expired { connection.closeForTimeout() }
        return !connections.isEmpty
    }

    fileprivate func received(_ raw: OpaquePointer) {
        guard let evcon = evhttp_request_get_connection(raw),
              let filter = evhttp_connection_get_bufferevent(evcon),
              let connection = connections[filter]
        else {
            // Not a connection of ours (cannot happen): answer rather than leave it hanging.
            evhttp_send_error(raw, 500, nil)
            return
        }
        let request = EvhttpRequest(raw: raw, connection: connection)
        connection.requestReceived(request)
        evhttp_request_set_on_complete_cb(raw, requestCompleteTrampoline, Unmanaged.passUnretained(request).toOpaque())
        delegate?.evhttpReceived(request)
    }

    fileprivate func completed(_ request: EvhttpRequest) {
        let connection = request.connection
        guard connection.current === request else { return }
        connection.current = nil
        request.markWritten()
        connection.requestCompleted()
        delegate?.evhttpFinished(request, written: true)
    }

    fileprivate func guardAnswered(status: Int) {
        delegate?.evhttpAnsweredByGuard(status: status)
    }
}

extension Duration {
    /// Whole nanoseconds, clamped to zero for negative durations.
    var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 { return 0 }
        return UInt64(seconds) &* 1_000_000_000 &+ UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}

/// Monotonic nanoseconds.
@inline(__always)
func monotonicNow() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

// MARK: - One connection

/// One accepted connection: its bufferevents, and where its current request head stands.
final class EvhttpConnection {
    private(set) weak var server: EvhttpServer?
    private(set) var filter: OpaquePointer?
    private let underlying: OpaquePointer
    private var kick: OpaquePointer?
    /// Watches the socket for room while output waits (see `filterOutput`).
    private var writable: OpaquePointer?
    private var base: OpaquePointer?
    private var context: UnsafeMutableRawPointer?
    private var outputCallback: OpaquePointer?
    private var isDetached = false
    private(set) var isClosed = false
    fileprivate(set) var timedOut = false

    /// The request handed over and not yet finished.
    var current: EvhttpRequest?

    // The head guard: bytes of the current request's head seen so far, and of its current line.
    private(set) var headBytes = 0
    private var lineLength = 0
    private(set) var headComplete = false
    private(set) var headStartedAt: UInt64 = 0
    private(set) var bodyStartedAt: UInt64 = 0
    /// The next request's head went over the limit while this one was in flight.
    private var rejectPending = false
    /// When the guard's own answer was queued (0: never); the connection closes once it is out.
    private(set) var answeredAt: UInt64 = 0
    private let maxHeaderBytes: Int

    fileprivate init(server: EvhttpServer, underlying: OpaquePointer) {
        self.server = server
        self.underlying = underlying
        self.maxHeaderBytes = server.limits.maxHeaderBytes
    }

    fileprivate func attach(filter: OpaquePointer, base: OpaquePointer, context: UnsafeMutableRawPointer) {
        self.filter = filter
        self.base = base
        self.context = context
        kick = event_new(base, -1, 0, kickTrampoline, context)
        outputCallback = evbuffer_add_cb(bufferevent_get_output(filter), outputAddedTrampoline, context)
    }

    /// Bytes written and not yet taken by the kernel.
    var bufferedOutputBytes: Int {
        guard !isClosed, let filter else { return 0 }
        return evbuffer_get_length(bufferevent_get_output(filter)) + evbuffer_get_length(bufferevent_get_output(underlying))
    }

    // MARK: Output (inside libevent)

    /// The filter's output step: writes straight to the socket, and keeps what the kernel did
    /// not take. evhttp treats "output drained" as "sent" (it frees a `Connection: close`
    /// connection at that moment); handing the bytes to the socket bufferevent would drop
    /// whatever that one had not written yet. What waits is written when the socket has room.
    fileprivate func filterOutput(source: OpaquePointer) -> bufferevent_filter_result {
        // Only from the kick (the next poll), never while evhttp is still adding output: evhttp
        // sets its "written" callback after adding, so output sent at once would report to the
        // callback of the previous write.
        guard isFlushing else { return BEV_NEED_MORE }
        let pending = evbuffer_get_length(source)
        if pending == 0 { return BEV_NEED_MORE }
        let fd = bufferevent_getfd(underlying)
        guard fd >= 0 else { return BEV_NEED_MORE }
        let written = evbuffer_write(source, fd)
        if written < 0 {
            let code = errno
            if code != EAGAIN && code != EWOULDBLOCK && code != EINTR {
                // The peer is gone: drop the output; reading will report the close.
                evbuffer_drain(source, pending)
                return BEV_OK
            }
        }
        if evbuffer_get_length(source) > 0 {
            watchForRoom(fd: fd)
            return written > 0 ? BEV_OK : BEV_NEED_MORE
        }
        return BEV_OK
    }

    private func watchForRoom(fd: Int32) {
        if writable == nil, let base, let context {
            writable = event_new(base, fd, Int16(EV_WRITE), kickTrampoline, context)
        }
        if let writable { event_add(writable, nil) }
    }

    var outputIsEmpty: Bool { bufferedOutputBytes == 0 }

    // MARK: The head guard (inside libevent)

    /// The filter's input step: scans what arrives while a head is incomplete, and hands the
    /// bytes to evhttp; drops them once the guard has answered.
    fileprivate func filterInput(source: OpaquePointer, destination: OpaquePointer, limit: Int) -> bufferevent_filter_result {
        let available = evbuffer_get_length(source)
        if available == 0 { return BEV_NEED_MORE }
        if answeredAt != 0 || rejectPending {
            evbuffer_drain(source, available)
            return BEV_OK
        }
        let count = limit < 0 ? available : min(available, limit)
        if count == 0 { return BEV_NEED_MORE }
        if !headComplete && !scan(source, count: count) {
            evbuffer_drain(source, available)
            refuseOversizedHead()
            return BEV_OK
        }
        evbuffer_remove_buffer(source, destination, count)
        return BEV_OK
    }

    /// Scans up to `count` bytes of `buffer` for the blank line that ends a head. Returns false
    /// when the head is over the limit.
    private func scan(_ buffer: OpaquePointer, count: Int) -> Bool {
        withUnsafeTemporaryAllocation(of: iovec.self, capacity: 8) { vectors in
            var offset = 0
            var position = evbuffer_ptr()
            while offset < count && !headComplete {
                let filled: Int
                if offset == 0 {
                    filled = Int(evbuffer_peek(buffer, count, nil, vectors.baseAddress, 8))
                } else {
                    guard evbuffer_ptr_set(buffer, &position, offset, EVBUFFER_PTR_SET) == 0 else { break }
                    filled = Int(evbuffer_peek(buffer, count - offset, &position, vectors.baseAddress, 8))
                }
                if filled <= 0 { break }
                for index in 0..<min(filled, 8) {
                    let vector = vectors[index]
                    guard let base = vector.iov_base else { continue }
                    let length = min(vector.iov_len, count - offset)
                    if !scanBytes(UnsafeRawBufferPointer(start: base, count: length)) { return false }
                    offset += length
                    if headComplete || offset >= count { break }
                }
            }
            return headBytes <= maxHeaderBytes
        }
    }

    /// Advances the head scan over `bytes`; false once the head is over the limit.
    private func scanBytes(_ bytes: UnsafeRawBufferPointer) -> Bool {
        for byte in bytes {
            if headBytes == 0 { headStartedAt = monotonicNow() }
            headBytes += 1
            if byte == 0x0A {
                if lineLength == 0 {
                    headComplete = true
                    bodyStartedAt = monotonicNow()
                    return headBytes <= maxHeaderBytes
                }
                lineLength = 0
            } else if byte != 0x0D {
                lineLength += 1
            }
            if headBytes > maxHeaderBytes { return false }
        }
        return true
    }

    private func resetHead() {
        headBytes = 0
        lineLength = 0
        headComplete = false
        headStartedAt = 0
        bodyStartedAt = 0
    }

    /// The head is over the limit: answer 431 now, or after the request in flight.
    private func refuseOversizedHead() {
        if current != nil {
            rejectPending = true
        } else {
            answerOversizedHead()
        }
    }

    private func answerOversizedHead() {
        rejectPending = false
        answeredAt = monotonicNow()
        let body = "request head larger than \(maxHeaderBytes) bytes\n"
        let text = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
            + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n" + body
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { _ = bufferevent_write(underlying, $0.baseAddress, $0.count) }
        server?.guardAnswered(status: 431)
    }

    fileprivate func requestReceived(_ request: EvhttpRequest) {
        current = request
        // What evhttp holds beyond this request is the start of the next one: scan it now.
        resetHead()
        guard let filter else { return }
        let leftover = bufferevent_get_input(filter)!
        let length = evbuffer_get_length(leftover)
        if length > 0 && !scan(leftover, count: length) {
            evbuffer_drain(leftover, length)
            rejectPending = true
        }
    }

    fileprivate func requestCompleted() {
        if rejectPending { answerOversizedHead() }
    }

    // MARK: Closing

    /// Makes evhttp drop the connection as if the client had timed out (a loop callback).
    func closeForTimeout() {
        guard !isClosed, let filter else { return }
        timedOut = answeredAt == 0
        bufferevent_trigger_event(filter, Int16(BEV_EVENT_TIMEOUT | BEV_EVENT_READING), 0)
    }

    /// The filter was freed (inside libevent): the connection is gone.
    fileprivate func closed() {
        guard !isClosed else { return }
        isClosed = true
        if let kick { event_free(kick) }
        kick = nil
        if let writable { event_free(writable) }
        writable = nil
        if let outputCallback, let filter { evbuffer_remove_cb_entry(bufferevent_get_output(filter), outputCallback) }
        outputCallback = nil
        if !isDetached { server?.connectionClosed(self) }
    }

    /// evhttp is being freed with this connection open: its own close report is not needed.
    fileprivate func detach() { isDetached = true }

    private var isFlushing = false

    /// Writes pending output now (a loop callback, after a whole response was handed over).
    func flushNow() {
        guard !isClosed, let kick else { return }
        event_del(kick)
        flushOutput()
    }

    fileprivate func flushOutput() {
        guard !isClosed, let filter else { return }
        isFlushing = true
        bufferevent_flush(filter, Int16(EV_WRITE), BEV_NORMAL)
        isFlushing = false
    }

    fileprivate func nudge() {
        if let kick { event_active(kick, Int32(EV_TIMEOUT), 1) }
    }

    fileprivate func outputAdded(_ buffer: OpaquePointer) {
        if let kick { event_active(kick, Int32(EV_TIMEOUT), 1) }
        // Output with no request handed over is one of evhttp's own answers (400 for a
        // malformed request, 413 for a body over the limit): count it by its status.
        if current == nil && answeredAt == 0 {
            var head = [UInt8](repeating: 0, count: 12)
            if evbuffer_copyout(buffer, &head, 12) == 12, head.starts(with: Array("HTTP/1.".utf8)),
               let status = Int(String(decoding: head[9..<12], as: UTF8.self)), status >= 200
            {
                server?.guardAnswered(status: status)
            }
        }
    }
}

// MARK: - One request

/// A request evhttp read in full, until its response is handed back. Loop thread only.
///
/// The `evhttp_request` is owned by evhttp; this handle may touch it until it hands it back with
/// its final send (`sendReply`, `endChunked`). If the connection was lost meanwhile, evhttp
/// detached the request and frees it on that final send; if evhttp was freed, the handle is dead
/// and sending does nothing.
final class EvhttpRequest {
    private var raw: OpaquePointer?
    let connection: EvhttpConnection
    private(set) var isChunked = false
    /// The response went out in full (`on_complete`).
    private(set) var wasWritten = false
    private var drainWaiters: [() -> Void] = []

    fileprivate init(raw: OpaquePointer, connection: EvhttpConnection) {
        self.raw = raw
        self.connection = connection
    }

    /// Whether a reply can still reach the client.
    var isConnectionOpen: Bool { raw != nil && !connection.isClosed }

    fileprivate func markDead() { raw = nil }
    fileprivate func markWritten() { wasWritten = true }
    fileprivate func connectionLost() {
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
    var pathAndQuery: (path: String, rawPath: String, query: [(String, String)]) {
        guard let raw, let uri = evhttp_request_get_evhttp_uri(raw) else { return ("/", "/", []) }
        let rawPath = evhttp_uri_get_path(uri).map { String(cString: $0) } ?? "/"
        var path = rawPath
        if let decoded = evhttp_uridecode(rawPath, 0, nil) {
            path = String(cString: decoded)
            Glibc.free(decoded)
        }
        var items: [(String, String)] = []
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

    var headers: [(String, String)] {
        guard let raw, let list = evhttp_request_get_input_headers(raw) else { return [] }
        return Self.pairs(list)
    }

    private static func pairs(_ list: UnsafeMutablePointer<evkeyvalq>) -> [(String, String)] {
        var result: [(String, String)] = []
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

    /// `host:port` of the client (`[v6]:port` for IPv6).
    var remoteAddress: String {
        guard let raw, let evcon = evhttp_request_get_connection(raw) else { return "" }
        var address: UnsafeMutablePointer<CChar>?
        var port: UInt16 = 0
        evhttp_connection_get_peer(evcon, &address, &port)
        let host = address.map { String(cString: $0) } ?? ""
        return host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    // MARK: Replying

    private func addHeaders(_ headers: [(String, String)], to raw: OpaquePointer) {
        guard let list = evhttp_request_get_output_headers(raw) else { return }
        for (name, value) in headers {
            // evhttp refuses values with CR or LF (header injection): such a header is dropped.
            _ = evhttp_add_header(list, name, value)
        }
    }

    /// Sends a whole response and hands the request back. `body` is not sent for HEAD.
    func sendReply(status: Int, reason: String, headers: [(String, String)], body: [UInt8]) {
        guard let raw else { return }
        self.raw = nil
        if !connection.isClosed {
            addHeaders(headers, to: raw)
            if !body.isEmpty, let output = evhttp_request_get_output_buffer(raw) {
                body.withUnsafeBytes { _ = evbuffer_add(output, $0.baseAddress, $0.count) }
            }
        }
        evhttp_send_reply(raw, Int32(status), reason, nil)
        // evhttp has set its "written" callback: hand the response to the socket now rather
        // than on the next poll (what follows — the request's completion, the next request on
        // the connection — only records and posts, as inside libevent).
        connection.flushNow()
    }

    /// Starts a chunked response (or, for HTTP/1.0 clients, one ended by closing).
    func startChunked(status: Int, reason: String, headers: [(String, String)]) {
        guard let raw, !isChunked else { return }
        isChunked = true
        if !connection.isClosed { addHeaders(headers, to: raw) }
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

// MARK: - Trampolines (inside libevent: record, hand off)

private let requestTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { raw, argument in
    guard let raw, let argument else { return }
    Unmanaged<EvhttpServer>.fromOpaque(argument).takeUnretainedValue().received(raw)
}

private let connectionTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> OpaquePointer? = { _, argument in
    guard let argument else { return nil }
    return Unmanaged<EvhttpServer>.fromOpaque(argument).takeUnretainedValue().makeConnection()
}

private let requestCompleteTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, argument in
    guard let argument else { return }
    let request = Unmanaged<EvhttpRequest>.fromOpaque(argument).takeUnretainedValue()
    request.connection.server?.completed(request)
}

private let chunkDrainedTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, argument in
    guard let argument else { return }
    Unmanaged<EvhttpRequest>.fromOpaque(argument).takeUnretainedValue().chunkDrained()
}

private let inputFilterTrampoline: bufferevent_filter_cb = { source, destination, limit, _, context in
    guard let source, let destination, let context else { return BEV_ERROR }
    return Unmanaged<EvhttpConnection>.fromOpaque(context).takeUnretainedValue()
        .filterInput(source: source, destination: destination, limit: Int(limit))
}

/// The filter's context is the connection, retained once at creation: released here.
private let contextFreedTrampoline: @convention(c) (UnsafeMutableRawPointer?) -> Void = { context in
    guard let context else { return }
    Unmanaged<EvhttpConnection>.fromOpaque(context).takeRetainedValue().closed()
}

/// evhttp added output to the filter (a response, or one of its own error pages): libevent 2.1
/// does not move a filter's output while writing was disabled when it was added, so nudge it on
/// the next poll.
private let outputAddedTrampoline: @convention(c) (OpaquePointer?, UnsafePointer<evbuffer_cb_info>?, UnsafeMutableRawPointer?) -> Void = { buffer, info, context in
    guard let buffer, let info, info.pointee.n_added > 0, info.pointee.orig_size == 0, let context else {
        if let info, info.pointee.n_added > 0, let context {
            Unmanaged<EvhttpConnection>.fromOpaque(context).takeUnretainedValue().nudge()
        }
        return
    }
    Unmanaged<EvhttpConnection>.fromOpaque(context).takeUnretainedValue().outputAdded(buffer)
}

private let outputFilterTrampoline: bufferevent_filter_cb = { source, _, _, _, context in
    guard let source, let context else { return BEV_ERROR }
    return Unmanaged<EvhttpConnection>.fromOpaque(context).takeUnretainedValue().filterOutput(source: source)
}

private let kickTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    Unmanaged<EvhttpConnection>.fromOpaque(context).takeUnretainedValue().flushOutput()
}
