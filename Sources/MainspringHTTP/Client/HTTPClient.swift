import Foundation
import MainspringCore
import Synchronization

/// An HTTP/1.1 client on a loop: `GET`, `POST`, `PUT`, `DELETE`, `HEAD` (any ``HTTPMethod``)
/// with header fields and a body; the response whole (with a size limit) or streamed; a
/// keep-alive pool per host and port; connect and response timeouts; chunked bodies;
/// redirects when asked, up to a limit.
///
/// ```swift
/// let client = HTTPClient(loop: loop)
/// let response = try await client.get("http://127.0.0.1:8080/healthz")
/// print(response.status, response.text)
/// ```
///
/// The client is built on `Connection` (not on evhttp's client side): its connections are the
/// loop's connections — read at `.input` priority with the same backpressure and fairness as
/// any other input, TLS through the same handshake as every Mainspring TLS connection (a
/// ``Connector``), limits checked as the bytes arrive (a 100 MB header block is refused at the
/// limit, not buffered), and failures named (``HTTPClientError``).
///
/// ## Connections
/// Each `host:port` (and scheme) has a pool of at most
/// ``Configuration/maxConnectionsPerHost`` connections; a request waits for a free one when
/// all are busy. A connection goes back to the pool once its response has been read to the end,
/// when both sides keep it alive (HTTP/1.1 without `Connection: close`) and nothing follows the
/// response (a body longer than its `Content-Length` closes it); idle ones are dropped after
/// ``Configuration/idleTimeout`` or when the server closed them. A request that fails on a
/// reused connection before any byte of its response came (the server closed it meanwhile) is
/// sent once more on a new connection when its method is idempotent.
///
/// ## Host names and HTTPS
/// A URL's host goes through ``Configuration/resolver``, then the connection is made by
/// ``Configuration/connector`` (`http`) or ``Configuration/secureConnector`` (`https`, nil by
/// default: MainspringTLS provides `.tls(_:)`). The default resolver, ``Resolver/system``,
/// hands names to the connector as they are: the core library resolves them off the loop
/// (`getaddrinfo`: /etc/hosts, then DNS) and tries their IPv4 and IPv6 addresses with Happy
/// Eyeballs (RFC 8305). A name that does not resolve is ``HTTPClientError/unresolvedHost(_:)``.
/// ``Resolver/literalsAndLocalhost`` refuses every name but `localhost` without a lookup.
///
/// ## Threads and cost
/// `Sendable`; every method is `async` and can be called from any task. The I/O runs on
/// `loop`; the caller's task suspends meanwhile. A request on a pooled connection costs one
/// write and the reads its response needs; a new connection costs a connect (and a TLS
/// handshake). The pool's bookkeeping is under a lock taken briefly per request.
public final class HTTPClient: Sendable {
    /// Limits, timeouts, the pool, redirects, and how connections are made.
    public struct Configuration: Sendable {
        /// The most connections open at once to one scheme, host and port (busy and idle).
        public var maxConnectionsPerHost: Int
        /// How long the whole request may take: the wait for a pooled connection, resolving,
        /// connecting, TLS, sending, the whole response (read whole or streamed), redirects and
        /// retries; past it the request fails with
        /// ``HTTPClientError/requestTimeout(_:phase:)`` naming where it was. A request's own
        /// ``HTTPClientRequest/timeout`` or ``HTTPClientRequest/deadline`` wins over it. Timed
        /// on the loop's clock (virtual time on a simulated loop). Default 30 s; nil: no limit
        /// beyond the phases' own (for streams that run for long: or give those requests a
        /// timeout of their own).
        public var requestTimeout: Duration?
        /// How long a connect (resolving a host name, and the TLS handshake, included) may
        /// take (a wait) — never past the request's deadline, which cuts it short.
        public var connectTimeout: Duration
        /// How long the response's head may take once the request is sent (all of it, interim
        /// `1xx` responses included), and each later read of its body (a wait). Timed on the
        /// loop's clock, by one loop timer per request.
        public var responseTimeout: Duration
        /// How long an idle connection stays in the pool.
        public var idleTimeout: Duration
        /// The most bytes of status line and header fields.
        public var maxHeaderBytes: Int
        /// The most bytes of a whole body (``HTTPClient/execute(_:)``); more is
        /// ``HTTPClientError/bodyTooLarge(limit:)``.
        public var maxBodyBytes: Int
        /// How many redirects (301, 302, 303, 307, 308 with a `Location`) a request follows
        /// unless it says otherwise; 0 (the default): none, the 3xx response is returned.
        public var redirectLimit: Int
        /// Sent with every request that has no `User-Agent` of its own; nil: none.
        public var userAgent: String?
        /// Turns a URL's host into what the connector connects to; ``Resolver/system`` (names
        /// resolved by the connect, with Happy Eyeballs) by default.
        public var resolver: Resolver
        /// Makes the connections of `http` URLs.
        public var connector: Connector
        /// Makes the connections of `https` URLs; nil: `https` is
        /// ``HTTPClientError/unsupportedScheme(_:)``.
        public var secureConnector: Connector?
        /// The options of the client's connections (line length, output limit).
        public var connectionOptions: Connection.Options
        /// How many interim responses (`100 Continue`, `102`, `103 Early Hints`) may come before
        /// the final one; more is ``HTTPClientError/tooManyInterimResponses(limit:)``. They count
        /// against ``responseTimeout`` and ``maxHeaderBytes`` too.
        public var maxInterimResponses: Int
        /// When failed requests are tried again (see ``RetryPolicy``); nil (the default): never,
        /// unless a request brings its own ``HTTPClientRequest/retryPolicy``.
        public var retryPolicy: RetryPolicy?
        /// How many retries the client makes in all (see ``RetryBudget``).
        public var retryBudget: RetryBudget

