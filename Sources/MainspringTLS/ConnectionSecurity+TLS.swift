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
    /// - Throws: as the seam asks: the connect's `EventLoopError` when the connection under TLS
    ///   was not made (and `EventLoopError.cancelled` for a cancelled task), the handshake's
    ///   ``TLSError/handshakeFailed(reason:)`` when it was.
    public func connect(to address: String, port: UInt16, serverName: String, on loop: EventLoop,
                        options: Connection.Options) async throws -> Connection
    {
        do throws(TLSError) {
            return try await Connection.connect(to: address, port: port, on: loop, options: options, tls: self,
                                                serverName: serverName)
        } catch {
            switch error {
            case .connect(let connectError): throw connectError
            case .cancelled: throw EventLoopError.cancelled
            case .handshakeFailed: throw error
            }
        }
    }
}
