import MainspringCore
import Synchronization

/// A TLS server's certificates and settings, made once from a `TLSServerConfiguration` and
/// shared by every listener (and HTTPS server) that uses it, on any loop.
///
/// `reload()` reads the certificate and key files again and swaps them in for new handshakes;
/// connections already established, and handshakes in progress, keep what they started with.
/// A reload that fails (a file missing, a key that does not match) throws and keeps the
/// current certificates. Any thread; reading is one lock and a reference count.
public final class TLSServerContext: Sendable {
    private let current: Protected<ServerContextSet>
    let counters = HandshakeCounters()

    /// Builds the contexts, reading the files now.
    /// - Throws: `TLSConfigurationError` naming what failed (an unreadable file, a bad PEM, a key
    ///   that does not match its certificate, unreadable trust roots).
    public init(configuration: TLSServerConfiguration) throws(TLSConfigurationError) {
        current = Protected(try ServerContextSet.make(configuration))
    }

    /// The configuration in force.
    public var configuration: TLSServerConfiguration { current.withLock { $0.configuration } }

    /// Reads the configuration's files again (a renewed certificate) and uses them for new
    /// handshakes. On failure the current certificates stay.
    public func reload() throws(TLSConfigurationError) {
        try reload(configuration: configuration)
    }

    /// Switches to `configuration` for new handshakes. On failure the current one stays.
    public func reload(configuration: TLSServerConfiguration) throws(TLSConfigurationError) {
        let made = try ServerContextSet.make(configuration)
        let previous = current.withLock { state in
            defer { state = made }
            return state
        }
        _ = previous  // released after the lock
    }

    /// The contexts for a new handshake.
    var contexts: ServerContextSet { current.withLock { $0 } }
}

/// A TLS client's trust roots and settings, made once from a `TLSClientConfiguration` and
/// shared by every connect that uses it. Any thread.
public final class TLSClientContext: Sendable {
    let handle: SSLContextHandle
    /// The configuration it was made from.
    public let configuration: TLSClientConfiguration

    /// Builds the context, reading its files now.
    /// - Throws: `TLSConfigurationError` naming what failed.
    public init(configuration: TLSClientConfiguration = .init()) throws(TLSConfigurationError) {
        handle = try ServerContextSet.makeClient(configuration)
        self.configuration = configuration
    }
}
