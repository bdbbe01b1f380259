internal import CMainspringTLS
internal import CLibevent
import MainspringCore

/// HTTPS for `HTTPServer`: each accepted connection's bufferevent is a libevent OpenSSL
/// bufferevent, in the accepting state, with a session from the server context's certificates
/// of the moment; the server's connection filter sits on it as on a plain socket.
///
/// Its handshakes run inside libevent's OpenSSL layer, as evhttp reads — not as scheduled loop
/// work like the handshakes of TLS listeners (`Listener(…tls:)`); evhttp offers no point between
/// accepting a socket and reading it where a handshake could be placed.
struct HTTPSLayer: ServerConnectionLayer {
    let context: TLSServerContext

    func makeUnderlying(base: OpaquePointer) -> OpaquePointer? {
        let contexts = context.contexts
        ERR_clear_error()
        guard let ssl = SSL_new(contexts.defaultContext.raw) else { return nil }
        // The session's SNI callback reads `contexts` while it shakes hands: kept alive with it.
        let keeper = Unmanaged.passRetained(contexts)
        _ = SSL_set_ex_data(ssl, 0, keeper.toOpaque())
        guard let bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                       Int32(BEV_OPT_CLOSE_ON_FREE.rawValue))
        else {
            keeper.release()
            SSL_free(ssl)
            return nil
        }
        // evhttp ends a connection on end of file as on an error; for a client that closes
        // without close_notify (most do) that is the right end.
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1)
        return bev
    }

    func writeNow(underlying: OpaquePointer, _ bytes: UnsafeRawBufferPointer) -> ServerLayerWrite {
        guard let ssl = bufferevent_openssl_get_ssl(underlying) else { return .failed }
        ERR_clear_error()
        let written = SSL_write(ssl, bytes.baseAddress, Int32(clamping: bytes.count))
        if written > 0 { return .wrote }  // all of it: partial writes are off (libevent's mode)
        let code = SSL_get_error(ssl, written)
        // A failure's entries leave this thread's error queue, where they would make the next
        // SSL_get_error on it, any connection's, an SSL_ERROR_SSL.
        ERR_clear_error()
        switch code {
        case SSL_ERROR_WANT_WRITE, SSL_ERROR_WANT_READ: return .blocked
        default: return .failed
        }
    }

    /// The established session's bufferevent after a WebSocket upgrade, as a TLS connection (a
    /// `wss://` one): failures read as any TLS connection's (a peer that leaves without
    /// close_notify is the end of its input, a reset is an error: evhttp's allowance for a dirty
    /// shutdown goes), close_notify on a graceful close.
    func adoptUpgraded(underlying: OpaquePointer, peer: String, on loop: EventLoop,
                       options: Connection.Options) throws(EventLoopError) -> Connection
    {
        guard let ssl = bufferevent_openssl_get_ssl(underlying) else { throw .libevent(function: "bufferevent_openssl_get_ssl") }
        bufferevent_openssl_set_allow_dirty_shutdown(underlying, 0)
        // Reading and writing were stopped for the takeover: writing goes on; reading starts
        // again with the WebSocket's reader (the adopted connection turns it off until then).
        bufferevent_enable(underlying, Int16(EV_READ | EV_WRITE))
        let layer = TLSLayer(bufferevent: underlying, ssl: ssl, session: sessionSummary(ssl))
        return try Connection.adopting(bufferevent: underlying, peer: peer, on: loop, options: options, transport: layer)
    }

    /// Lets go of the session's context keeper (libevent frees the session, and the socket,
    /// with the bufferevent right after). No close_notify: evhttp has shut the socket's output
    /// down by now. (It used to be sent here, after evhttp had closed the socket too: to a
    /// closed descriptor, or to whatever had been given that number since.)
    func release(underlying: OpaquePointer) {
        guard let ssl = bufferevent_openssl_get_ssl(underlying), let keeper = SSL_get_ex_data(ssl, 0) else { return }
        _ = SSL_set_ex_data(ssl, 0, nil)
        Unmanaged<ServerContextSet>.fromOpaque(keeper).release()
    }
}
