import MainspringCore

/// A `TLSServerContext` secures the connections an `HTTPServer` accepts
/// (`HTTPServer(group:routes:tls:)` in `MainspringHTTP`): each one speaks TLS with the
/// context's certificates of the moment.
extension TLSServerContext: ServerConnectionSecurity {
    public var _serverLayer: ServerSecurityLayer {
        ServerSecurityLayer(acceptPreparer: TLSAcceptPreparer(context: self))
    }
}

/// A `TLSClientContext` secures the connections the library's clients make:
/// `HTTPClient.Connector.tls(_:)` and the WebSocket client's `secureConnector` (`MainspringHTTP`).
extension TLSClientContext: ClientConnectionSecurity {
    /// `Connection.connect(to:port:on:options:tls:serverName:)` with this context: a TCP
    /// connect (Happy Eyeballs for a name), then the handshake, the server's certificate checked
    /// for `serverName` as `configuration.verification` says. Any task.
    /// - Throws: ``TLSError``, as that connect throws it.
    public func connect(to address: String, port: UInt16, serverName: String, on loop: EventLoop,
                        options: Connection.Options) async throws(TLSError) -> Connection
    {
        try await Connection.connect(to: address, port: port, on: loop, options: options, tls: self, serverName: serverName)
    }
}
