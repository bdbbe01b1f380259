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
    /// - Throws: an ``EventLoopError`` when the connection under the security was not made (the
    ///   connect's error as `Connection.connect(to:port:on:options:)` throws it, `.cancelled`
    ///   for a cancelled task); the security layer's own error when the connection was made but
    ///   not secured (`MainspringTLS`'s `TLSError.handshakeFailed`). The library's clients
    ///   report the first as a connect failure, the second with its text
    ///   (`HTTPClientError.securityFailed`).
    func connect(to address: String, port: UInt16, serverName: String, on loop: EventLoop,
                 options: Connection.Options) async throws -> Connection
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
    package let layer: any ServerConnectionLayer
    /// The same security as a listener's handshake step, for a server on simulated loops
    /// (`MainspringTesting`), whose connections are the simulation's network's, not evhttp's.
    package let acceptPreparer: (any AcceptedSocketPreparer)?
    package init(_ layer: any ServerConnectionLayer, acceptPreparer: (any AcceptedSocketPreparer)? = nil) {
        self.layer = layer
        self.acceptPreparer = acceptPreparer
    }
}

/// A layer under each connection a server accepts — TLS, from `MainspringTLS` — that makes the
/// bufferevent the server's connection sits on (`MainspringHTTP`'s server puts its connection
/// filter on it). Called inside libevent (evhttp's `bevcb`): record and hand off, no user code.
package protocol ServerConnectionLayer: Sendable {
    /// A bufferevent on `base` for a connection about to be accepted (made without a socket:
    /// evhttp gives it its socket next), or nil to refuse the connection.
    func makeUnderlying(base: OpaquePointer) -> OpaquePointer?

    /// Writes `bytes` to the peer now, through the layer (encrypted), straight to the socket —
    /// not into `underlying`'s output buffer, which libevent writes only on a later poll: evhttp
    /// takes output that left the filter as sent, and frees a `Connection: close` connection
    /// (shutting the socket down) at that moment. `.blocked`: the socket took none or part of
    /// it; offer the same bytes again, the same count, once it has room (OpenSSL finishes a
    /// record it began only from them).
    func writeNow(underlying: OpaquePointer, _ bytes: UnsafeRawBufferPointer) -> ServerLayerWrite

    /// The connection's filter was freed, and `underlying` with it (libevent frees it, and
    /// closes its socket, right after this call — unless a WebSocket upgrade keeps it, see
    /// `adoptUpgraded`): the layer lets go of what it attached to it. evhttp has shut the
    /// socket's output down already: nothing more can be sent (but on an upgraded one).
    func release(underlying: OpaquePointer)

    /// A connection over `underlying` after a WebSocket upgrade: the layer's bufferevent,
    /// established, on its own socket again (evhttp shut a placeholder down in its place) and no
    /// longer evhttp's; the caller's one reference to it becomes the connection's. On a throw the caller frees it. Inside
    /// libevent, on the loop's thread.
    func adoptUpgraded(underlying: OpaquePointer, peer: String, on loop: EventLoop,
                       options: Connection.Options) throws(EventLoopError) -> Connection
}

/// The outcome of `ServerConnectionLayer.writeNow`.
package enum ServerLayerWrite {
    /// All of the bytes were written.
    case wrote
    /// The socket has no room: offer the same bytes again when it has.
    case blocked
    /// The connection failed (the peer is gone): drop the output; reading reports the close.
    case failed
}

