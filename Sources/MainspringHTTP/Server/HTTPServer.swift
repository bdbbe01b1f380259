import Dispatch
import Foundation
@_spi(MainspringHTTP) @_spi(Simulation) import MainspringCore

/// An HTTP/1.1 server on Mainspring loops: HTTP/1.1 read and written in Swift over the
/// library's own `Connection`s — keep-alive, pipelining, chunked bodies both ways,
/// `100 Continue`, and the limits and deadlines described here — and HTTPS with a
/// `MainspringTLS` context (`init(group:configuration:routes:tls:)`).
///
/// The same server, the same code, runs on simulated loops (`MainspringTesting`) over the
/// simulation's network: the routes, handlers, answers, limits, deadlines, statistics, load
/// shedding and closing described here hold there exactly, on virtual time, HTTPS included (real
/// OpenSSL over the simulated bytes). What passes in a simulation is what serves in production.
///
/// ```swift
/// let group = try EventLoopGroup()
/// var routes = HTTPRoutes()
/// routes.get("/hello") { _ in .text("hello\n") }
/// routes.serveMetrics(of: group)            // GET /metrics, Prometheus text format
/// routes.serveHealth(of: group)             // GET /healthz, 503 when a loop is stuck
/// let server = try HTTPServer(group: group, configuration: .init(port: 8080), routes: routes)
/// ```
///
/// ## Threads
/// Every loop of the group accepts for itself, from a listener of its own over one listening
/// socket bound once: a loop stuck in a long callback stops taking connections and the others
/// take them. (On simulated loops one listener of the simulation's network hands each
/// connection to the loop the group picks.) A connection stays on the loop that accepted it: over
/// HTTPS its handshake runs there, a step at a time as `.normal` loop work, as a TLS listener's
/// does; its requests are read there, and their handlers run there, as `.input` work in a turn
/// of their own between the loop's other callbacks — never inside the callback that read the
/// request. The server object itself is `Sendable`.
///
/// ## Bad input
/// A malformed request gets `400` — also one whose framing two parsers could read two ways (request
/// smuggling, RFC 9112 §6.3): two `Content-Length` fields that differ, one that is not all digits,
/// `Transfer-Encoding` beside `Content-Length`, a control character in a field, a bare CR, a folded
/// line — and a `Transfer-Encoding` other than `chunked` `501`, each checked before anything is
/// routed. A request head over `maxHeaderBytes` gets `431` (as soon as it passes the limit), a body
/// over `maxBodyBytes` `413` (a declared one once it has been read and dropped, so that the client
/// reads the answer rather than a reset; a chunked one as soon as its chunks pass the limit), a
/// chunked body that is malformed `400` (its chunks are read strictly, RFC 9112 §7.1: a size of hex
/// digits with nothing before them, each chunk's data followed by CR LF), an `Expect` other than
/// `100-continue` `417`, a version other than HTTP/1.x `400`, an unknown method `501`. Each of
/// these answers is the server's own: dated, `text/plain; charset=utf-8`, its body saying why in a
/// sentence ("the request line's version is not HTTP/1.x"), and it closes the connection (what the
/// client still sends is read and dropped for up to two seconds). An unknown path gets `404`, a
/// known path with another method `405` with `Allow`, a handler that throws `500` (no detail). A
/// request whose head does not arrive within `headerTimeout`, or whose body does not within
/// `bodyTimeout`, has its connection closed; so has a connection idle for `idleTimeout`, and one
/// whose response has not moved for `idleTimeout` while some of it waits (a client that does not
/// read it; a large response read slowly but steadily is not cut). At `maxConnections` the server
/// stops accepting until one closes (further clients wait in the kernel's listen backlog,
/// unanswered; on a simulated loop in the engine, unread). Nothing of this
/// affects the other connections.
///
/// ## Shutdown
/// ``shutdown(gracePeriod:)`` stops accepting, lets the requests in flight finish (their
/// responses say `Connection: close`) and the WebSockets close (1001, "going away"), cuts what
/// is left when the grace period ends, closes the idle connections, and returns once all of it
/// is done, with a report. ``closeAndWait()`` is the same without a bound;
/// ``startClosing()`` begins it and returns at once. Requests in flight are also busy work of
/// their loop: `EventLoopGroup.shutdown(gracePeriod:)` waits for them, and closes the server's
/// connections when its grace period ends.
public final class HTTPServer: Sendable {
    /// The bound port (0 on a Unix socket).
    public let port: UInt16
    /// The loops that serve requests.
    public let loops: [EventLoop]
    /// The server's counters (responses by status class, requests in flight, connections).
    public let statistics: HTTPServerStatistics
    let shared: ServerShared
    /// What accepts the server's connections (its listeners).
    let acceptor: ConnectionAcceptor

