import Foundation
import MainspringCore

/// A request for ``HTTPClient``: method, absolute URL, header fields, body.
public struct HTTPClientRequest: Sendable {
    /// The method (`GET`, `POST`, …).
    public var method: HTTPMethod
    /// An absolute `http://` (or, with a TLS connector, `https://`) URL. The host is an IP
    /// literal (`127.0.0.1`, `[::1]`) or a name, which the client's
    /// ``HTTPClient/Configuration/resolver`` (``HTTPClient/Resolver/system`` by default)
    /// turns into addresses.
    public var url: String
    /// Header fields sent as given, after `Host` and `Content-Length` (which the client writes
    /// unless they are here).
    public var headers: HTTPHeaders
    /// The body; sent with a `Content-Length` (empty: none for `GET`, `HEAD` and `DELETE`).
    public var body: [UInt8]
    /// How many redirects to follow for this request; nil: the client's
    /// ``HTTPClient/Configuration/redirectLimit``. Zero returns a 3xx response as it is.
    public var redirectLimit: Int?
    /// How long the whole request may take — the wait for a pooled connection, resolving,
    /// connecting, TLS, sending, the whole response (read whole, or streamed), redirects and
    /// retries — from the call; nil: the client's ``HTTPClient/Configuration/requestTimeout``.
    /// Past it the request fails with ``HTTPClientError/requestTimeout(_:phase:)``.
    public var timeout: Duration?
    /// An absolute deadline for the whole request, on the client's loop's clock
    /// (`loop.clock.now.advanced(by:)`; virtual time on a simulated loop): a deadline carried
    /// over from the caller's own. Wins over ``timeout`` when both are set.
    public var deadline: LoopClock.Instant?
    /// When this request is tried again after a failure; nil: the client's
    /// ``HTTPClient/Configuration/retryPolicy``; ``HTTPClient/RetryPolicy/none``: never.
    public var retryPolicy: HTTPClient.RetryPolicy?

    /// A request.
    public init(method: HTTPMethod = .get, url: String, headers: HTTPHeaders = [:], body: [UInt8] = [],
                redirectLimit: Int? = nil, timeout: Duration? = nil, deadline: LoopClock.Instant? = nil,
                retryPolicy: HTTPClient.RetryPolicy? = nil)
    {
        self.retryPolicy = retryPolicy
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.redirectLimit = redirectLimit
        self.timeout = timeout
        self.deadline = deadline
    }
}

/// A response read whole by ``HTTPClient/execute(_:)``.
public struct HTTPClientResponse: Sendable {
    /// The status code (200, 404, …).
    public var status: Int
    /// The reason phrase of the status line (`OK`), as the server sent it.
    public var reason: String
    /// The header fields in the order they came (trailers of a chunked body appended).
    public var headers: HTTPHeaders
    /// The body, at most ``HTTPClient/Configuration/maxBodyBytes``; empty for `HEAD`, 204, 304.
    public var body: [UInt8]
    /// The URL this response came from (the last one, after redirects).
    public var url: String

    /// The body as UTF-8 text (invalid bytes replaced).
    public var text: String { String(decoding: body, as: UTF8.self) }
}