        /// The defaults: 8 connections a host, 30 s a request, 10 s connect, 30 s response, 60 s
        /// idle, 64 KiB of head, 16 MiB of body, no redirects, host names through the system's
        /// resolver, at most 10 interim responses.
        public init(maxConnectionsPerHost: Int = 8, requestTimeout: Duration? = .seconds(30),
                    connectTimeout: Duration = .seconds(10),
                    responseTimeout: Duration = .seconds(30), idleTimeout: Duration = .seconds(60),
                    maxHeaderBytes: Int = 65_536, maxBodyBytes: Int = 16 << 20, redirectLimit: Int = 0,
                    userAgent: String? = "Mainspring", resolver: Resolver = .system,
                    connector: Connector = .tcp, secureConnector: Connector? = nil,
                    connectionOptions: Connection.Options = .init(), maxInterimResponses: Int = 10,
                    retryPolicy: RetryPolicy? = nil, retryBudget: RetryBudget = .init())
        {
            self.retryPolicy = retryPolicy
            self.retryBudget = retryBudget
            self.maxConnectionsPerHost = maxConnectionsPerHost
            self.requestTimeout = requestTimeout
            self.connectTimeout = connectTimeout
            self.responseTimeout = responseTimeout
            self.idleTimeout = idleTimeout
            self.maxHeaderBytes = maxHeaderBytes
            self.maxBodyBytes = maxBodyBytes
            self.redirectLimit = redirectLimit
            self.userAgent = userAgent
            self.resolver = resolver
            self.connector = connector
            self.secureConnector = secureConnector
            self.connectionOptions = connectionOptions
            self.maxInterimResponses = maxInterimResponses
        }
    }

    /// Turns a URL's host into what the connector connects to: the one place where host-name
    /// resolution plugs in (a fixed table, a service registry, a policy that refuses names).
    public struct Resolver: Sendable {
        /// Returns what to connect to for `host` — an IP literal, or a name that the connector
        /// resolves (``Connector/tcp`` and MainspringTLS's `.tls(_:)` take both) — or throws
        /// ``HTTPClientError/unresolvedHost(_:)``.
        public let resolve: @Sendable (_ host: String) async throws(HTTPClientError) -> String

        /// A resolver from a function.
        public init(_ resolve: @escaping @Sendable (_ host: String) async throws(HTTPClientError) -> String) {
            self.resolve = resolve
        }

        /// The default: every host as it is. The connector resolves names with the system's
        /// resolver (`getaddrinfo` on a resolver thread, never on the loop, within
        /// `Connection.Options.resolveTimeout`) and tries each of their addresses with Happy
        /// Eyeballs; a name that does not resolve, or not in time, is
        /// ``HTTPClientError/unresolvedHost(_:)``. The lookup counts against the connect
        /// timeout. One lookup per new connection: a pooled connection is reused without one.
        public static let system = Resolver { host throws(HTTPClientError) in host }

