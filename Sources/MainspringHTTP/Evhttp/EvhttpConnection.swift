// One accepted connection, as Mainspring sees it. evhttp's `bevcb` hook lets the server choose the
// bufferevent of each connection: it gets a pass-through *filter* bufferevent over the socket's.
// The filter is where Mainspring sees the connection: its free callback is the one exact
// "connection closed" signal evhttp 2.1 offers (the connection count), its input step runs the
// head guard before evhttp buffers anything (431, 400, 501), and its output step writes
// responses straight to the socket. evhttp still does all the parsing.
internal import CLibevent
import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// One accepted connection: its bufferevents, and where its current request head stands.
final class EvhttpConnection {
    /// The server that accepted it. Not weak (a weak reference would put every retain of the
    /// server on its slow path): the connection reaches its server only from callbacks of its
    /// own bufferevents and of evhttp, which exist only while the server does. The server detaches
    /// every connection before it frees evhttp, and a detached connection does not call it.
    unowned let server: EvhttpServer
    private(set) var filter: OpaquePointer?
    private let underlying: OpaquePointer
    private var kick: OpaquePointer?
    /// Watches the socket for room while output waits (see `filterOutput`).
    private var writable: OpaquePointer?
    private var base: OpaquePointer?
    private var context: UnsafeMutableRawPointer?
    private var outputCallback: OpaquePointer?
    private var isDetached = false
    private var isFlushing = false
    /// The kick is active (output waits for the next poll).
    private var isKicked = false
    /// TCP_NODELAY is set (before the first response: evhttp sets the socket after `bevcb`).
    private var isNagleOff = false
    /// The client's address, formatted at its first request.
    private var peer: String?
    private(set) var isClosed = false
    /// Closed by the slow-request sweep (see EvhttpDeadlines.swift).
    var timedOut = false
    /// The security layer under the connection (HTTPS), if any: output then goes through the
    /// underlying bufferevent (which encrypts), not straight to the socket.
    fileprivate var layer: (any ServerConnectionLayer)?

    /// The request handed over and not yet finished.
    var current: EvhttpRequest?

    /// The head guard: the current request head's bytes so far. Loop thread only, and no scan
    /// re-enters another: no dynamic exclusivity check per read.
    @exclusivity(unchecked) private(set) var head: RequestHeadScan
    /// The next request's head went over the limit while this one was in flight.
    private var rejectPending = false
    /// When the guard's own answer was queued (0: never); the connection closes once it is out
    /// and the peer has left, or two seconds after the answer (see `startLingering`).
    private(set) var answeredAt: UInt64 = 0
    /// Whether the guard's answer is out and the write side shut down (a lingering close).
    private(set) var isLingering = false

    private init(server: EvhttpServer, underlying: OpaquePointer) {
        self.server = server
        self.underlying = underlying
        self.head = RequestHeadScan(maxHeaderBytes: server.limits.maxHeaderBytes,
                                    keepsTargetPath: server.limits.shedsBeforeBody)
    }

