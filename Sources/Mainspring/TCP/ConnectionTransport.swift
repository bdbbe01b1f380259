/// A layer that a package module puts between a connection and its socket — TLS
/// (`MainspringTLS`) — seen by the connection only through these calls. The layer makes the
/// connection's bufferevent (`Connection.adopting(bufferevent:…)`), and the connection tells it
/// about failures and the graceful end. Loop thread only.
/// What a transport's failure means for the connection (`ConnectionTransport.interpretFailure`).
package enum TransportFailure {
    /// The connection closes with this reason.
    case closed(Connection.CloseReason)
    /// Not a failure: the peer ended its input (as an end of file would).
    case endOfInput
    /// The socket's own error: `.error(errno)`.
    case socketError
}

package protocol ConnectionTransport: AnyObject {
    /// What a failure that the bufferevent reported (`BEV_EVENT_ERROR`) with `errno` (0 when
    /// none) means: the layer's own account (OpenSSL's reason text), the plain end of the peer's
    /// input (a TLS peer that closed without close_notify), or `.error(errno)`.
    func interpretFailure(errno: Int32) -> TransportFailure

    /// The connection's output ends — it closes gracefully, or half-closes (`shutdownOutput()`),
    /// its output sent: the layer's last words (TLS's close_notify). May come twice (a
    /// half-close, then the close). Not called when it closes for another reason.
    func willClose()

    /// Writes `bytes` to the peer now, past the bufferevent's output buffer, which is empty (so
    /// the order of the bytes is kept): a reply then costs no buffer chain, no write event added
    /// and deleted (two `epoll_ctl`), and no poll for it. Returns how many of them the layer
    /// took: written, or put into the bufferevent's output buffer by the layer itself when a
    /// write it started must be finished there (a TLS record the socket did not take whole,
    /// which OpenSSL continues from the same bytes). The connection appends the rest to the
    /// buffer as usual (all of them for 0); a failure is the bufferevent's to report, as for
    /// any write it makes.
    func writeNow(_ bytes: [UInt8]) -> Int

    /// What users may read about the connection's layer (a TLS session's protocol, cipher,
    /// peer certificate), once established. Any thread.
    var details: (any Sendable)? { get }
}

extension Connection {
    /// A connection over a bufferevent that a package module made on `loop` (its TLS layer,
    /// say), established already; `transport` is told about its failures and graceful close.
    /// Loop thread only; the bufferevent must have been made on `loop`'s base. On a simulated
    /// loop, `simulatedLayer` is the stream end under the layer's filter (its writes, timeouts
    /// and close reach the simulation's network through it).
    /// - Throws: `.wrongThread`.
    package static func adopting(bufferevent: OpaquePointer, peer: String, on loop: EventLoop,
                                 options: Options, transport: any ConnectionTransport,
                                 simulatedLayer: SimulatedLayerSocket? = nil) throws(EventLoopError) -> Connection
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Connection.adopting(bufferevent:…)") }
        let source = ConnectionSource(loop: loop, adopting: bufferevent, peer: peer, options: options, transport: transport,
                                      simulatedLayer: simulatedLayer)
        return Connection(source: source)
    }

    /// The layer's details (`ConnectionTransport.details`), if the connection has a layer. Any
    /// thread.
    package var transportDetails: (any Sendable)? { source.transportDetails }

    /// The application protocol the layer agreed on with the peer (TLS's ALPN: `h2`,
    /// `http/1.1`), nil without one. Any thread.
    package var negotiatedApplicationProtocol: String? {
        (source.transportDetails as? any ApplicationProtocolDetails)?.applicationProtocol
    }
}

/// A layer's details that name the application protocol agreed on (MainspringTLS's
/// `TLSSession`): how HTTP learns of ALPN without depending on TLS.
package protocol ApplicationProtocolDetails: Sendable {
    var applicationProtocol: String? { get }
}