        /// IPv4 and IPv6 literals as themselves, and `localhost`; any other name is
        /// ``HTTPClientError/unresolvedHost(_:)`` at once, without a lookup (for a client that
        /// must not reach anything by name).
        public static let literalsAndLocalhost = Resolver { host throws(HTTPClientError) in
            if host.lowercased() == "localhost" || isIPLiteral(host) { return host }
            throw .unresolvedHost(host)
        }
    }

    /// Makes a connection to an address and port on a loop: plain TCP (``tcp``), or TLS
    /// (MainspringTLS's `.tls(_:)`).
    public struct Connector: Sendable {
        /// Connects to `address:port` on `loop`, returning once the connection is established
        /// (and, for TLS, its handshake done, checked against `hostName`). It throws an
        /// `EventLoopError` when no connection was made — the client reports it as
        /// ``HTTPClientError/connectFailed(host:port:_:)`` (or `unresolvedHost`) — and any other
        /// error when the connection was made but not secured (TLS's `TLSError`), reported as
        /// ``HTTPClientError/securityFailed(host:port:reason:)``. (A connector of your own over
        /// `Connection.connect(…tls:)` unwraps `TLSError.connect(_:)` into its `EventLoopError`
        /// and `TLSError.cancelled` into `EventLoopError.cancelled`, as MainspringTLS's
        /// `TLSClientContext` does, so that a refused connect is still `connectFailed`.)
        public let connect: @Sendable (_ address: String, _ port: UInt16, _ hostName: String, _ loop: EventLoop,
                                       _ options: Connection.Options) async throws -> Connection

        /// A connector from a function (one that throws `EventLoopError` only, as connectors
        /// written for the earlier typed form do, still fits).
        public init(_ connect: @escaping @Sendable (_ address: String, _ port: UInt16, _ hostName: String,
                                                    _ loop: EventLoop, _ options: Connection.Options)
                        async throws -> Connection)
        {
            self.connect = connect
        }

        /// Plain TCP: `Connection.connect(to:port:on:options:)` (async).
        public static let tcp = Connector { (address: String, port: UInt16, _: String, loop: EventLoop,
                                             options: Connection.Options) async throws(EventLoopError) -> Connection in
            let connection: Connection = try await Connection.connect(to: address, port: port, on: loop, options: options)
            return connection
        }
    }

    /// The loop the client's connections live on.
    public let loop: EventLoop
    /// The configuration it was made with.
    public let configuration: Configuration
    let pool: ConnectionPool
    /// The retries made so far against ``Configuration/retryBudget``.
    let retryBudget: RetryBudgetState
    /// The connections lent to requests now, and whether the client was shut down (set once;
    /// a lease made after it is closed at once).
    private let leased = ClientLock<(connections: [ObjectIdentifier: Connection], isShutDown: Bool)>(([:], false))
    /// The last URL a request named, and its parse.
    private let lastTarget = ClientLock<(url: String, target: HTTPTarget)?>(nil)

    /// A client whose connections live on `loop`. Makes no connection yet. Any thread.
    public init(loop: EventLoop, configuration: Configuration = .init()) {
        precondition(configuration.maxConnectionsPerHost >= 1, "HTTPClient: maxConnectionsPerHost must be at least 1")
        self.loop = loop
        self.configuration = configuration
        pool = ConnectionPool(limit: configuration.maxConnectionsPerHost, idleTimeout: configuration.idleTimeout,
                              clock: loop.clock)
        retryBudget = RetryBudgetState(configuration.retryBudget)
    }

    /// Shuts the client down at once: closes its connections, idle and busy, and fails every
    /// request — in flight, waiting for a connection, or made afterwards — with
    /// ``HTTPClientError/clientClosed``. Any thread; returns without waiting.
    ///
    /// (Before 0.2 requests in flight ran on to their response, up to the response timeout, so a
    /// group's graceful shutdown could spend its whole grace period on one. To let them finish,
    /// use ``shutdown(gracePeriod:)``.)
    public func shutdown() {
        for connection in pool.shutdown() { connection.close() }
        let busy = leased.withLock { state -> [Connection] in
            state.isShutDown = true
            defer { state.connections = [:] }
            return Array(state.connections.values)
        }
        for connection in busy { connection.close() }
    }