/// Why a request failed; each case names what failed.
public enum HTTPClientError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The URL could not be parsed, or is not absolute.
    case invalidURL(String)
    /// The URL's scheme has no connector: `https` needs ``HTTPClient/Configuration/secureConnector``
    /// (MainspringTLS's `.tls(_:)`); others are not HTTP.
    case unsupportedScheme(String)
    /// The host is a name that did not resolve: no address for it (`getaddrinfo` found none,
    /// or no nameserver answered), the lookup did not finish within
    /// `Connection.Options.resolveTimeout`, or the configured resolver refused it
    /// (``HTTPClient/Resolver/literalsAndLocalhost`` refuses every name but `localhost`).
    case unresolvedHost(String)
    /// The connect to `host:port` failed: refused (`ECONNREFUSED`), unreachable.
    case connectFailed(host: String, port: UInt16, EventLoopError)
    /// The connection to `host:port` was made but not secured: the TLS handshake failed (a
    /// certificate that did not verify, the handshake timeout, a server that does not speak
    /// TLS) — the connector's `TLSError`, with OpenSSL's account naming the check that failed.
    /// (A connector of your own that throws something else is reported here as
    /// `TLSError.handshakeFailed` with that error's description.)
    case tlsFailed(host: String, port: UInt16, TLSError)
    /// No longer reported: a connection that was not secured is ``tlsFailed(host:port:_:)``,
    /// carrying the one TLS error, `TLSError`.
    @available(*, deprecated, message: "a connection that was not secured is tlsFailed(host:port:_:), carrying the TLSError")
    case securityFailed(host: String, port: UInt16, reason: String)
    /// The connect to `host:port` did not complete within the connect timeout.
    case connectTimeout(host: String, port: UInt16, Duration)
    /// The response (its head, or the next part of its body) did not arrive within the
    /// response timeout.
    case responseTimeout(Duration)
    /// The request's deadline passed while it was in `phase`: the limit is
    /// ``HTTPClient/Configuration/requestTimeout``, the request's own
    /// ``HTTPClientRequest/timeout``, or the time its ``HTTPClientRequest/deadline`` left it.
    case requestTimeout(Duration, phase: RequestPhase)
    /// The status line is not `HTTP/1.x NNN reason` (the start of what came instead).
    case malformedStatusLine(String)
    /// A header line has no colon or an invalid name (the start of the line).
    case malformedHeader(String)
    /// A chunk-size line of a chunked body is not hexadecimal, or a chunk lacks its CRLF.
    case malformedChunk(String)
    /// `Content-Length` is not a number, or there are two that differ.
    case invalidContentLength(String)
    /// The status line and header fields exceeded this many bytes.
    case headersTooLarge(limit: Int)
    /// The body exceeded this many bytes (whole responses; streamed ones have no limit).
    case bodyTooLarge(limit: Int)
    /// The server closed the connection before the response was complete (what was missing).
    case closedMidResponse(String)
    /// More redirects than the limit.
    case tooManyRedirects(limit: Int)
    /// A redirect without a usable `Location`.
    case invalidRedirect(String)
    /// Sending the request failed: the connection closed with this reason.
    case sendFailed(Connection.CloseReason)
    /// The client was shut down (``HTTPClient/shutdown()``): before the request, or while it
    /// was in flight.
    case clientClosed
    /// The calling task was cancelled: before the request, while it waited for a connection or
    /// for its connect, or while its response was being read. A connection the cancellation
    /// interrupted mid-exchange is closed (a pooled connection is never left with half a
    /// response on it); one that was not yet used goes back to the pool.
    case cancelled
    /// The server sent more interim (`1xx`) responses before the final one than
    /// ``HTTPClient/Configuration/maxInterimResponses``.
    case tooManyInterimResponses(limit: Int)

    /// Where a request was when its deadline passed (``requestTimeout(_:phase:)``).
    public enum RequestPhase: String, Sendable, CaseIterable, CustomStringConvertible {
        /// Waiting for a connection of the host's pool (all ``HTTPClient/Configuration/maxConnectionsPerHost`` busy).
        case waitingForConnection = "waiting for a connection of the pool"
        /// In ``HTTPClient/Configuration/resolver``.
        case resolving = "resolving the host"
        /// Connecting (a name's lookup by the connector and a TLS handshake included).
        case connecting
        /// The request sent — queued on its connection whole; a large body may still be going
        /// out, as fast as the server reads it — and the response's head not in yet.
        case awaitingResponse = "waiting for the response"
        /// Reading the response's body.
        case readingBody = "reading the body"

        public var description: String { rawValue }
    }

    /// The text of every case, the deprecated one included (see `DescribesEveryCase`).
    public var description: String { caseDescription }

    /// The text of every case (`description`); deprecated so that it may name the deprecated
    /// case, and exhaustive (no `default`) so that a new case cannot be forgotten.
    @available(*, deprecated, message: "use description")
    package var text: String {
        switch self {
        case .invalidURL(let url): return "invalid URL \(url.debugDescription)"
        case .unsupportedScheme(let scheme): return "unsupported scheme \(scheme.debugDescription) (https needs a TLS connector)"
        case .unresolvedHost(let host): return "cannot resolve host \(host.debugDescription)"
        case .connectFailed(let host, let port, let error): return "connect to \(host):\(port) failed: \(Self.reason(error))"
        case .tlsFailed(let host, let port, let error): return "connect to \(host):\(port) failed: \(error)"
        case .securityFailed(let host, let port, let reason): return "connect to \(host):\(port) failed: \(reason)"
        case .connectTimeout(let host, let port, let limit): return "connect to \(host):\(port) timed out after \(limit)"
        case .responseTimeout(let limit): return "no response within \(limit)"
        case .requestTimeout(let limit, let phase): return "the request's \(limit) ran out while \(phase)"
        case .malformedStatusLine(let line): return "malformed status line \(line.debugDescription)"
        case .malformedHeader(let line): return "malformed header line \(line.debugDescription)"
        case .malformedChunk(let line): return "malformed chunk \(line.debugDescription)"
        case .invalidContentLength(let value): return "invalid Content-Length \(value.debugDescription)"
        case .headersTooLarge(let limit): return "response head over \(limit) bytes"
        case .bodyTooLarge(let limit): return "response body over \(limit) bytes"
        case .closedMidResponse(let what): return "server closed the connection mid-response (\(what))"
        case .tooManyRedirects(let limit): return "more than \(limit) redirects"
        case .invalidRedirect(let location): return "redirect to an invalid location \(location.debugDescription)"
        case .sendFailed(let reason): return "sending the request failed: \(reason)"
        case .clientClosed: return "the client was shut down"
        case .cancelled: return "the request's task was cancelled"
        case .tooManyInterimResponses(let limit): return "more than \(limit) interim (1xx) responses"
        }
    }

    /// Why a connect failed, without what `connectFailed`'s own words say already: the core's
    /// errors of a connect name the address and say "failed" too ("connect 127.0.0.1:1
    /// failed: …", "connect to db:5432 failed: …"), so only their reason is kept.
    private static func reason(_ error: EventLoopError) -> String {
        switch error {
        case .system(let function, let code) where function.hasPrefix("connect "):
            return errnoDescription(code)
        case .connectFailed(_, _, let attempts) where !attempts.isEmpty:
            return attempts.map(\.description).joined(separator: "; ")
        default:
            return error.description
        }
    }
}

