@_spi(MainspringHTTP) import MainspringCore

/// One loop's share of an `HTTPServer`: its engine (the connection engine; see
/// ServerEngine.swift), its in-flight requests (counted as the loop's busy work, so a graceful
/// group shutdown waits for them). Loop thread only, but for its constants
/// (`loop`, `routes`, `statistics`).
final class LoopEndpoint: ServerEngineDelegate, @unchecked Sendable {
    let loop: EventLoop
    let routes: HTTPRoutes
    let statistics: HTTPServerStatistics
    private let shared: ServerShared
    private var engine: (any ServerEngine)?
    private var attachment: LoopAttachment?
    private(set) var isDraining = false
    private var inFlight = 0
    // These three are touched on the loop's thread only, each access over before the next
    // begins: no dynamic exclusivity check per request.
    @exclusivity(unchecked) private var date = HTTPDateCache()
    /// Requests read and not dispatched yet, oldest first (from `receivedHead` on). Each has one
    /// turn posted that dispatches the oldest: the posted closure captures only `self`, which
    /// the compiler passes as the closure's context instead of allocating one.
    @exclusivity(unchecked) private var received: [(request: any ServerExchange, late: Bool, at: UInt64)?] = []
    @exclusivity(unchecked) private var receivedHead = 0
    /// Load shedding, when configured: its settings and this loop's queue-wait gauge.
    private let shedding: HTTPServer.LoadShedding?
    @exclusivity(unchecked) private var gauge: QueueWaitGauge
    private let retryAfter: HTTPHeaders
    /// The WebSockets this loop upgraded and that are still open: `close()` starts their closing
    /// handshakes (1001). Loop thread only.
    var openWebSockets: [ObjectIdentifier: WebSocketCore] = [:]
    /// The WebSockets whose closing handshake `close()` started (1001) and that have not closed
    /// yet: the loop's share closes once they have, as once its requests are done.
    private var closingWebSockets: [ObjectIdentifier: WebSocketCore] = [:]
    /// A shutdown's counts, from when it began on this loop (nil before).
    private var shutdownCounts: HTTPServer.ShutdownReport?
    /// The end of a shutdown's grace period on this loop.
    private var graceTimer: TimerHandle?

    init(loop: EventLoop, routes: HTTPRoutes, statistics: HTTPServerStatistics, shared: ServerShared,
         limits: ServerLimits, acceptor: ConnectionAcceptor, shedding: HTTPServer.LoadShedding? = nil) throws(HTTPServerError)
    {
        self.shedding = shedding
        gauge = QueueWaitGauge(target: shedding?.queueWaitTarget ?? .zero, window: shedding?.window ?? .seconds(1))
        retryAfter = ["Retry-After": String(max(0, shedding?.retryAfterSeconds ?? 1))]
        self.loop = loop
        self.routes = routes
        self.statistics = statistics
        self.shared = shared
        engine = try ConnectionEngine(loop: loop, limits: limits, acceptor: acceptor, delegate: self)
        attachment = LoopAttachment(loop: loop) { [weak self] in self?.loopClosed() }
    }

    // MARK: The engine's reports (from inside its connections' callbacks: record, hand off)

    func received(_ raw: any ServerExchange) {
        inFlight += 1
        // The loop is busy while any request is in flight: one piece of its work, not one each.
        if inFlight == 1 { attachment?.beginWork() }
        statistics.requestStarted()
        // A request read after `close()` began is not served: once `await close()` has
        // returned, no request gets a handler's answer (it gets 503 and the connection closes).
        received.append((raw, isDraining, shedding == nil ? 0 : loop.monotonicNow()))
        loop.execute(priority: .input) { [self] in dispatchOldest() }
    }

    func finished(_ raw: any ServerExchange, written: Bool) {
        if shutdownCounts != nil {
            // A WebSocket upgrade hands its connection over unwritten: its request is done.
            if written || raw.isTakenOver { shutdownCounts?.finished += 1 } else { shutdownCounts?.aborted += 1 }
        }
        if let limit = raw.heldLimit {
            raw.heldLimit = nil
            limit.leave()
        }
        inFlight -= 1
        if inFlight == 0 { attachment?.endWork() }
        statistics.requestFinished()
        if isDraining && inFlight == 0 {
            loop.execute(priority: .input) { [weak self] in self?.finishDraining() }
        }
    }

    func answeredByGuard(status: Int) {
        statistics.recordResponse(status: status)
    }

