// Address parsing for the client: the module's one call of the C library for addresses (inet_pton).
#if canImport(Glibc)
import Glibc
#endif

/// Whether `host` is an IPv4 or IPv6 literal (`inet_pton`).
func isIPLiteral(_ host: String) -> Bool {
    var v4 = in_addr()
    var v6 = in6_addr()
    return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
}