    /// Shuts the client down gracefully: new requests (and those waiting for a connection) fail
    /// with ``HTTPClientError/clientClosed`` at once, requests in flight may finish within
    /// `gracePeriod`, then the rest fail as with ``shutdown()``. Any task; returns when no
    /// request is in flight any more. Waits on the client's loop's clock.
    public func shutdown(gracePeriod: Duration) async {
        for connection in pool.shutdown() { connection.close() }
        let deadline = loop.clock.now.advanced(by: gracePeriod)
        while leased.withLock({ !$0.connections.isEmpty }) && loop.clock.now < deadline {
            // Polled every few milliseconds: a shutdown is rare, and a lease's end has no waiter.
            // The sleep fails only when the calling task is cancelled or the loop is gone:
            // either way, stop waiting and fail what is left now.
            guard (try? await loop.sleep(for: .milliseconds(5))) != nil else { break }
        }
        shutdown()
    }

    /// Whether ``shutdown()`` was called. Any thread.
    var isShutDown: Bool { leased.withLock { $0.isShutDown } }

    /// Notes a connection lent to a request; false (and closes it) if the client is shut down.
    private func lend(_ lease: Lease) -> Bool {
        let accepted = leased.withLock { state -> Bool in
            guard !state.isShutDown else { return false }
            state.connections[ObjectIdentifier(lease.connection)] = lease.connection
            return true
        }
        if !accepted { lease.connection.close() }
        return accepted
    }

    /// How many connections the pool holds for `url`'s scheme, host and port: busy ones and
    /// idle ones. Any thread. (Diagnostics and tests.)
    public func connectionCount(for url: String) -> (busy: Int, idle: Int) {
        // A URL that does not parse names no pool entry: nothing is held for it.
        guard let target = try? HTTPTarget(parsing: url) else { return (0, 0) }
        return pool.counts(for: PoolKey(target))
    }

    /// How many requests wait for a connection to `url`'s scheme, host and port. (Tests.)
    func waiterCount(for url: String) -> Int {
        // A URL that does not parse names no pool entry: nobody waits for it.
        guard let target = try? HTTPTarget(parsing: url) else { return 0 }
        return pool.waiterCount(for: PoolKey(target))
    }

    // MARK: Requests

    /// Sends `request` and reads its response whole (the body up to
    /// ``Configuration/maxBodyBytes``), following redirects as the request or configuration
    /// says. Any task; cancelling it closes the connection in use and throws.
    public func execute(_ request: HTTPClientRequest) async throws(HTTPClientError) -> HTTPClientResponse {
        let (head, reader) = try await send(request)
        var body: [UInt8] = []
        while let chunk = try await reader.next() {
            if body.count + chunk.count > configuration.maxBodyBytes {
                reader.abandon()
                throw .bodyTooLarge(limit: configuration.maxBodyBytes)
            }
            body += chunk
        }
        var headers = head.headers
        for (name, value) in reader.trailers { headers.add(name, value) }
        return HTTPClientResponse(status: head.status, reason: head.reason, headers: headers, body: body,
                                  url: head.url)
    }

    /// Sends `request` and returns once the response's head has arrived; its body is read as
    /// the caller iterates ``HTTPClientStreamingResponse/body`` (no size limit). The connection
    /// goes back to the pool when the body has been read to its end; dropping the response
    /// before that closes it. Any task.
    public func stream(_ request: HTTPClientRequest) async throws(HTTPClientError) -> HTTPClientStreamingResponse {
        let (head, reader) = try await send(request)
        return HTTPClientStreamingResponse(status: head.status, reason: head.reason, headers: head.headers,
                                           url: head.url, reader: reader)
    }

    /// `GET url`.
    public func get(_ url: String, headers: HTTPHeaders = [:]) async throws(HTTPClientError) -> HTTPClientResponse {
        try await execute(HTTPClientRequest(method: .get, url: url, headers: headers))
    }

    /// `HEAD url`: the status and header fields (no body).
    public func head(_ url: String, headers: HTTPHeaders = [:]) async throws(HTTPClientError) -> HTTPClientResponse {
        try await execute(HTTPClientRequest(method: .head, url: url, headers: headers))
    }

