import MainspringCore

/// Every TLS failure: `MainspringCore`'s `TLSError`, named here too so that a
/// program importing only this module finds it (a connection's close reason carries it, and
/// the core does not link OpenSSL).
public typealias TLSError = MainspringCore.TLSError