    /// A connection for evhttp's next accepted socket: a socket bufferevent (evhttp sets its fd)
    /// under a filter bufferevent, which is what evhttp gets. Inside libevent (`bevcb`).
    static func make(server: EvhttpServer, base: OpaquePointer) -> (EvhttpConnection, filter: OpaquePointer)? {
        let layer = server.limits.layer
        let made = layer.map { $0.makeUnderlying(base: base) } ?? bufferevent_socket_new(base, -1, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue))
        guard let underlying = made else { return nil }
        let connection = EvhttpConnection(server: server, underlying: underlying)
        connection.layer = layer
        // The filter's context is the connection, retained once; `contextFreedTrampoline` releases it.
        let context = Unmanaged.passRetained(connection).toOpaque()
        // Freeing the filter frees the underlying bufferevent, which closes the socket — with a
        // layer too. Without the option evhttp closes the socket itself when it frees the
        // connection, at once, while the underlying bufferevent still has its events on that
        // descriptor and closes it again when it is freed (a later callback): the number may
        // belong to another connection by then. evhttp shuts the socket's output down either
        // way (`shutdown(SHUT_WR)`), so nothing can be sent after it.
        guard let filter = bufferevent_filter_new(underlying, inputFilterTrampoline, outputFilterTrampoline,
                                                  Int32(BEV_OPT_CLOSE_ON_FREE.rawValue), contextFreedTrampoline, context)
        else {
            Unmanaged<EvhttpConnection>.fromOpaque(context).release()
            layer?.release(underlying: underlying)
            bufferevent_free(underlying)
            return nil
        }
        connection.attach(filter: filter, base: base, context: context)
        return (connection, filter)
    }

    private func attach(filter: OpaquePointer, base: OpaquePointer, context: UnsafeMutableRawPointer) {
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

    var outputIsEmpty: Bool { bufferedOutputBytes == 0 }

    /// `host:port` of the client (`[v6]:port` for IPv6), read from `request`'s evhttp connection
    /// the first time and kept: it does not change for the life of the connection.
    func peerAddress(of request: OpaquePointer) -> String {
        if let peer { return peer }
        guard let evcon = evhttp_request_get_connection(request) else { return "" }
        var address: UnsafeMutablePointer<CChar>?
        var port: UInt16 = 0
        evhttp_connection_get_peer(evcon, &address, &port)
        let host = address.map { String(cString: $0) } ?? ""
        let formatted = host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]:\(port)" : "\(host):\(port)"
        peer = formatted
        return formatted
    }

    // MARK: Output (inside libevent)

    /// The filter's output step: writes straight to the socket, and keeps what the kernel did
    /// not take. evhttp treats "output drained" as "sent" (it frees a `Connection: close`
    /// connection at that moment); handing the bytes to the socket bufferevent would drop
    /// whatever that one had not written yet. What waits is written when the socket has room.
    fileprivate func filterOutput(source: OpaquePointer, destination: OpaquePointer) -> bufferevent_filter_result {
        // Only from the kick (the next poll), never while evhttp is still adding output: evhttp
        // sets its "written" callback after adding, so output sent at once would report to the
        // callback of the previous write.
        guard isFlushing else { return BEV_NEED_MORE }
        if !isNagleOff {
            isNagleOff = true
            let fd = bufferevent_getfd(underlying)
            if fd >= 0 { disableNagle(fd) }
        }
        if let layer {
            if rewritesOwnAnswer {
                guard rewriteOwnAnswer(source) else { return BEV_NEED_MORE }
                rewritesOwnAnswer = false
            }
            return writeThroughLayer(layer, source)
        }
        if rewritesOwnAnswer {
            guard rewriteOwnAnswer(source) else { return BEV_NEED_MORE }
            rewritesOwnAnswer = false
        }
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

    /// The filter's output through a layer (TLS): written straight to the socket by the layer,
    /// as the plain path writes, with what the socket did not take kept in the filter — so that
    /// evhttp, which frees a `Connection: close` connection as soon as its output has left the
    /// filter, frees it only once the response is in the kernel. (Handed to the layer's
    /// bufferevent instead, the response waited there for a poll that never came: evhttp had
    /// shut the socket down and freed it, and the client got an empty reply.)
    private func writeThroughLayer(_ layer: any ServerConnectionLayer, _ source: OpaquePointer) -> bufferevent_filter_result {
        var wroteAny = false
        while true {
            let pending = evbuffer_get_length(source)
            if pending == 0 { return BEV_OK }
            // The same count again after a blocked write (OpenSSL's retry rule), else a piece of
            // at most 64 KiB made contiguous.
            let count = layerRetryCount ?? min(pending, 65_536)
            guard let start = evbuffer_pullup(source, count) else { return wroteAny ? BEV_OK : BEV_NEED_MORE }
            switch layer.writeNow(underlying: underlying, UnsafeRawBufferPointer(start: start, count: count)) {
            case .wrote:
                layerRetryCount = nil
                evbuffer_drain(source, count)
                wroteAny = true
            case .blocked:
                layerRetryCount = count
                let fd = bufferevent_getfd(underlying)
                if fd >= 0 { watchForRoom(fd: fd) }
                return wroteAny ? BEV_OK : BEV_NEED_MORE
            case .failed:
                // The peer is gone: drop the output; reading will report the close.
                layerRetryCount = nil
                evbuffer_drain(source, pending)
                return BEV_OK
            }
        }
    }

    private func watchForRoom(fd: Int32) {
        if writable == nil, let base, let context {
            writable = event_new(base, fd, Int16(EV_WRITE), kickTrampoline, context)
        }
        if let writable { event_add(writable, nil) }
    }

    /// Runs `body` (which adds output and then has it flushed with `flushNow`) without the
    /// per-addition callback that nudges the output out on the next poll: evhttp adds a response
    /// in several pieces (status line, each header field, body), each a callback otherwise.
    func withOutputNudgesSuspended(_ body: () -> Void) {
        guard !isClosed, let outputCallback, let filter, let output = bufferevent_get_output(filter) else {
            body()
            return
        }
        evbuffer_cb_clear_flags(output, outputCallback, UInt32(EVBUFFER_CB_ENABLED))
        body()
        // `body` may have closed the connection (freeing the buffer and the callback with it).
        if !isClosed { evbuffer_cb_set_flags(output, outputCallback, UInt32(EVBUFFER_CB_ENABLED)) }
    }

    /// Writes pending output now (a loop callback, after a whole response was handed over).
    func flushNow() {
        guard !isClosed, let kick else { return }
        if isKicked {
            isKicked = false
            event_del(kick)
        }
        flushOutput()
    }

    fileprivate func flushOutput() {
        isKicked = false
        guard !isClosed, let filter else { return }
        isFlushing = true
        bufferevent_flush(filter, Int16(EV_WRITE), BEV_NORMAL)
        isFlushing = false
    }

    fileprivate func nudge() {
        guard !isKicked, let kick else { return }
        isKicked = true
        event_active(kick, Int32(EV_TIMEOUT), 1)
    }

    fileprivate func outputAdded(_ buffer: OpaquePointer) {
        nudge()
        if isRewriting { return }  // the rewritten page going back in: counted already
        // Output with no request handed over is one of evhttp's own answers (400 for a
        // malformed request, 413 for a body over the limit): count it by its status.
        if current == nil && answeredAt == 0 {
            var head = [UInt8](repeating: 0, count: 12)
            if evbuffer_copyout(buffer, &head, 12) == 12, head.starts(with: Array("HTTP/1.".utf8)),
               let status = Int(String(decoding: head[9..<12], as: UTF8.self)), status >= 200
            {
                server.guardAnswered(status: status)
                // evhttp's error pages are HTML; every other error body of the server is plain
                // text: the page is rewritten when it goes out (it is complete by then).
                if status >= 400 { rewritesOwnAnswer = true }
            }
        }
    }

    /// One of evhttp's own error pages waits in the output, to go out as plain text.
    private var rewritesOwnAnswer = false
    /// The byte count of a layer write that blocked: the next one offers the same bytes again.
    private var layerRetryCount: Int?
    /// The rewrite is putting the page back into the output.
    private var isRewriting = false

    /// Rewrites the evhttp error page at the start of `output` as the server's plain-text form
    /// (`Content-Type: text/plain; charset=utf-8`, the reason phrase as the body), keeping its
    /// status line and other fields. False while the page is not complete yet.
    private func rewriteOwnAnswer(_ output: OpaquePointer) -> Bool {
        let separator = Array("\r\n\r\n".utf8)
        let found = separator.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { evbuffer_search(output, $0.baseAddress, $0.count, nil) }
        }
        guard found.pos >= 0 else { return false }
        let headLength = found.pos + separator.count
        var headBytes = [UInt8](repeating: 0, count: headLength)
        guard evbuffer_copyout(output, &headBytes, headLength) == headLength else { return false }
        let lines = String(decoding: headBytes, as: UTF8.self).components(separatedBy: "\r\n").filter { !$0.isEmpty }
        guard let statusLine = lines.first else { return true }
        var bodyLength = 0
        var kept: [String] = []
        for line in lines.dropFirst() {
            let name = line.prefix { $0 != ":" }.lowercased()
            if name == "content-length" {
                bodyLength = Int(line.drop { $0 != ":" }.dropFirst().trimmingCharacters(in: .whitespaces)) ?? 0
            } else if name != "content-type" {
                kept.append(line)
            }
        }
        guard evbuffer_get_length(output) >= headLength + bodyLength else { return false }
        let reason = statusLine.split(separator: " ", maxSplits: 2).dropFirst(2).first.map(String.init) ?? "Error"
        let body = reason + "\n"
        let text = ([statusLine, "Content-Type: text/plain; charset=utf-8"] + kept + ["Content-Length: \(body.utf8.count)"])
            .joined(separator: "\r\n") + "\r\n\r\n" + body
        isRewriting = true
        evbuffer_drain(output, headLength + bodyLength)
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { _ = evbuffer_prepend(output, $0.baseAddress, $0.count) }
        isRewriting = false
        return true
    }

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
        if !head.isComplete {
            if !head.scan(source, count: count, clock: server.loop) {
                evbuffer_drain(source, available)
                refuse(.oversized)
                return BEV_OK
            }
            if let problem = head.problem ?? shedBeforeBody() {
                evbuffer_drain(source, available)
                refuse(problem)
                return BEV_OK
            }
        }
        evbuffer_remove_buffer(source, destination, count)
        return BEV_OK
    }

    /// Why the guard refuses a head.
    enum Refusal {
        /// Over `maxHeaderBytes`: 431.
        case oversized
        /// Malformed (no `Host` in HTTP/1.1, or two; framing that could be read two ways: two
        /// different lengths, a length that is not a number, `Transfer-Encoding` beside
        /// `Content-Length`; a control character in a field): 400 with the reason.
        case badRequest(String)
        /// A transfer coding evhttp does not decode (anything but exactly `chunked`): 501.
        case notImplemented(String)
        /// Load shedding: a request that announces a body, shed as soon as its head is in —
        /// its body never read: 503 with `Retry-After` (seconds).
        case overloaded(retryAfter: Int)
    }

    /// Load shedding before the body: once a head that announces a body is complete (and
    /// well-formed), whether the server sheds it now.
    private func shedBeforeBody() -> Refusal? {
        guard server.limits.shedsBeforeBody, head.isComplete, head.declaresBody,
              let retryAfter = server.delegate?.shedsBeforeBody(path: head.targetPath)
        else { return nil }
        return .overloaded(retryAfter: retryAfter)
    }

    /// The guard's refusal, to send once the request in flight (if any) is answered.
    private var pendingRefusal: Refusal?

    /// Refuses the head: answers now, or after the request in flight.
    private func refuse(_ refusal: Refusal) {
        if current != nil {
            rejectPending = true
            pendingRefusal = refusal
        } else {
            answer(refusal)
        }
    }

    private func answer(_ refusal: Refusal) {
        rejectPending = false
        pendingRefusal = nil
        answeredAt = server.loop.monotonicNow()
        let (status, reason, body) = switch refusal {
        case .oversized: (431, "Request Header Fields Too Large", "request head larger than \(head.maxHeaderBytes) bytes\n")
        case .badRequest(let problem): (400, "Bad Request", problem + "\n")
        case .notImplemented(let problem): (501, "Not Implemented", problem + "\n")
        case .overloaded: (503, "Service Unavailable", "overloaded: try again later\n")
        }
        var extra = ""
        if case .overloaded(let seconds) = refusal { extra = "Retry-After: \(seconds)\r\n" }
        let text = "HTTP/1.1 \(status) \(reason)\r\nContent-Type: text/plain; charset=utf-8\r\n" + extra
            + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n" + body
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { _ = bufferevent_write(underlying, $0.baseAddress, $0.count) }
        server.guardAnswered(status: status)
    }

    /// The guard's answer is out: shuts the write side down, so the peer reads the answer and
    /// then the end of the connection, while what it still sends (the rest of an upload that
    /// was shed, say) is read and dropped. Closing at once instead would meet that unread input
    /// and reset the connection — and a client busy sending would often see only the reset,
    /// never the answer. The connection closes when the peer leaves, or at the sweep's linger
    /// deadline. A loop callback.
    func startLingering() {
        guard !isLingering, !isClosed else { return }
        isLingering = true
        let fd = bufferevent_getfd(underlying)
        if fd >= 0 { shutdown(fd, Int32(SHUT_WR)) }
    }

    /// evhttp read `request` in full (inside libevent).
    func requestReceived(_ request: EvhttpRequest) {
        current = request
        // What evhttp holds beyond this request is the start of the next one: scan it now.
        head.reset()
        guard let filter else { return }
        let leftover = bufferevent_get_input(filter)!
        let length = evbuffer_get_length(leftover)
        guard length > 0 else { return }
        if !head.scan(leftover, count: length, clock: server.loop) {
            evbuffer_drain(leftover, length)
            rejectPending = true
            pendingRefusal = .oversized
        } else if let problem = head.problem ?? shedBeforeBody() {
            evbuffer_drain(leftover, length)
            rejectPending = true
            pendingRefusal = problem
        }
    }

    /// The current request's response went out (inside libevent).
    func requestCompleted() {
        if rejectPending { answer(pendingRefusal ?? .oversized) }
    }

    // MARK: Closing

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
        // An adopted session lets go of its contexts' keeper too: OpenSSL reads it only while a
        // handshake runs (SNI), and the server's sessions refuse renegotiation.
        layer?.release(underlying: underlying)
        if let pending = pendingAdoption {
            pendingAdoption = nil
            finishAdoption(pending)
        }
        if !isDetached { server.connectionClosed(self) }
    }

    /// evhttp is being freed with this connection open: its own close report is not needed.
    func detach() { isDetached = true }

    // MARK: Taking the socket over (a WebSocket upgrade)

    /// Takes the socket away from this connection (libevent 2.1's evhttp has no way to hand
    /// one over), for the caller to free the evhttp connection next, or nil (nothing changed)
    /// with output still waiting, a guard's answer out, or the connection closed.
    ///
    /// evhttp shuts a connection's socket down (`shutdown(SHUT_WR)`) when it frees it, which a
    /// duplicate would share; so the descriptor number evhttp knows is pointed at a fresh,
    /// unconnected socket (`dup2`) for evhttp to shut down, once the socket's events are out of
    /// epoll (a registration belongs to the socket, not the number: left in, it would report
    /// the duplicate's readiness under the old number).
    ///
    /// A plain socket comes back as the duplicate (`.descriptor`), and evhttp closes the
    /// placeholder. Over a layer (HTTPS) the session cannot leave OpenSSL's bufferevent, nor
    /// its socket's number (libevent 2.1 restarts the handshake of a session given a new
    /// descriptor): the bufferevent is kept (one reference more), and once evhttp is done with
    /// the number the caller puts the socket back under it (`.layered`: `move(copy, onto:
    /// number)`); the bufferevent becomes the upgraded connection when this connection's filter
    /// is freed, a loop turn later (`adopted` is called then, from `closed()`, or never if the
    /// server is freed first) — until then the filter's own unlinking would clear any callbacks
    /// set on it.
    func takeOverSocket(options: Connection.Options,
                        adopted: @escaping (Connection, [UInt8]) -> Void) -> TakenSocket?
    {
        guard !isClosed, let filter, outputIsEmpty, answeredAt == 0, !rejectPending else { return nil }
        let fd = bufferevent_getfd(underlying)
        guard fd >= 0 else { return nil }
        guard let copy = duplicateDescriptor(fd) else { return nil }
        guard let placeholder = makePlaceholderSocket() else {
            closeDescriptor(copy)
            return nil
        }
        if layer != nil {
            // The filter suspends its underlying bufferevent's reading while its own is off,
            // and nothing lifts that once the filter is gone: lifted here, reading stopped next.
            bufferevent_enable(filter, Int16(EV_READ))
            bufferevent_incref(underlying)
        }
        bufferevent_disable(underlying, Int16(EV_READ | EV_WRITE))
        if let writable { event_del(writable) }
        var leftover: [UInt8] = []
        for buffer in [bufferevent_get_input(filter), bufferevent_get_input(underlying)] {
            guard let buffer else { continue }
            let length = evbuffer_get_length(buffer)
            guard length > 0 else { continue }
            let start = leftover.count
            leftover.append(contentsOf: repeatElement(0, count: length))
            leftover.withUnsafeMutableBytes { _ = evbuffer_remove(buffer, $0.baseAddress! + start, length) }
        }
        move(placeholder, onto: fd)
        disableNagle(copy)
        guard layer != nil else { return .descriptor(copy, leftover: leftover) }
        pendingAdoption = PendingAdoption(options: options, leftover: leftover, adopted: adopted)
        return .layered(copy, number: fd)
    }

    /// A layered connection taken over, waiting for its filter to be freed (see
    /// `takeOverSocket`).
    private struct PendingAdoption {
        let options: Connection.Options
        let leftover: [UInt8]
        let adopted: (Connection, [UInt8]) -> Void
    }

    private var pendingAdoption: PendingAdoption?

    /// The filter is gone, and with it evhttp's hold on the layer's bufferevent: it becomes the
    /// upgraded connection (inside libevent, in the filter's finalizer; the connection only
    /// registers itself and starts reading). When the server is being freed, or the layer
    /// cannot make the connection, the kept reference is dropped (the bufferevent then closes
    /// the socket and frees the session).
    private func finishAdoption(_ pending: PendingAdoption) {
        guard !isDetached, let layer else {
            bufferevent_decref(underlying)
            return
        }
        do throws(EventLoopError) {
            let connection = try layer.adoptUpgraded(underlying: underlying, peer: peer ?? "", on: server.loop,
                                                     options: pending.options)
            pending.adopted(connection, pending.leftover)
        } catch {
            bufferevent_decref(underlying)
        }
    }
}

