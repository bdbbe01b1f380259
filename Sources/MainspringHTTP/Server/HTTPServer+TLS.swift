import MainspringCore

/// HTTPS: an `HTTPServer` whose connections speak TLS with the certificates of a
/// `TLSServerContext` from `MainspringTLS` (reloading the context changes them for new
/// connections). Everything
/// else — routes, limits, metrics, health, closing — is the plain server's. One server per
/// port: serve HTTP and HTTPS side by side with two servers on one group.
extension HTTPServer {
    /// Serves `routes` over HTTPS on every loop of `group`, and returns once every loop serves.
    /// Any task.
    /// - Throws: `HTTPServerError` when the address is invalid or in use, or libevent fails.
    public convenience init(group: EventLoopGroup, configuration: Configuration = .init(), routes: HTTPRoutes,
                            tls: some ServerConnectionSecurity) async throws(HTTPServerError)
    {
        try await self.init(loops: group.loops, group: group, configuration: configuration, routes: routes, security: tls._serverLayer)
    }

    /// The blocking form of ``init(group:configuration:routes:tls:)-(_,_,_,_)``, for a plain
    /// thread.
    public convenience init(group: EventLoopGroup, configuration: Configuration = .init(), routes: HTTPRoutes,
                            tls: some ServerConnectionSecurity) throws(HTTPServerError)
    {
        try self.init(loops: group.loops, group: group, configuration: configuration, routes: routes, security: tls._serverLayer)
    }
}
