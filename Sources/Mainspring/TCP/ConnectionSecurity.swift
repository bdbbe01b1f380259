// Security for the connections a client makes and a server accepts: the protocols through
// which `MainspringHTTP` uses TLS from `MainspringTLS` without either module depending on the
// other (a program that wants TLS alone builds no HTTP, and HTTP alone links no OpenSSL).

/// Security for a connection a client makes — TLS from `MainspringTLS` (`TLSClientContext`
/// conforms) — in the form the library's clients take it: `HTTPClient.Connector.tls(_:)` and
/// the WebSocket client's `secureConnector`. A type of your own may conform (a context that pins
/// a certificate, a proxy that tunnels): the clients only call ``connect(to:port:serverName:on:options:)``.
public protocol ClientConnectionSecurity: Sendable {
    /// Connects to `address` port `port` from `loop` and secures the connection for
    /// `serverName` (the name the peer's certificate must carry; sent as SNI when it is a
    /// name). Suspends until the connection is ready for the client's first bytes. Any task.
    /// - Throws: the one TLS error, ``TLSError``: ``TLSError/connect(_:)`` with the connect's
    ///   ``EventLoopError`` when the connection under the security was not made (as
    ///   `Connection.connect(to:port:on:options:)` throws it), ``TLSError/handshakeFailed(reason:)``
    ///   when it was made but not secured, ``TLSError/cancelled`` for a cancelled task. The
    ///   library's clients report the first as a connect failure, the second as a TLS failure
    ///   (`HTTPClientError.tlsFailed(host:port:_:)`). A conformer that secures by other means
    ///   reports its own refusal as `handshakeFailed`, with its reason.
    func connect(to address: String, port: UInt16, serverName: String, on loop: EventLoop,
                 options: Connection.Options) async throws(TLSError) -> Connection
}

/// Security for the connections a server accepts — TLS from `MainspringTLS`
/// (`TLSServerContext` conforms) — in the form `HTTPServer(…tls:)` takes it. The layer under
/// each connection is the library's own: only the package's types conform.
public protocol ServerConnectionSecurity: Sendable {
    /// The layer under each accepted connection (the library's; not for use outside it).
    var _serverLayer: ServerSecurityLayer { get }
}

/// The layer a ``ServerConnectionSecurity`` puts under each accepted connection: opaque outside
/// the library.
public struct ServerSecurityLayer: Sendable {
    /// The step between accepting a socket and handing its connection to the server: the
    /// handshake, run as a listener with `tls:` runs it (on real and simulated loops alike).
    package let acceptPreparer: any AcceptedSocketPreparer
    package init(acceptPreparer: any AcceptedSocketPreparer) {
        self.acceptPreparer = acceptPreparer
    }
}