    /// `POST url` with `body`.
    public func post(_ url: String, headers: HTTPHeaders = [:], body: [UInt8]) async throws(HTTPClientError)
        -> HTTPClientResponse
    {
        try await execute(HTTPClientRequest(method: .post, url: url, headers: headers, body: body))
    }

    /// `PUT url` with `body`.
    public func put(_ url: String, headers: HTTPHeaders = [:], body: [UInt8]) async throws(HTTPClientError)
        -> HTTPClientResponse
    {
        try await execute(HTTPClientRequest(method: .put, url: url, headers: headers, body: body))
    }

    /// `DELETE url`.
    public func delete(_ url: String, headers: HTTPHeaders = [:]) async throws(HTTPClientError) -> HTTPClientResponse {
        try await execute(HTTPClientRequest(method: .delete, url: url, headers: headers))
    }

    // MARK: The exchange

    /// Sends `request` (following redirects, and trying again as its retry policy says) and
    /// reads the final response's head.
    private func send(_ request: HTTPClientRequest) async throws(HTTPClientError) -> (ResponseHead, ResponseReader) {
        let deadline = RequestDeadline(timeout: request.timeout ?? configuration.requestTimeout, deadline: request.deadline,
                                       now: loop.clock.now)
        let policy = request.retryPolicy ?? configuration.retryPolicy ?? .none
        guard policy.maxRetries > 0 else { return try await sendFollowingRedirects(request, deadline: deadline) }
        retryBudget.deposit(now: loop.clock.now.nanoseconds)
        let idempotent = request.method.isIdempotent || policy.retriesNonIdempotentRequests
        var retries = 0
        while true {
            let failure: HTTPClientError
            do {
                let (head, reader) = try await sendFollowingRedirects(request, deadline: deadline)
                guard retries < policy.maxRetries, idempotent, policy.retryableStatuses.contains(head.status) else {
                    return (head, reader)
                }
                let asked = head.status == 503 || head.status == 429
                    ? retryAfter(head.headers["retry-after"], nowMilliseconds: loop.calendarMilliseconds()) : nil
                guard let wait = await retryWait(policy, retries: retries, atLeast: asked, deadline: deadline) else {
                    return (head, reader)
                }
                // The answer is dropped: its body read off (up to the limit) so that the
                // connection can serve the retry, or closed.
                do {
                    try await reader.discard(upTo: configuration.maxBodyBytes)
                } catch {
                    reader.abandon()
                }
                try await pause(wait)
            } catch let error {
                failure = error
                guard retries < policy.maxRetries, Self.mayRetry(failure, idempotent: idempotent),
                      let wait = await retryWait(policy, retries: retries, atLeast: nil, deadline: deadline)
                else { throw failure }
                try await pause(wait)
            }
            retries += 1
        }
    }

    /// Whether an attempt that failed with `error` may be made again: one that never left, any
    /// request; one that may have reached the server, an idempotent one.
    private static func mayRetry(_ error: HTTPClientError, idempotent: Bool) -> Bool {
        switch error {
        case .connectFailed, .connectTimeout, .unresolvedHost, .sendFailed: return true
        case .closedMidResponse, .responseTimeout: return idempotent
        default: return false
        }
    }

    /// The wait before the next retry (at least `atLeast`: a `Retry-After`), or nil when there
    /// is none to make: it would end past the request's deadline, or the budget is spent.
    private func retryWait(_ policy: RetryPolicy, retries: Int, atLeast: Duration?, deadline: RequestDeadline) async
        -> Duration?
    {
        let loop = self.loop
        let random = loop.isCurrent ? loop.randomUnit() : ((try? await loop.submit { loop.randomUnit() }) ?? 0)
        var wait = policy.backoff(beforeRetry: retries + 1, random: random)
        if let atLeast { wait = max(wait, atLeast) }
        if let remaining = deadline.remaining(at: loop.clock.now), wait >= remaining { return nil }
        guard retryBudget.withdraw(now: loop.clock.now.nanoseconds) else { return nil }
        return wait
    }

