import MainspringCore

/// Why a TLS connect failed (`Connection.connect(to:port:on:options:tls:serverName:)`): the
/// connection under TLS was not made, or its handshake did not end in a session.
///
/// A failure of an established TLS connection is not this: it closes the connection, with
/// `Connection.CloseReason.tls` (a record that did not decrypt), or — as over plain TCP — the
/// end of the input or `.error(errno)` when the peer goes away. A server's failed handshakes
/// throw nothing anywhere: they are counted in ``TLSServerContext/statistics``.
public enum TLSError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The handshake failed: `reason` is OpenSSL's account, naming the certificate check that
    /// failed when one did ("the server's certificate did not verify: unable to get local issuer
    /// certificate", "wrong version number"), or says what ended it: the handshake timeout ("the
    /// handshake did not finish within 3.0 seconds"), a peer that closed during it. The
    /// connection is closed.
    case handshakeFailed(reason: String)
    /// The connection TLS was to run over was not made: the connect's `EventLoopError` (a name
    /// that did not resolve, every address refused, an invalid address) or the loop's
    /// (`.loopClosed`).
    case connect(EventLoopError)
    /// The task was cancelled before the handshake ended: the connection was closed, not
    /// handed over (the connect and the handshake run to their end, within their timeouts,
    /// before the cancellation is seen).
    case cancelled

    public var description: String {
        switch self {
        case .handshakeFailed(let reason): return "TLS handshake failed: \(reason)"
        case .connect(let error): return error.description
        case .cancelled: return "cancelled: the waiting task was cancelled; the TLS connection was closed"
        }
    }
}
