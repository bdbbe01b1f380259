#if canImport(Glibc)
import Glibc
#endif
import MainspringCore

/// Where PEM data comes from: a file (read when a context is made, and again on `reload()`),
/// or bytes in memory.
public enum TLSSource: Sendable, Equatable, CustomStringConvertible {
    case file(String)
    case pem([UInt8])

    /// PEM text.
    public static func pem(_ text: String) -> TLSSource { .pem(Array(text.utf8)) }

    public var description: String {
        switch self {
        case .file(let path): return "file '\(path)'"
        case .pem(let bytes): return "PEM data (\(bytes.count) bytes)"
        }
    }
}

/// A certificate chain (the leaf first, then its intermediates) and its private key.
public struct TLSCertificate: Sendable, Equatable {
    public var chain: TLSSource
    public var privateKey: TLSSource
    /// The server names (SNI) this certificate is chosen for on a listener with several (exact
    /// names, or `*.example.com` for one label); empty: only as the default (the first of a
    /// configuration's certificates).
    public var serverNames: [String]

    public init(chain: TLSSource, privateKey: TLSSource, serverNames: [String] = []) {
        self.chain = chain
        self.privateKey = privateKey
        self.serverNames = serverNames
    }

    /// A chain and a key in PEM files.
    public init(certificateFile: String, keyFile: String, serverNames: [String] = []) {
        self.init(chain: .file(certificateFile), privateKey: .file(keyFile), serverNames: serverNames)
    }
}

/// A TLS protocol version.
public enum TLSVersion: Int, Sendable, Comparable, CustomStringConvertible {
    case tls12 = 0x0303
    case tls13 = 0x0304

    public static func < (lhs: TLSVersion, rhs: TLSVersion) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { self == .tls12 ? "TLSv1.2" : "TLSv1.3" }
}

/// Which cipher suites TLS 1.2 may agree on, on a server or a client. TLS 1.3's suites
/// (AES-GCM and ChaCha20-Poly1305, every one with forward secrecy) are OpenSSL's defaults under
/// every policy.
public enum TLSCipherPolicy: Sendable, Equatable, CustomStringConvertible {
    /// AEAD suites with forward secrecy only: Mozilla's "intermediate" profile — ECDHE key
    /// exchange (and DHE, with an RSA certificate) with AES-GCM or ChaCha20-Poly1305. Every
    /// client of the last ten years has some of them (Firefox 27, Chrome 31, Android 4.4.2,
    /// Java 8, IE 11 on Windows 7, Safari 9, OpenSSL 1.0.1). The default.
    case intermediate
    /// OpenSSL's own default list for TLS 1.2 (as the system's OpenSSL configuration has it),
    /// for a legacy peer that has none of `.intermediate`'s suites.
    ///
    /// **Dangerous.** It adds CBC-mode suites, whose MAC-then-encrypt records have given
    /// timing and padding oracles that recover plaintext (Lucky Thirteen, padding-oracle
    /// attacks on implementations), and suites with RSA key exchange, which have no forward
    /// secrecy: whoever obtains the server's private key later — a stolen backup, a seized
    /// server — decrypts every session recorded before. Scanners (testssl.sh, SSL Labs) report
    /// a server that offers them. Use it only for a peer you cannot upgrade, on a context of
    /// its own, never as a service's default.
    case insecureLegacyCompatibility

    public var description: String {
        switch self {
        case .intermediate: return "intermediate"
        case .insecureLegacyCompatibility: return "insecureLegacyCompatibility"
        }
    }
}

/// The certificates a peer's certificate is checked against.
public enum TLSTrustRoots: Sendable, Equatable {
    /// The system's store (Debian: `/etc/ssl/certs`, from `ca-certificates`).
    case system
    /// A PEM file of CA certificates.
    case file(String)
    /// A directory of hashed CA certificates (`openssl rehash`).
    case directory(String)
    /// CA certificates as PEM bytes.
    case pem([UInt8])
}

/// How a server treats client certificates (mutual TLS).
public enum TLSClientAuthentication: Sendable, Equatable {
    /// Not asked for.
    case none
    /// Asked for; a client without one is accepted, one with a certificate that does not verify
    /// against `trustRoots` is refused.
    case optional(trustRoots: TLSTrustRoots)
    /// Required: a client without a certificate that verifies against `trustRoots` is refused.
    case required(trustRoots: TLSTrustRoots)
}

