// Sources/MainspringTLS/OpenSSL/ is the only folder of MainspringTLS that calls OpenSSL or
// libevent's OpenSSL bufferevents, or holds their pointers: contexts (this file), sessions,
// handshakes and the established connection's layer (SSLSession.swift), OpenSSL's errors in
// words (SSLErrors.swift), the session over a simulated stream (SimulatedTLS.swift). The rest of
// the module sees typed Swift values.
internal import CMainspringTLS
import Foundation
import MainspringCore

/// One `SSL_CTX`, freed with the handle (OpenSSL counts references: sessions made from it keep
/// it alive as long as they need it).
final class SSLContextHandle: @unchecked Sendable {
    // Immutable after `init`; OpenSSL's contexts are thread-safe for making sessions.
    let raw: OpaquePointer
    /// The server names (SNI) this context answers for.
    let serverNames: [String]
    /// The ALPN protocols in wire form (length-prefixed), in preference order; stable memory,
    /// because OpenSSL's ALPN callback reads it.
    let alpn: UnsafeMutableBufferPointer<UInt8>

    init(raw: OpaquePointer, serverNames: [String], alpn protocols: [String]) {
        self.raw = raw
        self.serverNames = serverNames.map { $0.lowercased() }
        var wire: [UInt8] = []
        for name in protocols where !name.isEmpty && name.utf8.count < 256 {
            wire.append(UInt8(name.utf8.count))
            wire += name.utf8
        }
        alpn = .allocate(capacity: max(1, wire.count))
        _ = alpn.initialize(from: wire)
        alpnCount = wire.count
    }

    /// Bytes of `alpn` in use.
    let alpnCount: Int

    deinit {
        SSL_CTX_free(raw)
        alpn.deallocate()
    }

    /// Whether `name` (lowercased) is one of this context's server names (exact, or a
    /// `*.domain` pattern covering one label).
    func answers(for name: String) -> Bool {
        serverNames.contains { pattern in
            if pattern == name { return true }
            guard pattern.hasPrefix("*."), let dot = name.firstIndex(of: ".") else { return false }
            return name[dot...] == pattern.dropFirst()
        }
    }
}

/// A server's contexts: the default (the first certificate) and those chosen by SNI.
final class ServerContextSet: @unchecked Sendable {
    // Immutable after `init`.
    let contexts: [SSLContextHandle]
    let configuration: TLSServerConfiguration

    init(contexts: [SSLContextHandle], configuration: TLSServerConfiguration) {
        self.contexts = contexts
        self.configuration = configuration
        if contexts.count > 1 {
            // The default context's server-name callback switches a session to the context of
            // the name the client asked for (the callback's argument is this set, which the
            // sessions being made keep alive).
            ms_ssl_ctx_set_server_name_callback(contexts[0].raw, serverNameCallback, Unmanaged.passUnretained(self).toOpaque())
        }
    }

    var defaultContext: SSLContextHandle { contexts[0] }

    func context(forServerName name: String) -> SSLContextHandle? {
        let lowered = name.lowercased()
        return contexts.first { $0.answers(for: lowered) }
    }

    /// Builds every context of `configuration` (reading its files now).
    static func make(_ configuration: TLSServerConfiguration) throws(TLSConfigurationError) -> ServerContextSet {
        try contextBuilding.withLock { _ throws(TLSConfigurationError) in try makeOneAtATime(configuration) }
    }

    private static func makeOneAtATime(_ configuration: TLSServerConfiguration) throws(TLSConfigurationError)
        -> ServerContextSet
    {
        guard !configuration.certificates.isEmpty else {
            throw TLSConfigurationError(what: "configuration", source: "TLSServerConfiguration",
                                        reason: "a server needs at least one certificate")
        }
        _ = requirePositive(configuration.handshakeTimeout, "TLSServerConfiguration.handshakeTimeout")
        var contexts: [SSLContextHandle] = []
        for certificate in configuration.certificates {
            contexts.append(try makeServerContext(certificate, configuration))
        }
        return ServerContextSet(contexts: contexts, configuration: configuration)
    }

