internal import CMainspringTLS
internal import CLibevent
import Foundation
@_spi(MainspringHTTP) import MainspringCore

/// One TLS session (an `SSL`) on a socket, while its handshake runs — driven a step at a time
/// by `TLSHandshake` — then handed to a libevent OpenSSL bufferevent. Loop thread only.
final class SSLSession {
    /// Nil once the bufferevent owns it (or it was freed).
    private var raw: OpaquePointer?
    let fd: Int32
    let isServer: Bool
    /// The contexts the session was made from, kept alive while OpenSSL's callbacks (SNI, ALPN)
    /// may still read them.
    private let keepAlive: AnyObject

    /// What one step of the handshake ended with.
    enum Step {
        case done
        case wantRead
        case wantWrite
        case failed(String)
    }

    /// A server session on an accepted socket (`fd` -1: on a simulated stream).
    init?(server contexts: ServerContextSet, fd: Int32) {
        ERR_clear_error()
        guard let ssl = SSL_new(contexts.defaultContext.raw) else { return nil }
        // -1: no socket; a filter over a simulated stream gives it its BIO (`SimulatedTLSHandshake`).
        guard fd < 0 || SSL_set_fd(ssl, fd) == 1 else {
            SSL_free(ssl)
            return nil
        }
        SSL_set_accept_state(ssl)
        self.raw = ssl
        self.fd = fd
        self.isServer = true
        self.keepAlive = contexts
    }

    /// A client session on a connected socket (`fd` -1: on a simulated stream), for
    /// `serverName` (sent as SNI when it is a name, and checked against the certificate unless
    /// `verification` says otherwise).
    init?(client context: SSLContextHandle, fd: Int32, serverName: String, verification: TLSServerVerification) {
        ERR_clear_error()
        guard let ssl = SSL_new(context.raw) else { return nil }
        // -1: no socket; a filter over a simulated stream gives it its BIO (`SimulatedTLSHandshake`).
        guard fd < 0 || SSL_set_fd(ssl, fd) == 1 else {
            SSL_free(ssl)
            return nil
        }
        SSL_set_connect_state(ssl)
        let isAddress = serverName.contains(":") || serverName.allSatisfy { $0.isNumber || $0 == "." }
        if !isAddress { _ = ms_ssl_set_server_name(ssl, serverName) }
        if verification == .full {
            if isAddress {
                _ = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName)
            } else {
                _ = SSL_set1_host(ssl, serverName)
            }
        }
        self.raw = ssl
        self.fd = fd
        self.isServer = false
        self.keepAlive = context
    }

    deinit { if let raw { SSL_free(raw) } }

    /// Runs the handshake as far as it can go without waiting for the socket.
    func step() -> Step {
        guard let ssl = raw else { return .failed("the session is gone") }
        ERR_clear_error()
        errno = 0
        let rc = SSL_do_handshake(ssl)
        if rc == 1 { return .done }
        let failedErrno = errno
        let code = SSL_get_error(ssl, rc)
        switch code {
        case SSL_ERROR_WANT_READ: return .wantRead
        case SSL_ERROR_WANT_WRITE: return .wantWrite
        default: return .failed(failureReason(ssl, code: code, errno: failedErrno))
        }
    }

    /// Why the handshake failed, once, in words: the peer's close, the certificate check that
    /// failed, OpenSSL's reasons, or `SSL_get_error`'s condition when OpenSSL gave no reason.
    private func failureReason(_ ssl: OpaquePointer, code: Int32, errno: Int32) -> String {
        handshakeFailureReason(ssl, isServer: isServer, errors: OpenSSLErrors.take(), code: code, errno: errno)
    }

    /// Takes the session over (a simulated stream's filter owns it from now on), or nil if it
    /// is gone.
    func takeSSL() -> OpaquePointer? {
        defer { raw = nil }
        return raw
    }

    /// The established session's details.
    func summary() -> TLSSession {
        guard let ssl = raw else { return TLSSession(version: "", cipher: "", applicationProtocol: nil, serverName: nil, peerCertificate: nil) }
        return sessionSummary(ssl)
    }

    /// Hands the session to a libevent OpenSSL bufferevent on `loop`'s base (which then owns the
    /// session and the socket: freeing it frees both). Nil if libevent refuses (the session is
    /// freed then; the socket is still the caller's).
    func makeBufferevent(on loop: EventLoop) -> (bufferevent: OpaquePointer, ssl: OpaquePointer)? {
        guard let ssl = raw else { return nil }
        guard let bev = bufferevent_openssl_socket_new(loop.eventBasePointer, fd, ssl, BUFFEREVENT_SSL_OPEN,
                                                       Int32(BEV_OPT_CLOSE_ON_FREE.rawValue))
        else {
            return nil
        }
        raw = nil
        // libevent sets it too: a write that blocked is finished from its buffer's copy of the
        // bytes (`TLSLayer.writeNow` relies on it).
        ms_ssl_accept_moving_write_buffer(ssl)
        // A peer that closes its socket without close_notify is told apart from a reset by
        // the layer (`TLSLayer.interpretFailure`): libevent's own allowance would take a reset
        // for a clean end too.
        return (bev, ssl)
    }
}