    /// Waits `duration` on the loop's clock before a retry.
    private func pause(_ duration: Duration) async throws(HTTPClientError) {
        do {
            try await loop.sleep(for: duration)
        } catch {
            throw Task.isCancelled ? .cancelled : .clientClosed
        }
        if isShutDown { throw .clientClosed }
    }

    /// Sends `request` (following redirects) and reads the final response's head: one attempt.
    private func sendFollowingRedirects(_ request: HTTPClientRequest, deadline: RequestDeadline) async throws(HTTPClientError)
        -> (ResponseHead, ResponseReader)
    {
        var target = try target(of: request.url)
        var method = request.method
        var body = request.body
        var headers = request.headers
        let limit = request.redirectLimit ?? configuration.redirectLimit
        var redirects = 0
        while true {
            let (head, reader) = try await exchange(method: method, target: target, headers: headers, body: body,
                                                    deadline: deadline)
            guard [301, 302, 303, 307, 308].contains(head.status), limit > 0,
                  let location = head.headers["location"]
            else { return (head, reader) }
            guard redirects < limit else {
                reader.abandon()
                throw .tooManyRedirects(limit: limit)
            }
            redirects += 1
            try await reader.discard(upTo: configuration.maxBodyBytes)
            target = try target.resolving(location)
            if head.status == 303 || ((head.status == 301 || head.status == 302) && method == .post) {
                if method != .head { method = .get }
                body = []
                headers.remove("content-length")
                headers.remove("content-type")
            }
        }
    }

    /// One request and its response's head on one connection (a second try on a new one when a
    /// reused connection turns out closed).
    private func exchange(method: HTTPMethod, target: HTTPTarget, headers: HTTPHeaders, body: [UInt8],
                          deadline: RequestDeadline) async throws(HTTPClientError) -> (ResponseHead, ResponseReader)
    {
        let bytes = requestBytes(method: method, target: target, headers: headers, body: body)
        let idempotent = method.isIdempotent
        var attempt = 0
        while true {
            attempt += 1
            if Task.isCancelled { throw .cancelled }
            let lease = try await acquire(target, deadline: deadline)
            do {
                let head = try await sendAndReadHead(bytes, method: method, target: target, lease: lease, deadline: deadline)
                return head
            } catch let failure {
                if isShutDown { throw .clientClosed }
                if Task.isCancelled { throw .cancelled }
                let retry = lease.reused && idempotent && attempt == 1 && failure.beforeResponse
                if !retry { throw failure.error }
            }
        }
    }

    private struct Failure: Error {
        let error: HTTPClientError
        /// Nothing of the response had arrived.
        let beforeResponse: Bool
    }

    private func sendAndReadHead(_ bytes: [UInt8], method: HTTPMethod, target: HTTPTarget, lease: Lease,
                                 deadline: RequestDeadline) async throws(Failure) -> (ResponseHead, ResponseReader)
    {
        let reader = ResponseReader(client: self, lease: lease, method: method, request: deadline)
        do {
            try await reader.send(bytes)
        } catch {
            reader.abandon()
            throw Failure(error: error, beforeResponse: !reader.timedOut)
        }
        do {
            let head = try await reader.readHead(url: target.url)
            return (head, reader)
        } catch {
            let before = reader.receivedNothing
            reader.abandon()
            throw Failure(error: error, beforeResponse: before && !reader.timedOut)
        }
    }

    /// `url` parsed (`URLComponents` costs about a microsecond): the last URL's parse is kept,
    /// so that a client calling one endpoint again and again parses it once.
    private func target(of url: String) throws(HTTPClientError) -> HTTPTarget {
        if let last = lastTarget.withLock({ $0 }), last.url == url { return last.target }
        let target = try HTTPTarget(parsing: url)
        lastTarget.withLock { $0 = (url, target) }
        return target
    }

