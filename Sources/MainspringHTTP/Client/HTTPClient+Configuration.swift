import Foundation
import MainspringCore
import Synchronization

extension HTTPClient {
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
        /// Speak HTTP/2 to every host without asking first (h2c on `http` URLs; over TLS,
        /// whatever ALPN agreed): one connection a host, its requests side by side. Default
        /// false: HTTP/2 only where TLS's ALPN agreed on `h2` (a `TLSClientContext` whose
        /// `applicationProtocols` offer it), HTTP/1.1 otherwise.
        public var http2PriorKnowledge = false

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
        /// (and, for TLS, its handshake done, checked against `hostName`). What it throws is
        /// reported as: an `EventLoopError`, or a `TLSError.connect(_:)` carrying one — no
        /// connection was made — ``HTTPClientError/connectFailed(host:port:_:)`` (or
        /// `unresolvedHost`); `EventLoopError.cancelled` or `TLSError.cancelled`,
        /// ``HTTPClientError/cancelled``; any other `TLSError` — the connection was made but not
        /// secured — ``HTTPClientError/tlsFailed(host:port:_:)``, and an error of another type
        /// the same, as a failed handshake with its description.
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

        /// What a connector's error means, for the clients that call one (`HTTPClient` and the
        /// WebSocket client), sorted once: any cancellation (`CancellationError` too); no
        /// connection made (an `EventLoopError`, or a `TLSError` carrying one); a connection not
        /// secured (any other `TLSError`, and an error of another type, as a failed handshake
        /// with its description: the seam is where security layers plug in).
        enum Failure {
            case cancelled
            case notConnected(EventLoopError)
            case notSecured(TLSError)

            init(_ error: any Error) {
                if error.isCancellation {
                    self = .cancelled
                    return
                }
                switch error {
                case let error as EventLoopError: self = .notConnected(error)
                case TLSError.connect(let error): self = .notConnected(error)
                case let error as TLSError: self = .notSecured(error)
                default: self = .notSecured(.handshakeFailed(reason: "\(error)"))
                }
            }
        }
    }
}
