import MainspringCore

extension HTTPClient.Connector {
    /// HTTPS: a TCP connect, then the TLS handshake with `context` (a `TLSClientContext` from
    /// `MainspringTLS`, or any `ClientConnectionSecurity`), the server's certificate checked
    /// against the URL's host (also sent as SNI when it is a name) as
    /// `context.configuration.verification` says. For `HTTPClient.Configuration.secureConnector`:
    ///
    /// ```swift
    /// let tls = try TLSClientContext(configuration: .init(trustRoots: .file("ca.pem")))
    /// let client = HTTPClient(loop: loop, configuration: .init(secureConnector: .tls(tls)))
    /// ```
    ///
    /// The handshake runs on the client's loop as `.normal` work; it counts against the
    /// client's connect timeout. A failed handshake (a certificate check, with OpenSSL's account
    /// naming it) is ``HTTPClientError/tlsFailed(host:port:_:)``; a failed TCP connect
    /// is `connectFailed`, as over `http`.
    public static func tls(_ context: some ClientConnectionSecurity) -> Self {
        Self { (address: String, port: UInt16, hostName: String, loop: EventLoop, options: Connection.Options)
            async throws -> Connection in
            try await context.connect(to: address, port: port, serverName: hostName, on: loop, options: options)
        }
    }
}