    private func requestBytes(method: HTTPMethod, target: HTTPTarget, headers: HTTPHeaders, body: [UInt8]) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(128 + target.pathAndQuery.utf8.count + body.count)
        func append(_ text: String) { bytes.append(contentsOf: text.utf8) }
        func field(_ name: String, _ value: String) {
            append(name)
            bytes.append(contentsOf: [58, 32])  // ": "
            append(value)
            bytes.append(contentsOf: [13, 10])
        }
        append(method.rawValue)
        bytes.append(32)
        append(target.pathAndQuery)
        append(" HTTP/1.1\r\n")
        if !headers.contains("host") { field("Host", target.hostHeader) }
        if let userAgent = configuration.userAgent, !headers.contains("user-agent") { field("User-Agent", userAgent) }
        if !headers.contains("content-length") && !headers.contains("transfer-encoding")
            && (!body.isEmpty || method == .post || method == .put || method == .patch)
        {
            field("Content-Length", String(body.count))
        }
        for (name, value) in headers { field(name, value) }
        bytes.append(contentsOf: [13, 10])
        bytes.append(contentsOf: body)
        return bytes
    }

    // MARK: Connections

    /// A connection from the pool, or a new one once there is room.
    private func acquire(_ target: HTTPTarget, deadline: RequestDeadline) async throws(HTTPClientError) -> Lease {
        let key = PoolKey(target)
        while true {
            let grant = try await pool.acquire(key, deadline: deadline, loop: loop)
            if Task.isCancelled {  // a grant that came with the cancellation goes back unused
                switch grant {
                case .idle(let connection): pool.release(key, connection: connection)
                case .newSlot: pool.discard(key)
                }
                throw .cancelled
            }
            switch grant {
            case .idle(let connection):
                if await isReusable(connection) {
                    let lease = Lease(key: key, connection: connection, reused: true)
                    guard lend(lease) else { throw .clientClosed }
                    return lease
                }
                connection.close()
                pool.discard(key)
            case .newSlot:
                do throws(HTTPClientError) {
                    let connection = try await connect(target, deadline: deadline)
                    let lease = Lease(key: key, connection: connection, reused: false)
                    guard lend(lease) else { throw .clientClosed }
                    return lease
                } catch {
                    pool.discard(key)
                    throw error
                }
            }
        }
    }

    /// Whether an idle connection can take a request: open, not ended by the server, nothing
    /// unread on it. (`submit` throws only when the loop has shut down: then it cannot.)
    func isReusable(_ connection: Connection) async -> Bool {
        guard connection.isOpen else { return false }
        let idle: @Sendable () -> Bool = { connection.isOpen && !connection.peerHasEnded && connection.bufferedInputBytes == 0 }
        if loop.isCurrent { return idle() }
        return (try? await loop.submit(idle)) ?? false
    }

    private func connect(_ target: HTTPTarget, deadline: RequestDeadline) async throws(HTTPClientError) -> Connection {
        let connector: Connector
        if target.secure {
            guard let secure = configuration.secureConnector else { throw .unsupportedScheme("https") }
            connector = secure
        } else {
            connector = configuration.connector
        }
        let race = ConnectRace(loop: loop)
        let loop = self.loop
        let options = configuration.connectionOptions
        let resolver = configuration.resolver
        // The connect's own limit, or what is left of the request's, whichever ends first.
        var limit = configuration.connectTimeout
        var timeout: @Sendable () -> HTTPClientError = { [configuration] in
            .connectTimeout(host: target.host, port: target.port, configuration.connectTimeout)
        }
        if let remaining = deadline.remaining(at: loop.clock.now), remaining <= limit {
            limit = remaining
            timeout = { deadline.failure(in: race.isResolving ? .resolving : .connecting) }
        }
        // The connect, its timeout (a timer of the loop: its clock, virtual time on a simulated
        // loop) and the task's cancellation race; the first decides. A connect that wins cancels
        // the timer; a timeout or cancellation that wins cancels the connect (a plain connect
        // aborts its half-made socket at once; a TLS one notices when its handshake ends); a
        // connect that still comes too late is closed.
        let result: Result<Connection, HTTPClientError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                race.arm(continuation)
                race.startTimer(after: limit, failure: timeout)
                // On the client's loop: the resolver's work and the connect are the loop's (and on
                // a simulated loop stay inside the simulation, where virtual time sees them).
                race.attach(Task(executorPreference: loop) {
                    do {
                        let address: String
                        do throws(HTTPClientError) {
                            address = try await resolver.resolve(target.host)
                        } catch {
                            _ = race.finish(.failure(error))
                            return
                        }
                        race.resolved()
                        if Task.isCancelled { return }
                        let connection = try await connector.connect(address, target.port, target.host, loop, options)
                        if !race.finish(.success(connection)) { connection.close() }  // too late
                    } catch let error as EventLoopError {
                        _ = race.finish(.failure(Self.connectError(error, target: target)))
                    } catch {
                        _ = race.finish(.failure(.securityFailed(host: target.host, port: target.port, reason: "\(error)")))
                    }
                })
            }
        } onCancel: {
            _ = race.finish(.failure(.cancelled))
        }
        return try result.get()
    }

    /// A failed connect as the client reports it: a name that did not resolve (or not in time)
    /// is `unresolvedHost`, anything else `connectFailed`.
    private static func connectError(_ error: EventLoopError, target: HTTPTarget) -> HTTPClientError {
        switch error {
        case .hostNotFound, .resolveTimedOut: return .unresolvedHost(target.host)
        default: return .connectFailed(host: target.host, port: target.port, error)
        }
    }

    /// A response read to its end (`reusable`: the connection may take another request), or
    /// abandoned.
    func release(_ lease: Lease, reusable: Bool) {
        leased.withLock { _ = $0.connections.removeValue(forKey: ObjectIdentifier(lease.connection)) }
        if reusable {
            pool.release(lease.key, connection: lease.connection)
        } else {
            lease.connection.close()
            pool.discard(lease.key)
        }
    }
}