    /// Serves `routes` on every loop of `group`, and returns once every loop serves. Any task;
    /// it waits for each loop (a hop to each, side by side) without blocking a thread.
    /// - Throws: `HTTPServerError` when the address is invalid or in use, or libevent fails.
    public convenience init(group: EventLoopGroup, configuration: Configuration = .init(), routes: HTTPRoutes) async
        throws(HTTPServerError)
    {
        try await self.init(loops: group.loops, group: group, configuration: configuration, routes: routes)
    }

    /// Serves `routes` on one loop, and returns once it does. Any task.
    public convenience init(loop: EventLoop, configuration: Configuration = .init(), routes: HTTPRoutes) async
        throws(HTTPServerError)
    {
        try await self.init(loops: [loop], configuration: configuration, routes: routes)
    }

    /// Serves `routes` on every loop of `group` — the blocking form, for a plain thread (top-level
    /// code, a `main` that is not async): it blocks the calling thread until every loop has set
    /// up its share (a round trip to each; on one of the loops its own share is set up in
    /// place). From async code use the `async` initialiser, which blocks nothing.
    /// - Throws: `HTTPServerError` when the address is invalid or in use, libevent fails, or a
    ///   loop does not answer within 10 s (`.loopNotRunning`).
    public convenience init(group: EventLoopGroup, configuration: Configuration = .init(), routes: HTTPRoutes)
        throws(HTTPServerError)
    {
        try self.init(loops: group.loops, group: group, configuration: configuration, routes: routes)
    }

    /// Serves `routes` on one loop — the blocking form: call it on `loop`'s thread (no wait), or
    /// from a plain thread while the loop runs (a round trip).
    public convenience init(loop: EventLoop, configuration: Configuration = .init(), routes: HTTPRoutes)
        throws(HTTPServerError)
    {
        try self.init(loops: [loop], configuration: configuration, routes: routes)
    }

    /// What both forms of creation check and make before the loops set up their shares.
    private struct Plan: Sendable {
        let limits: ServerLimits
        let socket: ConnectionAcceptor
        let statistics: HTTPServerStatistics
        let shared: ServerShared
        let shedding: HTTPServer.LoadShedding?
    }

