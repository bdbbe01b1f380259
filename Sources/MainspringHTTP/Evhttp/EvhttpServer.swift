// Sources/MainspringHTTP/Evhttp/ is the only folder of MainspringHTTP that imports CLibevent: it
// wraps libevent's HTTP server (evhttp) for one loop. Everything here runs on that loop's thread.
//
// What runs inside libevent (the C callbacks, "trampolines") only records what happened and hands
// it to the loop: the server's delegate posts the request to the loop with `execute`, so no user
// handler ever runs inside `event_base_loop` (a handler may spin the loop; fairness applies).
//
// The folder, by concern:
// - EvhttpServer.swift (this file): one loop's `struct evhttp`, accepting (paced per loop turn,
//   paused at the connection limit), the table of open connections, handing requests over.
// - ListeningSocket.swift: the listening socket every loop of a server accepts from.
// - EvhttpConnection.swift: the pass-through filter bufferevent of one connection (its output
//   written straight to the socket, its input checked by the head guard, its close).
// - RequestHeadScan.swift: the head guard's scan of a request head as it arrives (431; 400 or
//   501 for a head without one `Host` or with ambiguous framing).
// - EvhttpDeadlines.swift: the sweep that closes connections whose request arrives too slowly.
// - EvhttpRequest.swift: one request handed to Swift, read into values and answered (whole or
//   chunked).
internal import CLibevent
@_spi(MainspringHTTP) import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// One loop's evhttp: its `struct evhttp`, the connections it has open, and the deadlines of
/// requests that are arriving. Loop thread only (`@unchecked Sendable` only so that the loop's own
/// posts can carry it).
final class EvhttpServer: ServerEngine, @unchecked Sendable {
    private var raw: OpaquePointer?
    private let base: OpaquePointer
    let limits: ServerLimits
    weak var delegate: ServerEngineDelegate?
    private var bound: OpaquePointer?
    /// Open connections, by their filter bufferevent. Loop thread only; every access is a
    /// lookup or an update over before the next begins (no dynamic exclusivity check).
    @exclusivity(unchecked) private(set) var connections: [OpaquePointer: EvhttpConnection] = [:]
    private var acceptedThisTurn = 0
    private var isPausedForBurst = false
    private var isPausedForLimit = false
    let loop: EventLoop

    init(loop: EventLoop, limits: ServerLimits) throws(HTTPServerError) {
        self.loop = loop
        self.base = loop.eventBasePointer
        self.limits = limits
        guard let http = evhttp_new(base) else { throw .libevent(function: "evhttp_new", errno: errno) }
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
            let code = errno
            close(fd)
            throw .libevent(function: "evhttp_accept_socket_with_handle", errno: code)
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

    /// evhttp's slow-request deadlines are the endpoint's periodic sweep (EvhttpDeadlines.swift).
    var needsSweep: Bool { true }

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
                delegate?.finished(request, written: false)
            }
            connection.detach()
            delegate?.closedConnection(timedOut: false)
        }
        connections.removeAll()
        evhttp_free(http)
    }

    // MARK: Connections

    fileprivate func makeConnection() -> OpaquePointer? {
        guard let (connection, filter) = EvhttpConnection.make(server: self, base: base) else { return nil }
        connections[filter] = connection
        acceptedThisTurn += 1
        let mayContinue = delegate?.acceptedConnection() ?? true
        if !mayContinue {
            pauseListener(forLimit: true)
        } else if acceptedThisTurn >= limits.acceptBurst {
            pauseListener(forLimit: false)
        }
        return filter
    }

    func connectionClosed(_ connection: EvhttpConnection) {
        guard let filter = connection.filter else { return }
        connections[filter] = nil
        if let request = connection.current {
            connection.current = nil
            request.connectionLost()
            delegate?.finished(request, written: false)
        }
        delegate?.closedConnection(timedOut: connection.timedOut)
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
            // A strong capture (a weak one would put every retain of the server on its slow
            // path): after `free()` the listener is gone and resuming does nothing.
            loop.execute(priority: .input) { [self] in
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

    // MARK: Requests

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
        delegate?.received(request)
    }

    fileprivate func completed(_ request: EvhttpRequest) {
        let connection = request.connection
        guard connection.current === request else { return }
        connection.current = nil
        request.markWritten()
        connection.requestCompleted()
        delegate?.finished(request, written: true)
    }

    func guardAnswered(status: Int) {
        delegate?.answeredByGuard(status: status)
    }
}

// MARK: - Trampolines (inside libevent: record, hand off)

private let requestTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { raw, argument in
    guard let raw, let argument else { return }
    // The server outlives its evhttp, so no retain is needed for the call.
    Unmanaged<EvhttpServer>.fromOpaque(argument)._withUnsafeGuaranteedRef { $0.received(raw) }
}

private let connectionTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> OpaquePointer? = { _, argument in
    guard let argument else { return nil }
    return Unmanaged<EvhttpServer>.fromOpaque(argument).takeUnretainedValue().makeConnection()
}

private let requestCompleteTrampoline: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, argument in
    guard let argument else { return }
    // Retained for the call: completing it drops the connection's reference, maybe the last.
    let request = Unmanaged<EvhttpRequest>.fromOpaque(argument).takeUnretainedValue()
    request.connection.server.completed(request)
}