/// An established session's details: protocol, cipher, ALPN, SNI, the peer's certificate.
func sessionSummary(_ ssl: OpaquePointer) -> TLSSession {
    let version = String(cString: SSL_get_version(ssl))
    let cipher = SSL_get_current_cipher(ssl).flatMap { SSL_CIPHER_get_name($0) }.map { String(cString: $0) } ?? ""
    var alpnData: UnsafePointer<UInt8>?
    var alpnLength: UInt32 = 0
    SSL_get0_alpn_selected(ssl, &alpnData, &alpnLength)
    let alpn = alpnData.map { String(decoding: UnsafeBufferPointer(start: $0, count: Int(alpnLength)), as: UTF8.self) }
    let serverName = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name).map { String(cString: $0) }
    var peer: TLSCertificateSummary?
    if let certificate = SSL_get1_peer_certificate(ssl) {
        defer { X509_free(certificate) }
        peer = summarize(certificate, verified: SSL_get_verify_result(ssl) == X509_V_OK)
    }
    return TLSSession(version: version, cipher: cipher, applicationProtocol: alpn.flatMap { $0.isEmpty ? nil : $0 },
                      serverName: serverName, peerCertificate: peer)
}

/// The summary of a certificate: subject, issuer, names, expiry.
private func summarize(_ certificate: OpaquePointer, verified: Bool) -> TLSCertificateSummary {
    func name(_ value: OpaquePointer?) -> String {
        guard let value, let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        _ = X509_NAME_print_ex(bio, value, 0, ms_xn_flag_rfc2253)
        var pointer: UnsafeMutablePointer<CChar>?
        let length = BIO_ctrl(bio, BIO_CTRL_INFO, 0, &pointer)
        guard let pointer, length > 0 else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: length), as: UTF8.self)
    }
    var names: [String] = []
    if let raw = X509_get_ext_d2i(certificate, NID_subject_alt_name, nil, nil) {
        let list = OpaquePointer(raw)
        defer { ms_general_names_free(list) }
        for index in 0..<ms_general_names_count(list) {
            guard let entry = ms_general_name_at(list, index) else { continue }
            if let dns = ms_general_name_dns(entry), let data = ASN1_STRING_get0_data(dns) {
                names.append(String(decoding: UnsafeBufferPointer(start: data, count: Int(ASN1_STRING_length(dns))), as: UTF8.self))
            } else if let ip = ms_general_name_ip(entry), let data = ASN1_STRING_get0_data(ip) {
                let bytes = Array(UnsafeBufferPointer(start: data, count: Int(ASN1_STRING_length(ip))))
                if bytes.count == 4 {
                    names.append(bytes.map(String.init).joined(separator: "."))
                } else if bytes.count == 16 {
                    names.append(stride(from: 0, to: 16, by: 2).map { String(format: "%x", Int(bytes[$0]) << 8 | Int(bytes[$0 + 1])) }
                        .joined(separator: ":"))
                }
            }
        }
    }
    var expiry: Date?
    if let notAfter = X509_get0_notAfter(certificate) {
        var parts = tm()
        if ASN1_TIME_to_tm(notAfter, &parts) == 1 { expiry = Date(timeIntervalSince1970: TimeInterval(timegm(&parts))) }
    }
    return TLSCertificateSummary(subject: name(X509_get_subject_name(certificate)), issuer: name(X509_get_issuer_name(certificate)),
                                 subjectAlternativeNames: names, notAfter: expiry, isVerified: verified)
}

/// The TLS layer of an established connection (`ConnectionTransport`): OpenSSL's account of a
/// failure, close_notify on a graceful close, the session's details. Its pointers belong to the
/// connection's bufferevent, which outlives every call made to the layer.
final class TLSLayer: ConnectionTransport {
    private let bufferevent: OpaquePointer
    private let ssl: OpaquePointer
    let session: TLSSession

    init(bufferevent: OpaquePointer, ssl: OpaquePointer, session: TLSSession) {
        self.bufferevent = bufferevent
        self.ssl = ssl
        self.session = session
    }

    var details: (any Sendable)? { session }

