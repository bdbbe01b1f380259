/// Every TLS failure, wherever it is reported: the one TLS error of the library.
///
/// - A TLS connect (`MainspringTLS`'s `Connection.connect(to:port:on:options:tls:serverName:)`,
///   and any ``ClientConnectionSecurity``) throws it: the connection under TLS was not made
///   (``connect(_:)``), its handshake did not end in a session (``handshakeFailed(reason:)``),
///   or the task was cancelled (``cancelled``).
/// - An established connection whose TLS layer fails closes with
///   ``Connection/CloseReason/tlsFailed(_:)`` carrying ``protocolError(reason:)``.
/// - `MainspringHTTP` carries it in `HTTPClientError.tlsFailed(host:port:_:)` and
///   `WebSocketError.tlsFailed(_:)`.
///
/// A peer that goes away is not a TLS failure: as over plain TCP, a socket that ends (with or
/// without close_notify) is the end of the input, and one that fails (a reset) is
/// ``Connection/CloseReason/error(_:)``. A server's failed handshakes throw nothing anywhere:
/// they are counted in `TLSServerContext.statistics` (`MainspringTLS`).
///
/// The type lives in `MainspringCore` so that a connection's close reason can carry it without
/// the core linking OpenSSL; `MainspringTLS` names it too.
public enum TLSError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The handshake failed: `reason` is OpenSSL's account, naming the certificate check that
    /// failed when one did ("the server's certificate did not verify: unable to get local issuer
    /// certificate", "wrong version number"), or says what ended it: the handshake timeout ("the
    /// handshake did not finish within 3.0 seconds"), a peer that closed during it. The
    /// connection is closed.
    case handshakeFailed(reason: String)
    /// The connection TLS was to run over was not made: the connect's ``EventLoopError`` (a name
    /// that did not resolve, every address refused, an invalid address) or the loop's
    /// (`.loopClosed`).
    case connect(EventLoopError)
    /// The task was cancelled before the handshake ended: the connection was closed, not
    /// handed over (the connect and the handshake run to their end, within their timeouts,
    /// before the cancellation is seen).
    case cancelled
    /// An established connection's TLS failed: a record that did not decrypt or authenticate,
    /// an alert from the peer, a renegotiation refused. `reason` is OpenSSL's account. The
    /// connection is closed (``Connection/CloseReason/tlsFailed(_:)``).
    case protocolError(reason: String)

    public var description: String {
        switch self {
        case .handshakeFailed(let reason): return "TLS handshake failed: \(reason)"
        case .connect(let error): return error.description
        case .cancelled: return "cancelled: the waiting task was cancelled; the TLS connection was closed"
        case .protocolError(let reason): return "TLS: \(reason)"
        }
    }
}