    private static func makeServerContext(_ certificate: TLSCertificate, _ configuration: TLSServerConfiguration)
        throws(TLSConfigurationError) -> SSLContextHandle
    {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_server_method()) else {
            throw TLSConfigurationError(what: "context", source: "OpenSSL", reason: takeOpenSSLErrors())
        }
        let handle = SSLContextHandle(raw: ctx, serverNames: certificate.serverNames,
                                      alpn: configuration.applicationProtocols)
        ms_ssl_ctx_harden(ctx)
        _ = ms_ssl_ctx_set_min_version(ctx, Int32(configuration.minimumVersion.rawValue))
        try applyCipherPolicy(configuration.cipherPolicy, to: ctx)
        // The DHE suites of the list, with an RSA certificate: an RFC 7919 group sized to its key.
        _ = ms_ssl_ctx_set_dh_auto(ctx)
        try useCertificate(certificate, in: ctx)
        // Sessions resume from the server's cache; the id context ties them to this service.
        var id = Array("mainspring".utf8)
        SSL_CTX_set_session_id_context(ctx, &id, UInt32(id.count))
        switch configuration.clientAuthentication {
        case .none:
            break
        case .optional(let roots):
            try loadTrustRoots(roots, into: ctx)
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        case .required(let roots):
            try loadTrustRoots(roots, into: ctx)
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nil)
        }
        if handle.alpnCount > 0 {
            SSL_CTX_set_alpn_select_cb(ctx, alpnSelectCallback, Unmanaged.passUnretained(handle).toOpaque())
        }
        return handle
    }

    /// Builds a client context.
    static func makeClient(_ configuration: TLSClientConfiguration) throws(TLSConfigurationError) -> SSLContextHandle {
        try contextBuilding.withLock { _ throws(TLSConfigurationError) in try makeClientOneAtATime(configuration) }
    }

    private static func makeClientOneAtATime(_ configuration: TLSClientConfiguration) throws(TLSConfigurationError)
        -> SSLContextHandle
    {
        _ = requirePositive(configuration.handshakeTimeout, "TLSClientConfiguration.handshakeTimeout")
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_client_method()) else {
            throw TLSConfigurationError(what: "context", source: "OpenSSL", reason: takeOpenSSLErrors())
        }
        let handle = SSLContextHandle(raw: ctx, serverNames: [], alpn: configuration.applicationProtocols)
        ms_ssl_ctx_harden(ctx)
        _ = ms_ssl_ctx_set_min_version(ctx, Int32(configuration.minimumVersion.rawValue))
        try applyCipherPolicy(configuration.cipherPolicy, to: ctx)
        switch configuration.verification {
        case .full, .chainOnly:
            try loadTrustRoots(configuration.trustRoots, into: ctx)
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        case .insecureNoVerification:
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nil)
        }
        if handle.alpnCount > 0 {
            guard SSL_CTX_set_alpn_protos(ctx, handle.alpn.baseAddress, UInt32(handle.alpnCount)) == 0 else {
                throw TLSConfigurationError(what: "ALPN protocols", source: "\(configuration.applicationProtocols)",
                                            reason: takeOpenSSLErrors())
            }
        }
        if let certificate = configuration.certificate { try useCertificate(certificate, in: ctx) }
        return handle
    }
}

/// Contexts are built one at a time, process-wide: OpenSSL 3.0's PEM decoders are not safe to
/// run on several threads at once (two servers made at the same moment failed to read the same
/// good key, "unsupported"). Building a context is rare and takes a millisecond or so.
private let contextBuilding = Protected(())

/// TLS 1.2's cipher suites under `.intermediate`: Mozilla's "intermediate" profile (version 5.7),
/// AEAD with forward secrecy only. TLS 1.3's are OpenSSL's defaults (`SSL_CTX_set_cipher_list`
/// does not touch them).
private let intermediateCipherList = [
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384", "DHE-RSA-CHACHA20-POLY1305",
].joined(separator: ":")