    func interpretFailure(errno code: Int32) -> TransportFailure {
        // libevent's list: `SSL_get_error`'s code for the failed read or write (1 for
        // SSL_ERROR_SSL, 5 for SSL_ERROR_SYSCALL; no OpenSSL error has library 0), then
        // OpenSSL's queue — handed back last first.
        var entries: [UInt] = []
        while true {
            let entry = bufferevent_get_openssl_error(bufferevent)
            if entry == 0 { break }
            entries.insert(entry, at: 0)
        }
        // Nothing from TLS: the socket ended (errno 0: the peer closed it without close_notify,
        // which HTTP/1.1 clients and line protocols do — an end of input) or failed (a reset).
        guard let first = entries.first else { return code == 0 ? .endOfInput : .socketError }
        let errors = OpenSSLErrors(codes: entries.filter { ms_err_library($0) != 0 })
        // A peer that went away is reported as it is over plain TCP, so that "the client left"
        // reads the same whatever the transport: a socket that ended without close_notify
        // (OpenSSL 3: "unexpected eof while reading") is the end of the input, a socket that
        // failed (a reset, a broken pipe) is `.error(errno)`. What only TLS can say is `.tlsFailed`.
        if !errors.isEmpty && errors.codes.allSatisfy({ ms_err_is_unexpected_eof($0) != 0 }) { return .endOfInput }
        let systemErrnos = errors.codes.map { ms_err_system_errno($0) }
        if let systemErrno = systemErrnos.first, systemErrnos.allSatisfy({ $0 == systemErrno && $0 != 0 }) {
            return .closed(.error(systemErrno))
        }
        if !errors.isEmpty { return .closed(.tlsFailed(.protocolError(reason: errors.text))) }
        // Only `SSL_get_error`'s code: a failed system call is the socket's failure (its errno;
        // none: the socket just ended), anything else its condition in words.
        if Int32(truncatingIfNeeded: first) == SSL_ERROR_SYSCALL { return code == 0 ? .endOfInput : .closed(.error(code)) }
        return .closed(.tlsFailed(.protocolError(reason: sslErrorCondition(Int32(truncatingIfNeeded: first), errno: code))))
    }

    func willClose() {
        // close_notify: one non-blocking write to the socket; a peer already gone is no matter.
        // (Over a simulated stream the connection lifted the stream's send buffer first.)
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
        ERR_clear_error()
    }

    func writeNow(_ bytes: [UInt8]) -> Int {
        // One SSL_write of the whole batch, as libevent's own write would make it from its
        // buffer: the records go out at once, with no buffer chain, no write event added and
        // deleted, and no poll before them. Positive: all of it (libevent leaves OpenSSL's
        // partial writes off; a count short of it would leave the rest to the connection).
        let written = bytes.withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32(clamping: $0.count)) }
        if written > 0 { return Int(written) }
        // Blocked (the socket took part of a record, or none), or failed. OpenSSL finishes a
        // record it began only when given the same bytes again, in one piece of at least that
        // length; they may move (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, set in `makeBufferevent`).
        // libevent's write gives it its buffer's first piece: so the batch goes there whole,
        // and that write finishes it when the socket has room, or reports the failure, as it
        // would have. A failure's entries leave this thread's error queue, where they would make
        // the next SSL_get_error on it, any connection's, an SSL_ERROR_SSL.
        ERR_clear_error()
        let output = bufferevent_get_output(bufferevent)
        let added = bytes.withUnsafeBytes { evbuffer_add(output, $0.baseAddress, $0.count) }
        guard added == 0 else { return 0 }
        _ = evbuffer_pullup(output, bytes.count)  // one piece, even behind a chain left empty
        return bytes.count
    }
}

/// Frees a bufferevent made by `SSLSession.makeBufferevent` that no connection took over (its
/// session and socket go with it).
func freeBufferevent(_ bufferevent: OpaquePointer) { bufferevent_free(bufferevent) }

/// Why a handshake failed, once, in words: the peer's close, the certificate check that failed,
/// OpenSSL's reasons (`errors`), or `SSL_get_error`'s condition (`code`) when OpenSSL gave none.
func handshakeFailureReason(_ ssl: OpaquePointer, isServer: Bool, errors: OpenSSLErrors, code: Int32, errno: Int32) -> String {
    if errors.peerClosedWithoutCloseNotify { return peerClosedDuringHandshake }
    let verify = SSL_get_verify_result(ssl)
    if verify != X509_V_OK, let text = X509_verify_cert_error_string(verify) {
        let whose = isServer ? "the client's certificate" : "the server's certificate"
        // OpenSSL's own reason is "certificate verify failed": the check that failed says it.
        let others = errors.reasons.filter { $0 != "certificate verify failed" }
        let more = others.isEmpty ? "" : " (\(others.joined(separator: "; ")))"
        return "\(whose) did not verify: \(String(cString: text))\(more)"
    }
    if !errors.isEmpty { return "handshake failed: \(errors.text)" }
    switch code {
    case SSL_ERROR_SYSCALL where errno == 0: return peerClosedDuringHandshake
    case SSL_ERROR_ZERO_RETURN: return "the peer ended the TLS session (close_notify) during the handshake"
    default: return "handshake failed: \(sslErrorCondition(code, errno: errno))"
    }
}
