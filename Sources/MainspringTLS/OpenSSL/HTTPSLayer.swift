internal import CMainspringTLS
internal import CLibevent
import Mainspring
import MainspringHTTP

/// HTTPS for `HTTPServer`: each accepted connection's bufferevent is a libevent OpenSSL
/// bufferevent, in the accepting state, with a session from the server context's certificates
/// of the moment; the server's connection filter sits on it as on a plain socket.
///
/// Its handshakes run inside libevent's OpenSSL layer, as evhttp reads — not as scheduled loop
/// work like the handshakes of TLS listeners (`Listener(…tls:)`); evhttp offers no point between
/// accepting a socket and reading it where a handshake could be placed.
struct HTTPSLayer: HTTPConnectionLayer {
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

    func release(underlying: OpaquePointer) {
        Lingering.start(underlying)
    }
}

/// A connection the server is done with: what is buffered goes out, then close_notify, then
/// the bufferevent (with its session and socket) is freed — at most 10 s later.
private final class Lingering {
    private let bufferevent: OpaquePointer
    private var retained: Unmanaged<Lingering>?

    private init(_ bufferevent: OpaquePointer) { self.bufferevent = bufferevent }

    static func start(_ bufferevent: OpaquePointer) {
        let lingering = Lingering(bufferevent)
        let output = bufferevent_get_output(bufferevent)
        if output == nil || evbuffer_get_length(output) == 0 {
            lingering.finish()
            return
        }
        let retained = Unmanaged.passRetained(lingering)
        lingering.retained = retained
        bufferevent_setcb(bufferevent, nil, lingerWriteTrampoline, lingerEventTrampoline, retained.toOpaque())
        bufferevent_setwatermark(bufferevent, Int16(EV_WRITE), 0, 0)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        bufferevent_set_timeouts(bufferevent, nil, &timeout)
        bufferevent_disable(bufferevent, Int16(EV_READ))
        _ = bufferevent_enable(bufferevent, Int16(EV_WRITE))
    }

    /// close_notify, then free (the session's context keeper is released with the session).
    fileprivate func finish() {
        bufferevent_setcb(bufferevent, nil, nil, nil, nil)
        if let ssl = bufferevent_openssl_get_ssl(bufferevent) {
            ERR_clear_error()
            _ = SSL_shutdown(ssl)
            ERR_clear_error()
            if let keeper = SSL_get_ex_data(ssl, 0) {
                _ = SSL_set_ex_data(ssl, 0, nil)
                Unmanaged<ServerContextSet>.fromOpaque(keeper).release()
            }
        }
        bufferevent_free(bufferevent)
        retained?.release()
        retained = nil
    }
}

private let lingerWriteTrampoline: bufferevent_data_cb = { _, argument in
    guard let argument else { return }
    Unmanaged<Lingering>.fromOpaque(argument).takeUnretainedValue().finish()
}

private let lingerEventTrampoline: bufferevent_event_cb = { _, _, argument in
    guard let argument else { return }
    Unmanaged<Lingering>.fromOpaque(argument).takeUnretainedValue().finish()
}
