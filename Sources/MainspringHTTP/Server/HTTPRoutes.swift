import MainspringCore

/// How a route's path matches a request path.
public enum PathMatch: Sendable, Hashable {
    /// The request path equals the route's path.
    case exact
    /// The request path starts with the route's path (`/static/` matches `/static/a.css`). The
    /// longest matching prefix wins; an exact route wins over any prefix.
    case prefix
}

/// What handles a route. Every kind runs on the loop that read the request (the body of an
/// `async` handler in a task that prefers that loop; see `HTTPRoutes`).
enum RouteHandler: Sendable {
    case sync(@Sendable (HTTPRequest) throws -> HTTPResponse)
    case async(@Sendable (HTTPRequest) async throws -> HTTPResponse)
    case deferred(@Sendable (HTTPRequest, HTTPResponder) -> Void)
    case streaming(@Sendable (HTTPRequest, HTTPResponseWriter) throws -> Void)
    case webSocket(WebSocketRoute)
}

/// The routes of an `HTTPServer`: by method and path (exact or prefix), each with a handler.
///
/// ```swift
/// var routes = HTTPRoutes()
/// routes.get("/hello") { _ in .text("hello\n") }                      // on the request's loop
/// routes.post("/echo") { request in HTTPResponse(body: request.body) }
/// routes.get("/user") { request async throws in                       // in a task
///     try .json(await users.find(request.query("id") ?? ""))
/// }
/// routes.get("/static/", match: .prefix) { request in try files.serve(request.path) }
/// ```
///
/// Handlers are `@Sendable`: with an `EventLoopGroup` a route runs on whichever loop read the
/// request. A synchronous handler runs on that loop's thread, between the loop's other
/// callbacks: keep it short, or feed long work through a `Feeder` with a streaming or deferred
/// handler. A `HEAD` request runs the `GET` handler and gets its headers without the body. A
/// path with routes but none for the method gets `405` with `Allow`; no route, `404`. A handler
/// that throws `HTTPError` answers with its status; any other error is `500` with no detail.
public struct HTTPRoutes: Sendable {
    struct Route: Sendable {
        var methods: Set<HTTPMethod>
        var handler: RouteHandler
        /// `methods` as bits (`HTTPMethod.bit`): what a lookup tests.
        var methodBits: UInt16

        init(methods: Set<HTTPMethod>, handler: RouteHandler) {
            self.methods = methods
            self.handler = handler
            methodBits = methods.reduce(0) { $0 | $1.bit }
        }
    }

    private var exact: [String: [Route]] = [:]
    private var prefixes: [(path: String, routes: [Route])] = []
    /// Concurrency limits by route path (exact paths and prefixes apart).
    private var exactLimits: [String: ConcurrencyLimit] = [:]
    private var prefixLimits: [String: ConcurrencyLimit] = [:]

    /// No routes.
    public init() {}

    mutating func add(_ methods: Set<HTTPMethod>, _ path: String, match: PathMatch, _ handler: RouteHandler) {
        let route = Route(methods: methods, handler: handler)
        switch match {
        case .exact:
            exact[path, default: []].append(route)
        case .prefix:
            if let index = prefixes.firstIndex(where: { $0.path == path }) {
                prefixes[index].routes.append(route)
            } else {
                prefixes.append((path, [route]))
                prefixes.sort { $0.path.utf8.count > $1.path.utf8.count }
            }
        }
    }

    // MARK: Concurrency limits

    /// At most `limit` requests for `path` (every method; `match` as the route's) in flight at
    /// once, over all the server's loops: one more is answered `503` with `Retry-After: 1` at
    /// once, before its handler runs (counted in `HTTPServerStatistics.Snapshot.requestsOverLimit`
    /// and on `/metrics` as `mainspring_http_requests_shed_total{reason="route_limit"}`). A
    /// request is in flight from its handler's start until its response is written or its
    /// connection lost — what bounds an `async`, deferred or streaming route's work; a
    /// synchronous handler holds its loop anyway. A limit below 1 is a programming error: it
    /// stops the program with a message naming it.
    public mutating func limitConcurrency(of path: String, match: PathMatch = .exact, to limit: Int) {
        requireUsage(limit > 0, "HTTPRoutes.limitConcurrency(of:match:to:): the limit must be at least 1, not \(limit)")
        switch match {
        case .exact: exactLimits[path] = ConcurrencyLimit(limit)
        case .prefix: prefixLimits[path] = ConcurrencyLimit(limit)
        }
    }

    // MARK: Synchronous handlers

