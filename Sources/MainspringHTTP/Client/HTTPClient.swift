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
    /// The loop the client's connections live on.
    public let loop: EventLoop
    /// The configuration it was made with.
    public let configuration: Configuration
    let pool: ConnectionPool
    /// The retries made so far against ``Configuration/retryBudget``.
    let retryBudget: RetryBudgetState
    /// The connections lent to requests now, and whether the client was shut down (set once;
    /// a lease made after it is closed at once).
    private let leased = Protected<(connections: [ObjectIdentifier: Connection], isShutDown: Bool)>(([:], false))
    /// The last URL a request named, and its parse.
    private let lastTarget = Protected<(url: String, target: HTTPTarget)?>(nil)
    /// The HTTP/2 connections, one a host (HTTPClient+HTTP2.swift).
    let http2 = HTTP2Connections()

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
        for connection in http2.shutdown() { connection.close() }
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
        let multiplexed = http2.shutdownGracefully()
        let deadline = loop.clock.now.advanced(by: gracePeriod)
        while (leased.withLock({ !$0.connections.isEmpty }) || multiplexed.contains { $0.activeStreams > 0 })
            && loop.clock.now < deadline
        {
            // Polled every few milliseconds: a shutdown is rare, and a lease's end has no waiter.
            // The sleep fails only when the calling task is cancelled or the loop is gone:
            // either way, stop waiting and fail what is left now.
            guard (try? await loop.sleep(for: .milliseconds(5))) != nil else { break }
        }
        shutdown()
        for connection in multiplexed { connection.close() }
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
        // The HTTP/1.1 reader read through its own type: its calls are direct (and may be
        // inlined), where a protocol's async call costs a frame of its own each time.
        if let http1 = reader as? ResponseReader { return try await readWhole(head, http1) }
        return try await readWhole(head, reader)
    }

    /// The response of `head` with its body read to the end from `reader` (up to
    /// ``Configuration/maxBodyBytes``).
    private func readWhole<Body: ResponseBody>(_ head: ResponseHead, _ reader: Body) async throws(HTTPClientError)
        -> HTTPClientResponse
    {
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

    /// Sends `request` (following redirects) and reads the final response's head: one attempt.
    func sendFollowingRedirects(_ request: HTTPClientRequest, deadline: RequestDeadline) async throws(HTTPClientError)
        -> (ResponseHead, any ResponseBody)
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
                          deadline: RequestDeadline) async throws(HTTPClientError) -> (ResponseHead, any ResponseBody)
    {
        let idempotent = method.isIdempotent
        var bytes: [UInt8]?
        var attempt = 0
        while true {
            attempt += 1
            if Task.isCancelled { throw .cancelled }
            if mayUseHTTP2, let multiplexed = try await http2Connection(for: target, deadline: deadline) {
                do throws(HTTPClientError) {
                    let stream = try await multiplexed.request(
                        method: method, target: target, headers: headers, body: body, userAgent: configuration.userAgent,
                        deadline: deadline, responseTimeout: configuration.responseTimeout,
                        maxHeaderBytes: configuration.maxHeaderBytes)
                    do throws(HTTPClientError) {
                        return (try await stream.awaitHead(), stream)
                    } catch {
                        // A stream the server refused (or cut by its GOAWAY) never reached its
                        // processing: it goes once more, on another connection.
                        if attempt == 1, stream.wasRefused, !isShutDown { continue }
                        throw error
                    }
                } catch {
                    if isShutDown { throw .clientClosed }
                    if attempt == 1, !multiplexed.isUsable { continue }
                    throw error
                }
            }
            let lease = try await acquire(target, deadline: deadline)
            if target.secure, lease.connection.negotiatedApplicationProtocol == "h2" {
                // ALPN agreed on HTTP/2: the connection leaves the HTTP/1.1 pool for the host's
                // HTTP/2 connection, and the request goes on it.
                unlend(lease)
                pool.discard(lease.key)
                try await adoptHTTP2(lease.connection, key: lease.key)
                attempt -= 1
                continue
            }
            let requestBytes = bytes ?? requestBytes(method: method, target: target, headers: headers, body: body)
            bytes = requestBytes
            do {
                let head = try await sendAndReadHead(requestBytes, method: method, target: target, lease: lease,
                                                     deadline: deadline)
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
                                 deadline: RequestDeadline) async throws(Failure) -> (ResponseHead, any ResponseBody)
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

    /// Forgets a lent connection without closing it (it became an HTTP/2 connection).
    private func unlend(_ lease: Lease) {
        leased.withLock { _ = $0.connections.removeValue(forKey: ObjectIdentifier(lease.connection)) }
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