    func shedsBeforeBody(path: [UInt8]) -> Int? {
        // A target that is not a plain path (absolute form, percent-encoded) is left to the
        // decision at dispatch, which sees the decoded path: an exempt path is never shed early.
        guard let shedding, path.first == UInt8(ascii: "/"), !path.contains(UInt8(ascii: "%")),
              gauge.verdict(now: loop.monotonicNow()) || isWorkBacklogged(shedding),
              !shedding.neverShed.contains(String(decoding: path, as: UTF8.self))
        else { return nil }
        statistics.requestShed()
        return max(0, shedding.retryAfterSeconds)
    }

    func acceptedConnection() -> Bool {
        let open = statistics.connectionOpened()
        return shared.connectionOpened(open: open)
    }

    func closedConnection(timedOut: Bool) {
        let open = statistics.connectionClosed(timedOut: timedOut)
        shared.connectionClosed(open: open)
    }

    // MARK: Requests

    private func dispatchOldest() {
        guard receivedHead < received.count, let (raw, late, receivedAt) = received[receivedHead] else { return }
        received[receivedHead] = nil
        receivedHead += 1
        if receivedHead == received.count {
            received.removeAll(keepingCapacity: true)
            receivedHead = 0
        }
        if late {
            reply(.status(503), to: raw, method: raw.method)
            return
        }
        if let shedding, shed(raw, receivedAt: receivedAt, by: shedding) { return }
        dispatch(raw)
    }

    /// Load shedding's verdict on a request about to be routed: records its queue wait, and
    /// answers it `503` (and returns true) when it waited past its deadline or the loop's p99
    /// wait is over the target — unless its path is never shed.
    private func shed(_ raw: any ServerExchange, receivedAt: UInt64, by shedding: HTTPServer.LoadShedding) -> Bool {
        let now = loop.monotonicNow()
        let wait = now &- receivedAt
        gauge.record(wait: wait, now: now)
        let pastDeadline = shedding.requestDeadline.map { wait > $0.clampedNanoseconds } ?? false
        guard pastDeadline || gauge.isOverTarget || isWorkBacklogged(shedding),
              !shedding.neverShed.contains(raw.pathAndQuery.path)
        else { return false }
        if pastDeadline { statistics.requestPastDeadline() } else { statistics.requestShed() }
        reply(.status(503, headers: retryAfter), to: raw, method: raw.method)
        return true
    }

    /// Whether a watched feeder of this loop has a job that has waited past the target.
    private func isWorkBacklogged(_ shedding: HTTPServer.LoadShedding) -> Bool {
        for feeder in shedding.watchedFeeders where feeder.loop === loop {
            if feeder.oldestPendingJobWait > shedding.queueWaitTarget { return true }
        }
        return false
    }

    private func dispatch(_ raw: any ServerExchange) {
        guard raw.isConnectionOpen else {
            // Lost before it could run: hand it back unanswered.
            raw.sendReply(status: 500, reason: reasonPhrase(500), body: [])
            return
        }
        let (path, rawPath, query) = raw.pathAndQuery
        let method = raw.method
        let request = HTTPRequest(method: method, version: raw.version, path: path, rawPath: rawPath, uri: raw.uri,
                                  queryItems: query,
                                  headers: HTTPHeaders(fields: raw.headers), body: raw.body,
                                  remoteAddress: raw.remoteAddress, loop: loop, server: statistics)
        switch routes.resolve(method, path) {
        case .notFound:
            reply(.status(404), to: raw, method: method)
        case .methodNotAllowed(let allow):
            reply(.status(405, headers: ["Allow": allow]), to: raw, method: method)
        case .handler(let handler, let limit):
            if let limit {
                guard limit.enter() else {
                    statistics.requestOverLimit()
                    reply(.status(503, headers: ["Retry-After": "1"]), to: raw, method: method)
                    return
                }
                raw.heldLimit = limit
            }
            run(handler, request, raw)
        }
    }

    private func run(_ handler: RouteHandler, _ request: HTTPRequest, _ raw: any ServerExchange) {
        switch handler {
        case .sync(let body):
            let response: HTTPResponse
            do { response = try body(request) } catch { response = Self.errorResponse(error) }
            reply(response, to: raw, method: request.method)
        case .async(let body):
            runAsync(body, request: request, responder: HTTPResponder(endpoint: self, request: raw, method: request.method))
        case .deferred(let body):
            body(request, HTTPResponder(endpoint: self, request: raw, method: request.method))
        case .streaming(let body):
            let writer = HTTPResponseWriter(endpoint: self, request: raw, method: request.method)
            do {
                try body(request, writer)
            } catch {
                writer.fail(with: error)
            }
        case .webSocket(let route):
            upgradeToWebSocket(route, request, raw)
        }
    }

