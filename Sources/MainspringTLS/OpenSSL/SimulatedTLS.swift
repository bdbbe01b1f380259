// TLS over a simulation's network (`MainspringTesting`): real OpenSSL sessions over simulated
// bytes. A simulated stream has no socket, so libevent's OpenSSL *filter* runs the session over
// the stream's bufferevent (`SimulatedLayerSocket`, which the network drives as it drives a
// connection's socket); the established filter becomes the connection's bufferevent, with the
// same `TLSLayer` a real TLS connection has. What differs from a socket: the handshake runs in
// the filter's callbacks as the network delivers its bytes (on virtual time, so its steps cost
// none), not as `.normal` work a step at a time. What the layer wrote and the network had not
// taken when the connection closes (a close_notify) is still sent, as a kernel sends a closed
// socket's buffer.
internal import CMainspringTLS
internal import CLibevent
@_spi(MainspringHTTP) import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// One handshake over a simulated stream: the filter made over the stream's bufferevent runs
/// it; `completion` hears once, with the established layer and filter, or why it failed (the
/// filter and the stream are then closed). Loop thread only.
final class SimulatedTLSHandshake {
    private let loop: EventLoop
    private let session: SSLSession
    private let layerSocket: SimulatedLayerSocket
    private let timeout: Duration
    private var filter: OpaquePointer?
    private var ssl: OpaquePointer?
    private var timer: TimerHandle?
    /// Closed with the simulated program that the handshake is for (a source it owns, as the
    /// timer is): the handshake then fails at once, as a process's sockets close when it ends.
    private var programWatch: LoopAttachment?
    private var completion: ((TLSHandshake.Outcome) -> Void)?
    /// The handshake keeps itself alive while it runs (libevent holds only an unretained pointer).
    private var running: SimulatedTLSHandshake?

    init(loop: EventLoop, session: SSLSession, layerSocket: SimulatedLayerSocket, timeout: Duration,
         completion: @escaping (TLSHandshake.Outcome) -> Void)
    {
        self.loop = loop
        self.session = session
        self.layerSocket = layerSocket
        self.timeout = timeout
        self.completion = completion
    }

    func start() {
        running = self
        guard let ssl = session.takeSSL() else {
            layerSocket.discard()
            return end(.failed("the session is gone"))
        }
        let state = session.isServer ? BUFFEREVENT_SSL_ACCEPTING : BUFFEREVENT_SSL_CONNECTING
        guard let filter = bufferevent_openssl_filter_new(loop.eventBasePointer, layerSocket.bufferevent, ssl, state,
                                                         Int32(BEV_OPT_CLOSE_ON_FREE.rawValue))
        else {
            // Out of memory only. libevent's own error path may have freed the stream's
            // bufferevent already: it is left alone (a leak, not a double free); the session is
            // still ours.
            SSL_free(ssl)
            layerSocket.closing()
            return end(.failed("libevent could not make the TLS filter"))
        }
        self.filter = filter
        self.ssl = ssl
        // As on a socket (`SSLSession.makeBufferevent`): `TLSLayer.writeNow` relies on it.
        ms_ssl_accept_moving_write_buffer(ssl)
        bufferevent_setcb(filter, nil, nil, simulatedHandshakeEvent, Unmanaged.passUnretained(self).toOpaque())
        bufferevent_enable(filter, Int16(EV_READ | EV_WRITE))
        timer = loop.schedule(after: timeout) { [weak self] in
            guard let self else { return }
            self.fail("the handshake did not finish within \(self.timeout)")
        }
        // A program's handshake (the caller binds `SimulatedOwnership.current`) is one of its
        // sources: when the program ends, this closes and the stream with it.
        programWatch = LoopAttachment(loop: loop) { [weak self] in
            self?.fail("the program ended during the handshake")
        }
        // The network delivers from now on (to the filter's callbacks); a client sends its
        // first flight.
        layerSocket.attach()
        layerSocket.changed()
        if !session.isServer { layerSocket.startWriting() }
    }

    /// The filter's event: established, or failed.
    fileprivate func filterEvent(_ what: Int16, errno code: Int32) {
        guard completion != nil, let filter, let ssl else { return }
        if Int32(what) & BEV_EVENT_CONNECTED != 0 {
            let summary = sessionSummary(ssl)
            bufferevent_setcb(filter, nil, nil, nil, nil)
            self.filter = nil
            self.ssl = nil
            end(.established(TLSLayer(bufferevent: filter, ssl: ssl, session: summary), bufferevent: filter))
            return
        }
        var codes: [UInt] = []
        while true {
            let entry = bufferevent_get_openssl_error(filter)
            if entry == 0 { break }
            codes.append(entry)
        }
        let errors = OpenSSLErrors(codes: codes.filter { ms_err_library($0) != 0 })
        // libevent's filter reports the end of its input as an error: what the network told it
        // says which (the peer closed, or the stream failed with its errno), as a socket's
        // failed read would.
        if errors.isEmpty, let reported = layerSocket.reportedEnd {
            return fail(handshakeFailureReason(ssl, isServer: session.isServer, errors: errors, code: SSL_ERROR_SYSCALL,
                                               errno: reported.endOfFile ? 0 : reported.errno))
        }
        fail(handshakeFailureReason(ssl, isServer: session.isServer, errors: errors, code: SSL_ERROR_SSL, errno: code))
    }

    /// Ends a handshake that failed: the stream closes (the network hears it first), the filter
    /// and the session are freed.
    private func fail(_ reason: String) {
        guard completion != nil else { return }
        if let filter {
            bufferevent_setcb(filter, nil, nil, nil, nil)
            layerSocket.closing()
            freeBufferevent(filter)  // the session and the stream's bufferevent go with it
            self.filter = nil
            self.ssl = nil
        }
        end(.failed(reason))
    }

    private func end(_ outcome: TLSHandshake.Outcome) {
        guard let completion else { return }
        self.completion = nil
        timer?.cancel()
        timer = nil
        programWatch?.close()
        programWatch = nil
        completion(outcome)
        running = nil
    }
}

/// The filter's event callback during a simulated handshake (inside libevent, on the loop's
/// thread): hands it to the handshake.
private let simulatedHandshakeEvent: bufferevent_event_cb = { _, what, argument in
    let code = errno
    Unmanaged<SimulatedTLSHandshake>.fromOpaque(argument!).takeUnretainedValue().filterEvent(what, errno: code)
}