    /// Checks `configuration` and makes the listening socket — on a simulated loop, the
    /// simulation's listener (over `group` when given) for the connection engine.
    private static func plan(_ configuration: Configuration, loops: [EventLoop], group: EventLoopGroup?,
                             security: ServerSecurityLayer?) throws(HTTPServerError) -> Plan
    {
        let floor = Duration.milliseconds(1)
        _ = requirePositive(configuration.idleTimeout, "HTTPServer.Configuration.idleTimeout")
        _ = requirePositive(configuration.headerTimeout, "HTTPServer.Configuration.headerTimeout")
        _ = requirePositive(configuration.bodyTimeout, "HTTPServer.Configuration.bodyTimeout")
        if let shedding = configuration.loadShedding {
            _ = requirePositive(shedding.queueWaitTarget, "HTTPServer.LoadShedding.queueWaitTarget")
            _ = requirePositive(shedding.window, "HTTPServer.LoadShedding.window")
            if let deadline = shedding.requestDeadline {
                _ = requirePositive(deadline, "HTTPServer.LoadShedding.requestDeadline")
            }
        }
        let limits = ServerLimits(
            maxHeaderBytes: max(256, configuration.maxHeaderBytes), maxBodyBytes: max(0, configuration.maxBodyBytes),
            idleTimeout: max(floor, configuration.idleTimeout), headerTimeout: max(floor, configuration.headerTimeout),
            bodyTimeout: max(floor, configuration.bodyTimeout), shedsBeforeBody: configuration.loadShedding != nil,
            http2: configuration.http2.map { options in
                var options = options
                options.maxConcurrentStreams = max(1, options.maxConcurrentStreams)
                options.maxResetsPerSecond = max(1, options.maxResetsPerSecond)
                options.maxControlFramesPerSecond = max(1, options.maxControlFramesPerSecond)
                return options
            })
        let socket: ConnectionAcceptor
        var socketFile: UnixSocketFile?
        if !loops.isEmpty, !loops.allSatisfy(\.sharesListeningSockets) {
            let endpoint: Listener.Endpoint = if let path = configuration.unixPath {
                .unix(path: path, mode: configuration.unixMode, backlog: configuration.backlog)
            } else {
                .tcp(host: configuration.host, port: configuration.port, backlog: configuration.backlog)
            }
            socket = try ConnectionAcceptor(listeningOn: endpoint, loops: loops, group: group,
                                            preparer: security?.acceptPreparer)
        } else {
            let listening: SharedListeningSocket
            do throws(EventLoopError) {
                listening = if let path = configuration.unixPath {
                    try SharedListeningSocket(unixPath: path, mode: configuration.unixMode, backlog: configuration.backlog)
                } else {
                    try SharedListeningSocket(host: configuration.host, port: configuration.port,
                                              backlog: configuration.backlog)
                }
            } catch {
                throw HTTPServerError(listening: error)
            }
            socketFile = listening.unixFile
            socket = ConnectionAcceptor(socket: listening, loops: loops.count, preparer: security?.acceptPreparer)
        }
        return Plan(limits: limits, socket: socket, statistics: HTTPServerStatistics(),
                    shared: ServerShared(maxConnections: max(1, configuration.maxConnections),
                                         socketFile: socketFile),
                    shedding: configuration.loadShedding)
    }

    /// The server on `loops` (those of `group`, when given), with `security` under every
    /// connection (HTTPS: `HTTPServer+TLS.swift`).
    convenience init(loops: [EventLoop], group: EventLoopGroup? = nil, configuration: Configuration, routes: HTTPRoutes,
                     security: ServerSecurityLayer? = nil) async throws(HTTPServerError)
    {
        if loops.allSatisfy(\.acceptsDirectCalls) {
            // The caller may act on every loop (simulated loops, from a task outside
            // `Simulation.run` too): made in place, where posting would wait for a step that only
            // this caller could take.
            try self.init(loops: loops, group: group, configuration: configuration, routes: routes, security: security,
                          inPlace: ())
            return
        }
        let plan = try Self.plan(configuration, loops: loops, group: group, security: security)
        let made: [Result<LoopEndpoint, HTTPServerError>] = await withTaskGroup(of: (Int, Result<LoopEndpoint, HTTPServerError>).self) { tasks in
            for (index, loop) in loops.enumerated() {
                tasks.addTask {
                    let result: Result<LoopEndpoint, HTTPServerError> = await withUnsafeContinuation { continuation in
                        loop.execute(priority: .input) {
                            continuation.resume(returning: Result { () throws(HTTPServerError) in
                                try LoopEndpoint(loop: loop, routes: routes, statistics: plan.statistics, shared: plan.shared,
                                                 limits: plan.limits, acceptor: plan.socket, shedding: plan.shedding)
                            })
                        } orElse: {
                            continuation.resume(returning: .failure(.closed))  // the loop is gone
                        }
                    }
                    return (index, result)
                }
            }
            var results = [Result<LoopEndpoint, HTTPServerError>](repeating: .failure(.closed), count: loops.count)
            for await (index, result) in tasks { results[index] = result }
            return results
        }
        var endpoints: [LoopEndpoint] = []
        var failure: HTTPServerError?
        for result in made {
            switch result {
            case .success(let endpoint): endpoints.append(endpoint)
            case .failure(let error): failure = failure ?? error
            }
        }
        if let failure {
            for endpoint in endpoints { endpoint.loop.execute(priority: .input) { endpoint.close() } }
            plan.socket.abandon()
            plan.shared.removeSocketFile()
            throw failure
        }
        self.init(loops: loops, plan: plan, endpoints: endpoints)
    }