    static func errorResponse(_ error: any Error) -> HTTPResponse {
        if let error = error as? HTTPError { return error.response }
        return .status(500)
    }

    /// Sends `response` for `raw`. Loop thread.
    func reply(_ response: HTTPResponse, to raw: any ServerExchange, method: HTTPMethod) {
        if raw.isConnectionOpen {
            statistics.recordResponse(status: response.status)
            var hasDate = false
            for field in response.headers.fields {
                switch field.name.utf8.count {
                case 14 where field.name.caseInsensitiveEquals("Content-Length"): continue  // the server's own
                case 10 where isDraining && field.name.caseInsensitiveEquals("Connection"): continue
                case 4 where field.name.caseInsensitiveEquals("Date"): hasDate = true
                default: break
                }
                raw.addResponseHeader(field.name, field.value)
            }
            raw.addContentLength(response.body.count)
            if isDraining { raw.addResponseHeader("Connection", "close") }
            if !hasDate { raw.addResponseHeader("Date", date.current(on: loop)) }
        }
        raw.sendReply(status: response.status, reason: reasonPhrase(response.status), body: method == .head ? [] : response.body)
    }

    /// Starts a streamed response. Loop thread.
    func startStream(_ raw: any ServerExchange, status: Int, headers: HTTPHeaders) {
        if raw.isConnectionOpen {
            statistics.recordResponse(status: status)
            var hasDate = false
            for field in headers.fields where !(isDraining && field.name.caseInsensitiveEquals("Connection")) {
                hasDate = hasDate || field.name.caseInsensitiveEquals("Date")
                raw.addResponseHeader(field.name, field.value)
            }
            if isDraining { raw.addResponseHeader("Connection", "close") }
            if !hasDate { raw.addResponseHeader("Date", date.current(on: loop)) }
        }
        raw.startChunked(status: status, reason: reasonPhrase(status))
    }

    // MARK: Closing

    /// Stops accepting; requests in flight finish (their responses close their connections),
    /// then the engine is freed, closing idle connections. Loop thread.
    func close() {
        guard !isDraining else { return }
        isDraining = true
        engine?.stopAccepting()
        let sockets = openWebSockets
        openWebSockets = [:]
        for (key, socket) in sockets {
            closingWebSockets[key] = socket
            socket.startClose(code: .goingAway, reason: "server closing")
        }
        finishDraining()
    }

    /// `close()`, counting what finishes from now on, and after `grace` (nil: never) ending what
    /// is left: the WebSockets still closing, then the requests still in flight (their
    /// connections closed). Loop thread.
    func beginShutdown(grace: Duration?) {
        if shutdownCounts == nil { shutdownCounts = HTTPServer.ShutdownReport() }
        if let grace, graceTimer == nil, attachment != nil {
            graceTimer = loop.schedule(after: max(.nanoseconds(1), grace)) { [weak self] in self?.graceEnded() }
        }
        close()
    }

    /// The grace period is over: what has not finished is cut.
    private func graceEnded() {
        graceTimer = nil
        let sockets = closingWebSockets.values
        shutdownCounts?.webSocketsAborted += sockets.count
        for socket in sockets { socket.connection.abort() }
        attachment?.close()  // frees the engine: requests in flight finish unwritten (aborted)
    }

    /// A WebSocket upgraded after `close()` began: it closes (1001) as the others did.
    func closeLateWebSocket(_ core: WebSocketCore) {
        let key = ObjectIdentifier(core)
        openWebSockets[key] = nil
        closingWebSockets[key] = core
        core.startClose(code: .goingAway, reason: "server closing")
    }

    /// A WebSocket this loop upgraded has closed. Loop thread.
    func webSocketClosed(_ core: WebSocketCore) {
        let key = ObjectIdentifier(core)
        openWebSockets[key] = nil
        guard closingWebSockets.removeValue(forKey: key) != nil else { return }
        shutdownCounts?.webSocketsClosed += 1
        finishDraining()
    }

    /// Closing, and nothing left in flight: the loop's share closes (its idle connections
    /// with it).
    private func finishDraining() {
        guard isDraining, inFlight == 0, closingWebSockets.isEmpty else { return }
        attachment?.close()
    }

    /// The attachment closed (the server closed, or the loop shut down): free the engine.
    private func loopClosed() {
        isDraining = true
        received.removeAll()
        receivedHead = 0
        graceTimer?.cancel()
        graceTimer = nil
        let server = engine
        engine = nil
        server?.free()
        attachment = nil
        shared.endpointClosed(report: shutdownCounts)
    }