/// What a client checks about the server it connects to. Everything, by default.
public enum TLSServerVerification: Sendable, Equatable {
    /// The chain against the trust roots, the validity dates, and the name asked for
    /// (`serverName`, or the host connected to) against the certificate's names.
    case full
    /// The chain and dates, but not the name. For a server whose name is not in its certificate
    /// (connecting by an address the certificate does not list).
    case chainOnly
    /// Nothing: any certificate, from anyone, is accepted. The connection is encrypted but not
    /// authenticated — an attacker in the middle sees everything. For tests against throwaway
    /// certificates only.
    case insecureNoVerification
}

/// A TLS server's settings: its certificates, the versions and protocols it accepts, client
/// certificates, and how long a handshake may take.
public struct TLSServerConfiguration: Sendable, Equatable {
    /// The certificates, the default first; with several, a client's server name (SNI) picks
    /// the one whose `serverNames` match it.
    public var certificates: [TLSCertificate]
    /// The oldest protocol version accepted. Default TLS 1.2 (TLS 1.3 is preferred when both
    /// sides have it).
    public var minimumVersion: TLSVersion
    /// ALPN protocols the server speaks, in its order of preference (`["h2", "http/1.1"]`).
    /// Empty: no ALPN. A client that offers none of them is served without a protocol.
    public var applicationProtocols: [String]
    /// Client certificates (mutual TLS). Default: not asked for.
    public var clientAuthentication: TLSClientAuthentication
    /// A handshake that has not finished this long after the connection was accepted ends it
    /// (a client that stops mid-handshake). A period; default 10 s.
    public var handshakeTimeout: Duration
    /// The TLS 1.2 cipher suites offered. Default `.intermediate`: AEAD suites with forward
    /// secrecy only. Read `TLSCipherPolicy.insecureLegacyCompatibility` before widening it.
    public var cipherPolicy: TLSCipherPolicy

    public init(certificates: [TLSCertificate], minimumVersion: TLSVersion = .tls12, applicationProtocols: [String] = [],
                clientAuthentication: TLSClientAuthentication = .none, handshakeTimeout: Duration = .seconds(10),
                cipherPolicy: TLSCipherPolicy = .intermediate)
    {
        self.certificates = certificates
        self.minimumVersion = minimumVersion
        self.applicationProtocols = applicationProtocols
        self.clientAuthentication = clientAuthentication
        self.handshakeTimeout = handshakeTimeout
        self.cipherPolicy = cipherPolicy
    }

    /// One certificate chain and key, from PEM files.
    public init(certificateFile: String, keyFile: String) {
        self.init(certificates: [TLSCertificate(certificateFile: certificateFile, keyFile: keyFile)])
    }
}

/// A TLS client's settings: what it trusts and checks, what it offers.
public struct TLSClientConfiguration: Sendable, Equatable {
    /// What the server's certificate is checked against. Default: the system's store.
    public var trustRoots: TLSTrustRoots
    /// What is checked about the server. Default: everything (`.full`).
    public var verification: TLSServerVerification
    /// The oldest protocol version accepted. Default TLS 1.2.
    public var minimumVersion: TLSVersion
    /// ALPN protocols offered, in preference order. Empty: none.
    public var applicationProtocols: [String]
    /// A client certificate, for servers that ask for one (mutual TLS).
    public var certificate: TLSCertificate?
    /// A handshake that has not finished this long after the TCP connection ends it. A period;
    /// default 10 s.
    public var handshakeTimeout: Duration
    /// The TLS 1.2 cipher suites offered. Default `.intermediate`: AEAD suites with forward
    /// secrecy only (a server with nothing else is refused). Read
    /// `TLSCipherPolicy.insecureLegacyCompatibility` before widening it.
    public var cipherPolicy: TLSCipherPolicy

    public init(trustRoots: TLSTrustRoots = .system, verification: TLSServerVerification = .full,
                minimumVersion: TLSVersion = .tls12, applicationProtocols: [String] = [],
                certificate: TLSCertificate? = nil, handshakeTimeout: Duration = .seconds(10),
                cipherPolicy: TLSCipherPolicy = .intermediate)
    {
        self.trustRoots = trustRoots
        self.verification = verification
        self.minimumVersion = minimumVersion
        self.applicationProtocols = applicationProtocols
        self.certificate = certificate
        self.handshakeTimeout = handshakeTimeout
        self.cipherPolicy = cipherPolicy
    }
}

/// Why a TLS context could not be made: which part, from where, and OpenSSL's account.
public struct TLSConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What was being loaded or checked ("certificate chain", "private key", "trust roots", …).
    public var what: String
    /// Where it came from (a file's path, or "PEM data").
    public var source: String
    /// Why it failed.
    public var reason: String

    public init(what: String, source: String, reason: String) {
        self.what = what
        self.source = source
        self.reason = reason
    }

    public var description: String { "TLS \(what) from \(source): \(reason)" }
}