/// What `EvhttpConnection.takeOverSocket` took.
enum TakenSocket {
    /// A duplicate of the plain socket, the caller's, and the bytes that came after the request.
    case descriptor(Int32, leftover: [UInt8])
    /// Over a layer: the socket's duplicate, for the caller to move back under `number` (the
    /// descriptor the layer's bufferevent and session use) once evhttp is done with it; the
    /// bufferevent itself is handed over when evhttp lets go of it.
    case layered(Int32, number: Int32)
}

// MARK: - Trampolines (inside libevent: record, hand off)
//
// The connection is retained by its filter's context until the filter is freed, and libevent
// frees a bufferevent only once no callback of it runs: no retain is needed for these calls.

private let inputFilterTrampoline: bufferevent_filter_cb = { source, destination, limit, _, context in
    guard let source, let destination, let context else { return BEV_ERROR }
    return Unmanaged<EvhttpConnection>.fromOpaque(context)._withUnsafeGuaranteedRef {
        $0.filterInput(source: source, destination: destination, limit: Int(limit))
    }
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
            Unmanaged<EvhttpConnection>.fromOpaque(context)._withUnsafeGuaranteedRef { $0.nudge() }
        }
        return
    }
    Unmanaged<EvhttpConnection>.fromOpaque(context)._withUnsafeGuaranteedRef { $0.outputAdded(buffer) }
}

private let outputFilterTrampoline: bufferevent_filter_cb = { source, destination, _, _, context in
    guard let source, let destination, let context else { return BEV_ERROR }
    return Unmanaged<EvhttpConnection>.fromOpaque(context)._withUnsafeGuaranteedRef {
        $0.filterOutput(source: source, destination: destination)
    }
}

private let kickTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    Unmanaged<EvhttpConnection>.fromOpaque(context)._withUnsafeGuaranteedRef { $0.flushOutput() }
}