    /// Resumes accepting after the connection limit. Loop thread.
    func resumeAccepting() { engine?.resumeAfterLimit() }

    /// Connections open on this loop.
    var connectionCount: Int { engine?.connectionCount ?? 0 }
}

/// What the loops of one server share: the connection limit, and a Unix socket's file.
final class ServerShared: @unchecked Sendable {
    let maxConnections: Int
    /// The Unix socket file the server listens on (nil for TCP and abstract names).
    private let socketFile: UnixSocketFile?
    private let state = Protected(State())
    private struct State {
        var limitReached = false
        var openEndpoints = 0
        var socketFileRemoved = false
        var endpoints: [LoopEndpoint] = []
        var closedWaiters: [UnsafeContinuation<Void, Never>] = []
        var report = HTTPServer.ShutdownReport()
    }

    private func withState<T>(_ body: (inout State) -> T) -> T { state.withLock(body) }
    /// The server's loops' parts, until the last has closed: then the list is emptied, which
    /// breaks the cycle between this and each endpoint (`LoopEndpoint.shared`), so a closed
    /// server's parts are freed. Any thread.
    var endpoints: [LoopEndpoint] { withState { $0.endpoints } }

    init(maxConnections: Int, socketFile: UnixSocketFile?) {
        self.maxConnections = maxConnections
        self.socketFile = socketFile
    }

    /// Removes the Unix socket file, once (and only if it is still the one the server bound,
    /// not a newer server's): when `close()` is called, or when the last loop lets go of the
    /// server (a group shutdown without `close()`), or when starting fails. Any thread.
    func removeSocketFile() {
        guard let socketFile, withState({ state -> Bool in
            defer { state.socketFileRemoved = true }
            return !state.socketFileRemoved
        }) else { return }
        socketFile.remove()
    }

    /// The server is made: its loops' parts, counted open. A part whose loop shut down while the
    /// server started has already reported its close (the count went below zero for it), so the
    /// count adds, and a server whose every part closed before this is closed at once. Any thread.
    func start(with endpoints: [LoopEndpoint]) {
        let allClosed = withState { state -> Bool in
            state.openEndpoints += endpoints.count
            guard state.openEndpoints == 0 else {
                state.endpoints = endpoints
                return false
            }
            return true
        }
        if allClosed { removeSocketFile() }
    }

    /// Whether accepting may go on with `open` connections.
    func connectionOpened(open: Int) -> Bool {
        guard open >= maxConnections else { return true }
        withState { $0.limitReached = true }
        return false
    }

    func connectionClosed(open: Int) {
        guard open < maxConnections else { return }
        let resume = withState { state -> Bool in
            defer { state.limitReached = false }
            return state.limitReached
        }
        if resume {
            for endpoint in endpoints { endpoint.loop.execute(priority: .input) { endpoint.resumeAccepting() } }
        }
    }

    /// One loop's part closed (before `start(with:)` too, when its loop shut down while the
    /// server started). Any thread.
    func endpointClosed(report: HTTPServer.ShutdownReport? = nil) {
        // The waiters resume once the parts are let go of (`countClosed` has returned).
        for waiter in countClosed(report: report) { waiter.resume() }
    }

    /// One part fewer open; when none is, the parts are let go of (outside the lock) and the
    /// waiters returned.
    private func countClosed(report: HTTPServer.ShutdownReport?) -> [UnsafeContinuation<Void, Never>] {
        let (open, closed, waiters) = withState { state -> (Int, [LoopEndpoint], [UnsafeContinuation<Void, Never>]) in
            state.openEndpoints -= 1
            if let report { state.report.add(report) }
            guard state.openEndpoints == 0 else { return (state.openEndpoints, [], []) }
            defer {
                state.endpoints = []
                state.closedWaiters = []
            }
            return (0, state.endpoints, state.closedWaiters)
        }
        if open == 0 { removeSocketFile() }
        withExtendedLifetime(closed) {}  // released here, outside the lock
        return waiters
    }

    var openEndpoints: Int { withState { $0.openEndpoints } }

    /// Resumes `continuation` once every loop's part has closed (at once if they have). Any
    /// thread.
    func whenClosed(_ continuation: UnsafeContinuation<Void, Never>) {
        let closed = withState { state -> Bool in
            guard state.openEndpoints > 0 else { return true }
            state.closedWaiters.append(continuation)
            return false
        }
        if closed { continuation.resume() }
    }

    /// What the loops' shutdowns counted, summed (complete once every part has closed).
    var shutdownReport: HTTPServer.ShutdownReport { withState { $0.report } }
}