    /// The blocking form of `init(loops:group:configuration:routes:security:)`.
    convenience init(loops: [EventLoop], group: EventLoopGroup? = nil, configuration: Configuration, routes: HTTPRoutes,
                     security: ServerSecurityLayer? = nil) throws(HTTPServerError)
    {
        try self.init(loops: loops, group: group, configuration: configuration, routes: routes, security: security,
                      inPlace: ())
    }

    /// Makes each loop's share in place on a loop the caller may act on, else posted and
    /// waited for (`onLoop`).
    private convenience init(loops: [EventLoop], group: EventLoopGroup?, configuration: Configuration, routes: HTTPRoutes,
                             security: ServerSecurityLayer?, inPlace: Void) throws(HTTPServerError)
    {
        let plan = try Self.plan(configuration, loops: loops, group: group, security: security)
        var endpoints: [LoopEndpoint] = []
        for loop in loops {
            let make = { () throws(HTTPServerError) -> LoopEndpoint in
                try LoopEndpoint(loop: loop, routes: routes, statistics: plan.statistics, shared: plan.shared,
                                 limits: plan.limits, acceptor: plan.socket, shedding: plan.shedding)
            }
            do {
                endpoints.append(try onLoop(loop, index: endpoints.count, make))
            } catch {
                for endpoint in endpoints { endpoint.loop.execute(priority: .input) { endpoint.close() } }
                plan.socket.abandon()
                plan.shared.removeSocketFile()
                throw error
            }
        }
        self.init(loops: loops, plan: plan, endpoints: endpoints)
    }

    private init(loops: [EventLoop], plan: Plan, endpoints: [LoopEndpoint]) {
        plan.shared.start(with: endpoints)
        self.port = plan.socket.port
        self.acceptor = plan.socket
        self.loops = loops
        self.statistics = plan.statistics
        self.shared = plan.shared
    }

    /// What ``shutdown(gracePeriod:)`` found, summed over the server's loops.
    public struct ShutdownReport: Sendable, Equatable, CustomStringConvertible {
        /// Requests that finished once the shutdown began: answered in full (a streamed
        /// response ended), or upgraded to a WebSocket. A request that arrived on an open
        /// connection after the shutdown began is among them, answered `503`.
        public var finished = 0
        /// Requests cut when the grace period ended (their connections closed unanswered, or a
        /// streamed response cut short), or whose client left first.
        public var aborted = 0
        /// WebSockets that closed after their `1001` ("going away"), the peer's answer or the
        /// connection's end within the grace period.
        public var webSocketsClosed = 0
        /// WebSockets still closing when the grace period ended, whose connections were cut.
        public var webSocketsAborted = 0

        public init() {}

        mutating func add(_ other: ShutdownReport) {
            finished += other.finished
            aborted += other.aborted
            webSocketsClosed += other.webSocketsClosed
            webSocketsAborted += other.webSocketsAborted
        }

        public var description: String {
            "\(finished) finished, \(aborted) aborted; WebSockets \(webSocketsClosed) closed, \(webSocketsAborted) aborted"
        }
    }

    /// Stops the server without dropping a request: stops accepting (a new connection is
    /// refused once every loop has let go of the listening socket; a request that arrives on an
    /// open connection gets `503` and `Connection: close`), lets the requests in flight and the
    /// streamed responses finish (their responses say `Connection: close`) and the WebSockets
    /// close (a close frame with `1001`, "going away", then the peer's answer or the WebSocket's
    /// `closeTimeout`) — then closes the idle connections and returns. What has not finished
    /// when `gracePeriod` ends is cut: the WebSockets' connections, then the connections of the
    /// requests still in flight. Returns once every loop's part has closed, with what it found.
    ///
    /// The grace period runs on each loop's clock (virtual time on a simulated loop); negative
    /// counts as zero: what is in flight is cut at once. On a Unix socket (`unixPath`) the
    /// socket file is removed at once. Any task; idempotent (a second call waits for the same
    /// close, and its grace period applies to loops that had none yet). A loop busy in a long
    /// callback makes it wait until that callback returns.
    @discardableResult
    public func shutdown(gracePeriod: Duration) async -> ShutdownReport {
        await close(grace: max(.zero, gracePeriod))
        return shared.shutdownReport
    }