/// Where a request goes: the parts of its URL the client uses, and what it sends from them
/// (made once per URL: a client calling one endpoint again and again keeps its target).
struct HTTPTarget: Sendable, Hashable {
    let secure: Bool
    let host: String
    let port: UInt16
    /// Path and query, as sent on the request line.
    let pathAndQuery: String
    /// The `Host` header: the host as in the URL (brackets around IPv6), the port unless default.
    let hostHeader: String
    /// The URL, normalized (a response's `url`, the base of a redirect).
    let url: String

    init(secure: Bool, host: String, port: UInt16, pathAndQuery: String) {
        self.secure = secure
        self.host = host
        self.port = port
        self.pathAndQuery = pathAndQuery
        let name = host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]" : host
        hostHeader = port == (secure ? 443 : 80) ? name : "\(name):\(port)"
        url = "\(secure ? "https" : "http")://\(hostHeader)\(pathAndQuery)"
    }

    init(parsing url: String) throws(HTTPClientError) {
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
              var host = components.host, !host.isEmpty
        else { throw .invalidURL(url) }
        guard scheme == "http" || scheme == "https" else { throw .unsupportedScheme(scheme) }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        let secure = scheme == "https"
        let port: UInt16
        if let given = components.port {
            guard let valid = UInt16(exactly: given), valid > 0 else { throw .invalidURL(url) }
            port = valid
        } else {
            port = secure ? 443 : 80
        }
        let path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
        self.init(secure: secure, host: host, port: port,
                  pathAndQuery: components.percentEncodedQuery.map { "\(path)?\($0)" } ?? path)
    }

    /// `location` (absolute, or relative to this target) as a target.
    func resolving(_ location: String) throws(HTTPClientError) -> HTTPTarget {
        guard let base = URL(string: url), let resolved = URL(string: location, relativeTo: base)?.absoluteString else {
            throw .invalidRedirect(location)
        }
        do {
            return try HTTPTarget(parsing: resolved)
        } catch {
            throw .invalidRedirect(location)
        }
    }
}

extension HTTPClientError: DescribesEveryCase {}

extension HTTPClientError: CancellationReportingError {
    /// Whether this is ``cancelled`` — the calling task was cancelled — or carries a
    /// cancellation (a send or a connect that it ended).
    public var reportsCancellation: Bool {
        switch self {
        case .cancelled: return true
        case .sendFailed(let reason): return reason.reportsCancellation
        case .connectFailed(_, _, let error): return error.reportsCancellation
        case .tlsFailed(_, _, let error): return error.reportsCancellation
        default: return false
        }
    }
}
