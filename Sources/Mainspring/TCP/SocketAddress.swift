/// A resolved IP address and port: what `EventLoop.resolve(_:port:timeout:)` returns, and what
/// a connect by name tries, in turn.
///
/// A value (it holds the socket address's bytes): any thread, no cost beyond its copy.
public struct SocketAddress: Sendable, Hashable, CustomStringConvertible {
    /// The address family.
    public enum Family: Sendable, Hashable {
        /// IPv4 (`AF_INET`).
        case ipv4
        /// IPv6 (`AF_INET6`).
        case ipv6
    }

    /// IPv4 or IPv6.
    public let family: Family
    /// The address in numeric form: "127.0.0.1", "::1", "fe80::1%eth0".
    public let host: String
    /// The port (0 when resolved without one).
    public let port: UInt16
    /// The `sockaddr_in` or `sockaddr_in6` itself, as `connect(2)` takes it.
    let storage: [UInt8]

    /// The address of an IPv4 or IPv6 literal ("127.0.0.1", "::1", "fe80::1%eth0") and `port`.
    /// Never looks anything up (use `EventLoop.resolve(_:port:timeout:)` for names).
    /// - Throws: `.invalidAddress` when `host` is not a literal.
    public init(ipAddress host: String, port: UInt16) throws(EventLoopError) {
        guard let address = numericAddress(host, port: port) else { throw .invalidAddress(host) }
        self = address
    }

    init(family: Family, host: String, port: UInt16, storage: [UInt8]) {
        self.family = family
        self.host = host
        self.port = port
        self.storage = storage
    }

    /// "127.0.0.1:80", "[::1]:80".
    public var description: String { family == .ipv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// RFC 8305's order of attempts (section 4): the resolver's first address's family first, then
/// the families alternate (the rest of each family kept in the resolver's RFC 6724 order).
func interleavedByFamily(_ addresses: [SocketAddress]) -> [SocketAddress] {
    guard let first = addresses.first else { return [] }
    let preferred = addresses.filter { $0.family == first.family }
    let other = addresses.filter { $0.family != first.family }
    var result: [SocketAddress] = []
    result.reserveCapacity(addresses.count)
    for index in 0..<max(preferred.count, other.count) {
        if index < preferred.count { result.append(preferred[index]) }
        if index < other.count { result.append(other[index]) }
    }
    return result
}

/// Whether `host` could be a host name (RFC 1123 labels, a trailing dot allowed; underscores
/// tolerated, as resolvers do): a cheap check before a resolver thread is asked.
/// `package`: the tests pick an /etc/hosts name with it.
/// `host:port` as a peer is named in messages and addresses: an IPv6 literal in brackets
/// (`[::1]:80`). `package`: MainspringTLS names the peers of its connections with it.
package func hostAndPort(_ host: String, _ port: UInt16) -> String {
    host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
}

package func isPlausibleHostName(_ host: String) -> Bool {
    let bytes = Array(host.utf8)
    guard !bytes.isEmpty, bytes.count <= 253 || (bytes.count == 254 && bytes.last == UInt8(ascii: ".")) else {
        return false
    }
    var labelLength = 0
    for (index, byte) in bytes.enumerated() {
        switch byte {
        case UInt8(ascii: "."):
            if labelLength == 0 { return false }
            labelLength = 0
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"):
            labelLength += 1
        case UInt8(ascii: "-"):
            if labelLength == 0 || index == bytes.count - 1 { return false }
            labelLength += 1
        default:
            return false
        }
        if labelLength > 63 { return false }
    }
    return true
}