/// A connection lent to one request.
struct Lease: Sendable {
    let key: PoolKey
    let connection: Connection
    /// It served an earlier request.
    let reused: Bool
}

/// The first of a connect, its timeout and the caller's cancellation.
private final class ConnectRace: @unchecked Sendable {
    typealias Waiter = CheckedContinuation<Result<Connection, HTTPClientError>, Never>
    /// The waiter, or the result that came before it did; `done` once a result is in; the
    /// connect's task until then.
    private let state = ClientLock<(continuation: Waiter?, early: Result<Connection, HTTPClientError>?, done: Bool,
                                    connect: Task<Void, Never>?)>((nil, nil, false, nil))
    private let loop: EventLoop
    /// The timeout's timer. Loop thread only.
    private var timer: TimerHandle?
    /// Whether the resolver has not answered yet (what a request deadline's error names).
    private let resolving = Atomic<Bool>(true)

    init(loop: EventLoop) { self.loop = loop }

    var isResolving: Bool { resolving.load(ordering: .acquiring) }

    /// The resolver answered: the connect itself is in progress.
    func resolved() { resolving.store(false, ordering: .releasing) }

    func arm(_ continuation: Waiter) {
        let early = state.withLock { state -> Result<Connection, HTTPClientError>? in
            if let early = state.early {
                state.early = nil
                return early
            }
            state.continuation = continuation
            return nil
        }
        if let early { continuation.resume(returning: early) }
    }

    /// The connect's task: cancelled if the timeout or the caller's cancellation finishes the
    /// race first (at once, if one did already).
    func attach(_ connect: Task<Void, Never>) {
        let lost = state.withLock { state -> Bool in
            guard !state.done else { return true }
            state.connect = connect
            return false
        }
        if lost { connect.cancel() }
    }

    /// Arms the timeout on the loop: `failure` unless something else finished first.
    func startTimer(after limit: Duration, failure: @escaping @Sendable () -> HTTPClientError) {
        loop.execute { [self] in
            guard !state.withLock({ $0.done }) else { return }
            timer = loop.schedule(after: limit) { [self] in
                timer = nil
                _ = finish(.failure(failure()))
            }
        }
    }

    /// Resumes the waiter with `result` if nothing did yet; false if it came too late.
    func finish(_ result: Result<Connection, HTTPClientError>) -> Bool {
        let (first, continuation, connect) = state.withLock { state -> (Bool, Waiter?, Task<Void, Never>?) in
            guard !state.done else { return (false, nil, nil) }
            state.done = true
            let connect = state.connect
            state.connect = nil
            guard let continuation = state.continuation else {
                state.early = result
                return (true, nil, connect)
            }
            state.continuation = nil
            return (true, continuation, connect)
        }
        guard first else { return false }
        continuation?.resume(returning: result)
        // The connect lost (a timeout, the caller's cancellation): it ends now, its socket with it.
        if case .failure = result { connect?.cancel() }
        loop.execute { [self] in
            timer?.cancel()
            timer = nil
        }
        return true
    }
}
