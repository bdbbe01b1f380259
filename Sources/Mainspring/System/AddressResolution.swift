// getaddrinfo and the plain socket calls of a connect by address. This file imports Glibc
// only (not CLibevent), so the socket constants are Glibc's own (see SocketTypes.swift).
#if canImport(Glibc)
import Glibc
#endif

/// `host` as a numeric address (IPv4, IPv6, an IPv6 scope "%eth0"), or nil when it is not one.
/// Never blocks: `AI_NUMERICHOST` forbids any lookup.
func numericAddress(_ host: String, port: UInt16) -> SocketAddress? {
    guard case .success(let addresses) = getAddresses(host, port: port, flags: AI_NUMERICHOST | AI_NUMERICSERV),
          let first = addresses.first
    else { return nil }
    return first
}

/// Resolves `host` with the system's resolver (`getaddrinfo`: /etc/hosts, nsswitch.conf,
/// resolv.conf, exactly as every other program on the machine). Blocks: resolver threads only.
func lookUpAddresses(_ host: String, port: UInt16) -> Result<[SocketAddress], EventLoopError> {
    getAddresses(host, port: port, flags: AI_NUMERICSERV)
}

/// Stream-socket addresses of `host`, in getaddrinfo's (RFC 6724) order, without duplicates.
private func getAddresses(_ host: String, port: UInt16, flags: Int32) -> Result<[SocketAddress], EventLoopError> {
    var hints = addrinfo()
    hints.ai_family = AF_UNSPEC
    hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
    hints.ai_flags = flags
    var list: UnsafeMutablePointer<addrinfo>?
    let status = getaddrinfo(host, String(port), &hints, &list)
    guard status == 0 else {
        let reason = status == EAI_SYSTEM ? String(cString: strerror(errno)) : String(cString: gai_strerror(status))
        return .failure(.hostNotFound(host: host, reason: reason))
    }
    defer { freeaddrinfo(list) }
    var addresses: [SocketAddress] = []
    var entry = list
    while let info = entry {
        entry = info.pointee.ai_next
        guard let address = info.pointee.ai_addr,
              let made = socketAddress(address, length: info.pointee.ai_addrlen)
        else { continue }
        if !addresses.contains(made) { addresses.append(made) }
    }
    if addresses.isEmpty { return .failure(.hostNotFound(host: host, reason: "no IPv4 or IPv6 address")) }
    return .success(addresses)
}

/// A `SocketAddress` from a `sockaddr` (IPv4 or IPv6; nil for another family).
func socketAddress(_ address: UnsafePointer<sockaddr>, length: socklen_t) -> SocketAddress? {
    let family: SocketAddress.Family
    let port: UInt16
    switch Int32(address.pointee.sa_family) {
    case AF_INET:
        family = .ipv4
        port = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
    case AF_INET6:
        family = .ipv6
        port = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
    default:
        return nil
    }
    var text = [CChar](repeating: 0, count: Int(NI_MAXHOST))
    guard getnameinfo(address, length, &text, socklen_t(text.count), nil, 0, NI_NUMERICHOST) == 0 else { return nil }
    let host = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    let storage = [UInt8](UnsafeRawBufferPointer(start: UnsafeRawPointer(address), count: Int(length)))
    return SocketAddress(family: family, host: host, port: port, storage: storage)
}

/// How a non-blocking connect started.
enum ConnectStart {
    /// Connected at once: the socket.
    case connected(Int32)
    /// Under way: the socket, to wait on for writability.
    case inProgress(Int32)
    /// Failed at once (no socket left open).
    case failed(errno: Int32)
}

/// Starts a non-blocking TCP connect to `address`: the new socket (non-blocking, close-on-exec,
/// Nagle off) and whether it connected at once (loopback may); otherwise the caller waits for it
/// to be writable and reads `pendingConnectError`. Throws the errno of a connect that failed at
/// once (`ENETUNREACH` for a family the machine has no route for, say).
func startConnect(to address: SocketAddress) -> ConnectStart {
    let domain = address.family == .ipv6 ? AF_INET6 : AF_INET
    let fd = socket(domain, SocketType.stream | SocketType.nonBlocking | SocketType.closeOnExec, 0)
    guard fd >= 0 else { return .failed(errno: errno) }
    disableNagle(fd)
    let rc = address.storage.withUnsafeBytes { bytes in
        connect(fd, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count))
    }
    if rc == 0 { return .connected(fd) }
    let code = errno
    if code == EINPROGRESS { return .inProgress(fd) }
    close(fd)
    return .failed(errno: code)
}

/// The address a listener binds for `host`: a literal as it is; "localhost" as 127.0.0.1 (the
/// address it has always bound, and the one clients connecting by name reach: Happy Eyeballs
/// tries ::1 and 127.0.0.1 both); another name as its first address from the system's
/// resolver — a blocking lookup, on the thread that makes the listener (once, at start).
func listeningAddress(for host: String, port: UInt16) throws(EventLoopError) -> SocketAddress {
    if let literal = numericAddress(host, port: port) { return literal }
    if host == "localhost", let loopback = numericAddress("127.0.0.1", port: port) { return loopback }
    guard isPlausibleHostName(host) else { throw .invalidAddress(host) }
    // Resolving here would call getaddrinfo on the loop's thread: a slow resolver would stall
    // every connection of the loop. The caller resolves off the loop (`EventLoop.resolve`).
    throw .bindNeedsAddress(host: host)
}

/// A new TCP socket bound to `address` and listening (non-blocking, close-on-exec,
/// `SO_REUSEADDR`; an IPv6 wildcard "::" accepts IPv4 too, `IPV6_V6ONLY` off whatever the
/// system's default): the descriptor, or the errno of the call that failed and its name.
func bindListeningSocket(_ address: SocketAddress, backlog: Int32) -> Result<Int32, EventLoopError> {
    let domain = address.family == .ipv6 ? AF_INET6 : AF_INET
    let fd = socket(domain, SocketType.stream | SocketType.nonBlocking | SocketType.closeOnExec, 0)
    guard fd >= 0 else { return .failure(.system(function: "socket", errno: errno)) }
    var one: Int32 = 1
    var zero: Int32 = 0
    let size = socklen_t(MemoryLayout<Int32>.size)
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size)
    if address.family == .ipv6 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &zero, size) }
    let bound = address.storage.withUnsafeBytes { bytes in
        bind(fd, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count))
    }
    if bound != 0 || listen(fd, backlog) != 0 {
        let code = errno
        close(fd)
        return .failure(.system(function: "bind/listen \(address)", errno: code))
    }
    return .success(fd)
}