    /// A synchronous handler for `methods` on `path`: it runs on the request's loop thread and
    /// returns the response.
    public mutating func on(_ methods: Set<HTTPMethod>, _ path: String, match: PathMatch = .exact,
                            _ handler: @escaping @Sendable (HTTPRequest) throws -> HTTPResponse)
    {
        add(methods, path, match: match, .sync(handler))
    }

    /// `on([.get], …)`; also answers `HEAD`.
    public mutating func get(_ path: String, match: PathMatch = .exact,
                             _ handler: @escaping @Sendable (HTTPRequest) throws -> HTTPResponse)
    {
        on([.get], path, match: match, handler)
    }

    /// `on([.post], …)`.
    public mutating func post(_ path: String, match: PathMatch = .exact,
                              _ handler: @escaping @Sendable (HTTPRequest) throws -> HTTPResponse)
    {
        on([.post], path, match: match, handler)
    }

    // MARK: Async handlers

    /// An `async` handler: it runs in a task that prefers the request's loop as its executor, so
    /// its code runs on that loop's thread (loop-bound work needs no hop), and its response is
    /// sent there. Like any loop work it should suspend (or `await request.loop.yield()`) rather
    /// than compute for long.
    public mutating func on(_ methods: Set<HTTPMethod>, _ path: String, match: PathMatch = .exact,
                            _ handler: @escaping @Sendable (HTTPRequest) async throws -> HTTPResponse)
    {
        add(methods, path, match: match, .async(handler))
    }

    /// `on([.get], …)` with an `async` handler; also answers `HEAD`.
    public mutating func get(_ path: String, match: PathMatch = .exact,
                             _ handler: @escaping @Sendable (HTTPRequest) async throws -> HTTPResponse)
    {
        on([.get], path, match: match, handler)
    }

    /// `on([.post], …)` with an `async` handler.
    public mutating func post(_ path: String, match: PathMatch = .exact,
                              _ handler: @escaping @Sendable (HTTPRequest) async throws -> HTTPResponse)
    {
        on([.post], path, match: match, handler)
    }

    // MARK: Deferred and streaming handlers

    /// A handler that answers later, through `responder` (from any thread, exactly once): for
    /// answers that wait on a timer, another loop or a `Feeder` job. Runs on the request's loop.
    public mutating func on(_ methods: Set<HTTPMethod>, _ path: String, match: PathMatch = .exact,
                            responding handler: @escaping @Sendable (HTTPRequest, HTTPResponder) -> Void)
    {
        add(methods, path, match: match, .deferred(handler))
    }

    /// A handler that streams its response (chunked), on the request's loop, through `writer`
    /// (see `HTTPResponseWriter` for backpressure).
    public mutating func on(_ methods: Set<HTTPMethod>, _ path: String, match: PathMatch = .exact,
                            streaming handler: @escaping @Sendable (HTTPRequest, HTTPResponseWriter) throws -> Void)
    {
        add(methods, path, match: match, .streaming(handler))
    }

    // MARK: Lookup

    enum Resolution {
        case handler(RouteHandler, ConcurrencyLimit?)
        case methodNotAllowed(allow: String)
        case notFound
    }

    func resolve(_ method: HTTPMethod, _ path: String) -> Resolution {
        let candidates: [Route]
        let limit: ConcurrencyLimit?
        if let routes = exact[path] {
            candidates = routes
            limit = exactLimits.isEmpty ? nil : exactLimits[path]
        } else if let match = prefixes.first(where: { path.hasPrefix($0.path) }) {
            candidates = match.routes
            limit = prefixLimits.isEmpty ? nil : prefixLimits[match.path]
        } else {
            return .notFound
        }
        let wanted = method == .head ? HTTPMethod.get : method
        if method == .head, let route = candidates.first(where: { $0.methodBits & HTTPMethod.head.bit != 0 }) {
            return .handler(route.handler, limit)
        }
        if let route = candidates.first(where: { $0.methodBits & wanted.bit != 0 }) { return .handler(route.handler, limit) }
        var allowed = Set(candidates.flatMap(\.methods))
        if allowed.contains(.get) { allowed.insert(.head) }
        let allow = HTTPMethod.allCases.filter { allowed.contains($0) }.map(\.rawValue).joined(separator: ", ")
        return .methodNotAllowed(allow: allow)
    }
}

extension HTTPMethod {
    /// A bit of its own, for sets of methods tested per request.
    var bit: UInt16 {
        switch self {
        case .get: 1
        case .head: 2
        case .post: 4
        case .put: 8
        case .delete: 16
        case .patch: 32
        case .options: 64
        case .trace: 128
        case .connect: 256
        }
    }
}