/// Restricts TLS 1.2's cipher suites to `policy`'s (`.insecureLegacyCompatibility` leaves
/// OpenSSL's default list).
private func applyCipherPolicy(_ policy: TLSCipherPolicy, to ctx: OpaquePointer) throws(TLSConfigurationError) {
    switch policy {
    case .intermediate:
        guard SSL_CTX_set_cipher_list(ctx, intermediateCipherList) == 1 else {
            throw TLSConfigurationError(what: "cipher suites", source: "TLSCipherPolicy.intermediate",
                                        reason: takeOpenSSLErrors(fallback: "OpenSSL has none of them"))
        }
    case .insecureLegacyCompatibility:
        break
    }
}

/// Loads a certificate chain and its key into `ctx`, and checks that they match.
private func useCertificate(_ certificate: TLSCertificate, in ctx: OpaquePointer) throws(TLSConfigurationError) {
    switch certificate.chain {
    case .file(let path):
        try checkReadable(path, what: "certificate chain")
        guard SSL_CTX_use_certificate_chain_file(ctx, path) == 1 else {
            throw TLSConfigurationError(what: "certificate chain", source: "file '\(path)'", reason: takeOpenSSLErrors())
        }
    case .pem(let bytes):
        try withMemoryBIO(bytes) { bio throws(TLSConfigurationError) in
            guard let leaf = PEM_read_bio_X509_AUX(bio, nil, nil, nil) else {
                throw TLSConfigurationError(what: "certificate chain", source: "PEM data", reason: takeOpenSSLErrors(fallback: "no certificate in it"))
            }
            defer { X509_free(leaf) }
            guard SSL_CTX_use_certificate(ctx, leaf) == 1 else {
                throw TLSConfigurationError(what: "certificate chain", source: "PEM data", reason: takeOpenSSLErrors())
            }
            while let intermediate = PEM_read_bio_X509(bio, nil, nil, nil) {
                // `add0`: the context takes the certificate over.
                if SSL_CTX_ctrl(ctx, SSL_CTRL_CHAIN_CERT, 0, UnsafeMutableRawPointer(intermediate)) != 1 {
                    X509_free(intermediate)
                    throw TLSConfigurationError(what: "certificate chain", source: "PEM data", reason: takeOpenSSLErrors())
                }
            }
            ERR_clear_error()  // the read that ended the loop leaves "no start line"
        }
    }
    switch certificate.privateKey {
    case .file(let path):
        try checkReadable(path, what: "private key")
        guard SSL_CTX_use_PrivateKey_file(ctx, path, SSL_FILETYPE_PEM) == 1 else {
            let reason = takeOpenSSLErrors()
            throw TLSConfigurationError(what: "private key", source: "file '\(path)'",
                                        reason: reason.contains("mismatch")
                                            ? "it does not match the certificate of \(certificate.chain) (\(reason))" : reason)
        }
    case .pem(let bytes):
        try withMemoryBIO(bytes) { bio throws(TLSConfigurationError) in
            guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
                throw TLSConfigurationError(what: "private key", source: "PEM data", reason: takeOpenSSLErrors(fallback: "no key in it"))
            }
            defer { EVP_PKEY_free(key) }
            guard SSL_CTX_use_PrivateKey(ctx, key) == 1 else {
                let reason = takeOpenSSLErrors()
                throw TLSConfigurationError(what: "private key", source: "PEM data",
                                            reason: reason.contains("mismatch")
                                                ? "it does not match the certificate of \(certificate.chain) (\(reason))" : reason)
            }
        }
    }
    guard SSL_CTX_check_private_key(ctx) == 1 else {
        throw TLSConfigurationError(what: "private key", source: "\(certificate.privateKey)",
                                    reason: "it does not match the certificate of \(certificate.chain) (\(takeOpenSSLErrors()))")
    }
}

