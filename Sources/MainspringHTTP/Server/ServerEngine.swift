// The seam between an `HTTPServer`'s loop share (`LoopEndpoint`: routing, handlers, load
// shedding, statistics, closing) and the engine that reads requests off connections and writes
// responses back: `ServerEngine` (one loop's accepting, its connections, stopping and resuming at
// the connection limit) and `ServerExchange` (one request read in full, and its answer, whole or
// streamed). One engine serves it, on real and simulated loops alike: the connection engine
// (ConnectionEngine/), HTTP/1.1 in Swift over Mainspring's own `Connection`s, and HTTP/2 on the
// same connections (HTTP2/, on nghttp2); what each reads and answers is described at the top of
// ConnectionEngine.swift and HTTP2ServerConnection.swift. Both kinds of exchange serve the same
// routes through this seam.
import MainspringCore

/// Limits one loop's engine enforces (see `HTTPServer.Configuration`).
struct ServerLimits {
    var maxHeaderBytes: Int
    var maxBodyBytes: Int
    let idleTimeout: Duration
    let headerTimeout: Duration
    let bodyTimeout: Duration
    /// The three timeouts in nanoseconds (at least 1), for the engine's deadlines.
    let idleNanoseconds: UInt64
    let headerNanoseconds: UInt64
    let bodyNanoseconds: UInt64
    /// Whether the engine asks the delegate, when a head that announces a body is complete,
    /// whether to shed it before its body is read (load shedding is on).
    var shedsBeforeBody: Bool
    /// HTTP/2's limits; nil: HTTP/1.1 only (a client's HTTP/2 preface is refused as a bad request).
    var http2: HTTPServer.HTTP2Options?

    init(maxHeaderBytes: Int, maxBodyBytes: Int, idleTimeout: Duration, headerTimeout: Duration, bodyTimeout: Duration,
         shedsBeforeBody: Bool = false, http2: HTTPServer.HTTP2Options? = nil)
    {
        self.http2 = http2
        self.maxHeaderBytes = maxHeaderBytes
        self.maxBodyBytes = maxBodyBytes
        self.idleTimeout = idleTimeout
        self.headerTimeout = headerTimeout
        self.bodyTimeout = bodyTimeout
        idleNanoseconds = UInt64(max(1, idleTimeout.clampedNanoseconds))
        headerNanoseconds = UInt64(max(1, headerTimeout.clampedNanoseconds))
        bodyNanoseconds = UInt64(max(1, bodyTimeout.clampedNanoseconds))
        self.shedsBeforeBody = shedsBeforeBody
    }
}

/// What a loop's engine tells its owner (`LoopEndpoint`).
protocol ServerEngineDelegate: AnyObject {
    /// A request was read in full (and routed nowhere yet).
    func received(_ request: any ServerExchange)
    /// A request handed over by `received` is over: its response was written, or its
    /// connection was lost, or the engine was freed. Exactly once per request.
    func finished(_ request: any ServerExchange, written: Bool)
    /// The engine answered a request itself, before routing (400, 413, 417, 431, 501, 503).
    func answeredByGuard(status: Int)
    /// A request head announcing a body is complete and its body not read yet: whether to
    /// answer it `503` now (load shedding), and the `Retry-After` seconds to send. Counts what
    /// it sheds. Asked only when `ServerLimits.shedsBeforeBody`.
    func shedsBeforeBody(path: [UInt8]) -> Int?
    /// A connection was accepted. Returns whether the engine may keep accepting.
    func acceptedConnection() -> Bool
    /// A connection closed (for any reason).
    func closedConnection(timedOut: Bool)
}

/// One loop's engine, as its `LoopEndpoint` drives it. Loop thread only.
protocol ServerEngine: AnyObject {
    var limits: ServerLimits { get }
    /// Stops accepting new connections (those open are not affected). Idempotent.
    func stopAccepting()
    /// The connection limit allows accepting again.
    func resumeAfterLimit()
    /// Connections open on this loop.
    var connectionCount: Int { get }
    /// Closes every connection and lets go of the listening socket; requests in flight finish
    /// as not written (replying to them does nothing).
    func free()
}

/// One request an engine read in full, until its response is handed back: what the endpoint
/// reads of it, and how it answers — whole, or chunked with a callback per drained chunk (the
/// streaming writer's backpressure). Loop thread only.
protocol ServerExchange: AnyObject {
    /// The route's concurrency limit whose place this request holds until it finishes.
    var heldLimit: ConcurrencyLimit? { get set }
    /// Whether a reply can still reach the client.
    var isConnectionOpen: Bool { get }
    /// Whether the request's connection was taken over (a WebSocket upgrade): it finishes
    /// unwritten, and is done.
    var isTakenOver: Bool { get }
    var method: HTTPMethod { get }
    /// The protocol version the request came in.
    var version: HTTPVersion { get }
    /// The request target as sent.
    var uri: String { get }
    /// The path, percent-decoded ("+" stays "+"), the path as sent, and the decoded query items.
    var pathAndQuery: (path: String, rawPath: String, query: [(name: String, value: String)]) { get }
    /// The request's header fields, in order.
    var headers: [(name: String, value: String)] { get }
    var body: [UInt8] { get }
    /// `host:port` of the client (`[v6]:port` for IPv6).
    var remoteAddress: String { get }
    /// Output of the connection not sent yet.
    var bufferedOutputBytes: Int { get }
    /// Adds a header field to the response (before `sendReply` or `startChunked`); a field whose
    /// name or value holds CR or LF is dropped (header injection).
    func addResponseHeader(_ name: String, _ value: String)
    /// Adds `Content-Length: length` (a whole response's own length, as the server counts it).
    func addContentLength(_ length: Int)
    /// Sends a whole response and hands the request back. `body` is not sent for HEAD.
    func sendReply(status: Int, reason: String, body: [UInt8])
    /// Starts a chunked response (or, for HTTP/1.0 clients, one ended by closing).
    func startChunked(status: Int, reason: String)
    /// Sends one chunk; `whenDrained` runs (on the loop) once it has been sent, or at once if
    /// the connection is gone.
    func sendChunk(_ bytes: [UInt8], whenDrained: (() -> Void)?)
    /// Ends a chunked response and hands the request back.
    func endChunked()
    /// Takes the request's connection away from the engine (a WebSocket upgrade): the request
    /// finishes unwritten; `adopted` gets the connection, with `options` where the engine can
    /// set them, and the bytes that came after the request. False, with nothing changed, when
    /// it cannot be taken.
    func takeOverConnection(options: Connection.Options, adopted: @escaping (Connection, [UInt8]) -> Void) -> Bool
}
