import Foundation
import MainspringCore

/// What was agreed in a TLS handshake, and who the peer is. Read it from an established
/// connection: `connection.tls`.
public struct TLSSession: Sendable, Equatable, CustomStringConvertible {
    /// The protocol version ("TLSv1.3", "TLSv1.2").
    public let version: String
    /// The cipher suite (OpenSSL's name: "TLS_AES_256_GCM_SHA384").
    public let cipher: String
    /// The ALPN protocol agreed on, if any.
    public let applicationProtocol: String?
    /// The server name the client asked for (SNI), if it sent one.
    public let serverName: String?
    /// The peer's certificate: the server's (on a client), the client's (on a server that asked
    /// for one), or nil.
    public let peerCertificate: TLSCertificateSummary?

    public var description: String {
        "\(version) \(cipher)" + (applicationProtocol.map { " ALPN \($0)" } ?? "")
            + (peerCertificate.map { ", peer \($0.subject)" } ?? "")
    }
}

/// The parts of a certificate a program usually looks at.
public struct TLSCertificateSummary: Sendable, Equatable {
    /// The subject, RFC 2253 style ("CN=localhost,O=Mainspring tests").
    public let subject: String
    /// The issuer, likewise.
    public let issuer: String
    /// The subject alternative names: DNS names and IP addresses.
    public let subjectAlternativeNames: [String]
    /// When it expires.
    public let notAfter: Date?
    /// Whether it verified against the trust roots (false only where verification is off or
    /// optional client authentication let an unverified certificate through).
    public let isVerified: Bool
}

extension Connection {
    /// The TLS session of a connection made by `MainspringTLS` (a TLS listener, or a TLS
    /// connect), nil for a plain one. Any thread; fixed once the connection exists.
    public var tls: TLSSession? { transportDetails as? TLSSession }
}

extension TLSSession: ApplicationProtocolDetails {}