/// Loads `roots` into `ctx`'s verification store.
private func loadTrustRoots(_ roots: TLSTrustRoots, into ctx: OpaquePointer) throws(TLSConfigurationError) {
    switch roots {
    case .system:
        guard SSL_CTX_set_default_verify_paths(ctx) == 1 else {
            throw TLSConfigurationError(what: "trust roots", source: "the system's store", reason: takeOpenSSLErrors())
        }
    case .file(let path):
        try checkReadable(path, what: "trust roots")
        guard SSL_CTX_load_verify_locations(ctx, path, nil) == 1 else {
            throw TLSConfigurationError(what: "trust roots", source: "file '\(path)'", reason: takeOpenSSLErrors())
        }
    case .directory(let path):
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw TLSConfigurationError(what: "trust roots", source: "directory '\(path)'", reason: "no such directory")
        }
        guard SSL_CTX_load_verify_locations(ctx, nil, path) == 1 else {
            throw TLSConfigurationError(what: "trust roots", source: "directory '\(path)'", reason: takeOpenSSLErrors())
        }
    case .pem(let bytes):
        guard let store = SSL_CTX_get_cert_store(ctx) else {
            throw TLSConfigurationError(what: "trust roots", source: "PEM data", reason: "the context has no store")
        }
        try withMemoryBIO(bytes) { bio throws(TLSConfigurationError) in
            var added = 0
            while let certificate = PEM_read_bio_X509(bio, nil, nil, nil) {
                defer { X509_free(certificate) }
                if X509_STORE_add_cert(store, certificate) == 1 { added += 1 }
            }
            ERR_clear_error()
            if added == 0 {
                throw TLSConfigurationError(what: "trust roots", source: "PEM data", reason: "no certificate in it")
            }
        }
    }
}

/// A clear error for a file that cannot be read (OpenSSL's would only say "system library").
private func checkReadable(_ path: String, what: String) throws(TLSConfigurationError) {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else {
        throw TLSConfigurationError(what: what, source: "file '\(path)'", reason: "cannot read it: \(String(cString: strerror(errno)))")
    }
    close(fd)
}

/// Runs `body` with a read-only memory BIO over `bytes`.
private func withMemoryBIO(_ bytes: [UInt8], _ body: (OpaquePointer) throws(TLSConfigurationError) -> Void)
    throws(TLSConfigurationError)
{
    ERR_clear_error()
    let outcome = bytes.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> Result<Void, TLSConfigurationError> in
        guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else {
            return .failure(TLSConfigurationError(what: "PEM data", source: "memory", reason: takeOpenSSLErrors()))
        }
        defer { BIO_free(bio) }
        return Result { () throws(TLSConfigurationError) in try body(bio) }
    }
    try outcome.get()
}

/// SNI: the client asked for a name; switch the session to the context that answers for it.
private let serverNameCallback: @convention(c) (OpaquePointer, UnsafeMutablePointer<Int32>, UnsafeMutableRawPointer?) -> Int32 = {
    ssl, _, argument in
    guard let argument, let name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name) else {
        return SSL_TLSEXT_ERR_OK
    }
    let set = Unmanaged<ServerContextSet>.fromOpaque(argument).takeUnretainedValue()
    if let context = set.context(forServerName: String(cString: name)), context !== set.defaultContext {
        _ = SSL_set_SSL_CTX(ssl, context.raw)
    }
    return SSL_TLSEXT_ERR_OK
}

/// ALPN: the first of the server's protocols (its preference order) that the client offers.
private let alpnSelectCallback: @convention(c) (
    OpaquePointer?, UnsafeMutablePointer<UnsafePointer<UInt8>?>?, UnsafeMutablePointer<UInt8>?,
    UnsafePointer<UInt8>?, UInt32, UnsafeMutableRawPointer?
) -> Int32 = { _, out, outLength, offered, offeredLength, argument in
    guard let out, let outLength, let offered, let argument else { return SSL_TLSEXT_ERR_NOACK }
    let handle = Unmanaged<SSLContextHandle>.fromOpaque(argument).takeUnretainedValue()
    var chosen: UnsafeMutablePointer<UInt8>?
    var chosenLength: UInt8 = 0
    let status = SSL_select_next_proto(&chosen, &chosenLength, handle.alpn.baseAddress, UInt32(handle.alpnCount),
                                       offered, offeredLength)
    guard status == OPENSSL_NPN_NEGOTIATED, let chosen else { return SSL_TLSEXT_ERR_NOACK }
    out.pointee = UnsafePointer(chosen)
    outLength.pointee = chosenLength
    return SSL_TLSEXT_ERR_OK
}