    /// Closes the server and waits until it is closed: ``shutdown(gracePeriod:)`` without a
    /// grace period — the requests in flight are waited for however long they take, and the
    /// WebSockets for their `closeTimeout`. Returns once every loop's part has closed
    /// (``isClosed``): no request is accepted after it returns. Any task.
    public func closeAndWait() async {
        await close(grace: nil)
    }

    /// Begins the shutdown on every loop and waits for every loop's part to close.
    private func close(grace: Duration?) async {
        beginShutdown(grace: grace)
        await withUnsafeContinuation { (continuation: UnsafeContinuation<Void, Never>) in
            shared.whenClosed(continuation)
        }
    }

    /// Begins the shutdown on every loop. (A function of its own: it holds none of the loops'
    /// parts while the caller waits, so a closed part is let go of as soon as it has closed.)
    private func beginShutdown(grace: Duration?) {
        shared.removeSocketFile()
        onEveryLoop { $0.beginShutdown(grace: grace) }
    }

    /// Runs `body` with each loop's part on its loop: at once on the calling loop's own,
    /// posted to the others (weakly: a closed part is let go of as soon as it has closed, not
    /// when the posted closure is).
    private func onEveryLoop(_ body: @escaping @Sendable (LoopEndpoint) -> Void) {
        for endpoint in shared.endpoints {
            if endpoint.loop.isCurrent {
                body(endpoint)
            } else {
                endpoint.loop.execute(priority: .input) { [weak endpoint] in if let endpoint { body(endpoint) } }
            }
        }
    }

    /// Stops accepting connections, without waiting: each loop stops when it next runs.
    /// Requests in flight finish, then the server's connections close (``closeAndWait()`` and
    /// ``shutdown(gracePeriod:)`` wait for that).
    /// On a Unix socket (`unixPath`) the socket file is removed at once. Any thread; returns at
    /// once (see `isClosed`).
    public func close() {
        shared.removeSocketFile()
        onEveryLoop { $0.close() }
    }

    /// ``close()-i51n`` under a name of its own: stops accepting and returns at once. In `async`
    /// code, `close()` resolves to the deprecated waiting form until it goes (0.3); this
    /// spelling is the one that never waits, from anywhere.
    public func startClosing() {
        close()
    }

    /// The old name of ``closeAndWait()``. In `async` code it is the one the compiler picks for
    /// `close()`, so a task that must not wait cannot reach ``close()`` by this spelling.
    @available(*, deprecated, renamed: "closeAndWait()")
    public func close() async {
        await closeAndWait()
    }

    /// Whether every loop has finished closing (its requests done, its connections closed).
    public var isClosed: Bool { shared.openEndpoints == 0 }
}

/// Runs `body` on `loop`'s thread and returns its result: in place on that thread (or on the
/// thread driving a simulated loop's simulation), else posted and waited for (up to 10 s: a loop
/// that does not run cannot host a server).
private func onLoop<T>(_ loop: EventLoop, index: Int, _ body: @escaping () throws(HTTPServerError) -> T) throws(HTTPServerError) -> T {
    if loop.acceptsDirectCalls { return try body() }
    let box = OnLoopBox(body)
    let done = DispatchSemaphore(value: 0)
    loop.execute(priority: .input) {
        box.run()
        done.signal()
    }
    guard done.wait(timeout: .now() + 10) == .success, let result = box.result else {
        throw .loopNotRunning(index: index, waited: .seconds(10))
    }
    return try result.get()
}

/// A loop-bound closure and its result, carried across the hop in `onLoop`.
private final class OnLoopBox<T>: @unchecked Sendable {
    var result: Result<T, HTTPServerError>?
    private let body: () throws(HTTPServerError) -> T
    init(_ body: @escaping () throws(HTTPServerError) -> T) { self.body = body }
    func run() {
        do throws(HTTPServerError) { result = .success(try body()) } catch { result = .failure(error) }
    }
}
