// UDP sockets: making, binding, connecting, options, and datagrams in batches (recvmmsg and
// sendmmsg, through CMainspringSystem). Imports Glibc only (not CLibevent), for its socket
// constants (see SocketTypes.swift).
#if canImport(Glibc)
import Glibc
#endif
internal import CMainspringSystem

/// The largest UDP payload of a family: 65,507 bytes over IPv4, 65,527 over IPv6 (a 16-bit
/// length less the headers). Larger ones fail with EMSGSIZE.
func maximumUDPPayload(_ family: SocketAddress.Family) -> Int { family == .ipv6 ? 65_527 : 65_507 }

/// A new UDP socket bound to `address` (non-blocking, close-on-exec; an IPv6 "::" receives
/// IPv4 too, `IPV6_V6ONLY` off): the descriptor, or the failing call and its errno.
func bindDatagramSocket(_ address: SocketAddress, reusesAddress: Bool, allowsBroadcast: Bool,
                        receiveBufferSize: Int?, sendBufferSize: Int?) -> Result<Int32, EventLoopError>
{
    let domain = address.family == .ipv6 ? AF_INET6 : AF_INET
    let fd = socket(domain, SocketType.datagram | SocketType.nonBlocking | SocketType.closeOnExec, 0)
    guard fd >= 0 else { return .failure(.system(function: "socket(SOCK_DGRAM)", errno: errno)) }
    let size = socklen_t(MemoryLayout<Int32>.size)
    var one: Int32 = 1
    var zero: Int32 = 0
    if reusesAddress { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, size) }
    if allowsBroadcast { setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, size) }
    if var bytes = receiveBufferSize.map(Int32.init(clamping:)) { setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, size) }
    if var bytes = sendBufferSize.map(Int32.init(clamping:)) { setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, size) }
    if address.family == .ipv6 { setsockopt(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &zero, size) }
    let bound = address.storage.withUnsafeBytes { bytes in
        bind(fd, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count))
    }
    guard bound == 0 else {
        let code = errno
        close(fd)
        return .failure(.system(function: "bind \(address)", errno: code))
    }
    return .success(fd)
}

/// `connect(2)` on a UDP socket: the peer it sends to by default and the only one it receives
/// from. 0, or the errno.
func connectDatagramSocket(_ fd: Int32, to address: SocketAddress) -> Int32 {
    let rc = address.storage.withUnsafeBytes { bytes in
        connect(fd, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count))
    }
    return rc == 0 ? 0 : errno
}

/// The address `fd` is bound to (`getsockname`), IPv4 or IPv6.
func boundAddress(of fd: Int32) -> SocketAddress? {
    var storage = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    return withUnsafeMutablePointer(to: &storage) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address -> SocketAddress? in
            guard getsockname(fd, address, &length) == 0 else { return nil }
            return socketAddress(address, length: length)
        }
    }
}

/// Whether `address` is multicast (224.0.0.0/4, ff00::/8).
func isMulticast(_ address: SocketAddress) -> Bool {
    if address.family == .ipv6 { return address.storage.count > 8 && address.storage[8] == 0xff }
    return address.storage.count > 4 && address.storage[4] & 0xf0 == 0xe0
}

/// Joins or leaves the multicast `group` on the interface with index `interfaceIndex` (0: the
/// one the kernel picks). 0, or the errno (EADDRINUSE for a group already joined,
/// EADDRNOTAVAIL for leaving one never joined).
func changeMulticastMembership(_ fd: Int32, group: SocketAddress, interfaceIndex: UInt32, join: Bool) -> Int32 {
    let rc: Int32
    if group.family == .ipv6 {
        var request = ipv6_mreq()
        group.storage.withUnsafeBytes { bytes in
            request.ipv6mr_multiaddr = bytes.load(fromByteOffset: 8, as: in6_addr.self)
        }
        request.ipv6mr_interface = interfaceIndex
        rc = setsockopt(fd, Int32(IPPROTO_IPV6), join ? IPV6_ADD_MEMBERSHIP : IPV6_DROP_MEMBERSHIP,
                        &request, socklen_t(MemoryLayout<ipv6_mreq>.size))
    } else {
        var request = ip_mreqn()
        group.storage.withUnsafeBytes { bytes in
            request.imr_multiaddr = bytes.load(fromByteOffset: 4, as: in_addr.self)
        }
        request.imr_ifindex = Int32(bitPattern: interfaceIndex)
        rc = setsockopt(fd, Int32(IPPROTO_IP), join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP,
                        &request, socklen_t(MemoryLayout<ip_mreqn>.size))
    }
    return rc == 0 ? 0 : errno
}

/// The index of the network interface `name` ("lo", "eth0"), or nil.
func interfaceIndex(named name: String) -> UInt32? {
    let index = if_nametoindex(name)
    return index == 0 ? nil : index
}

/// What a batch receive or send found besides datagrams.
enum DatagramCallResult {
    /// That many datagrams (at least one).
    case done(Int)
    /// Nothing to receive, or no room to send (EAGAIN).
    case wouldBlock
    /// The errno of the call (a pending ICMP error — ECONNREFUSED after port unreachable on a
    /// connected socket —, EMSGSIZE, …).
    case failed(Int32)
}

/// The receive side of a UDP socket: buffers for a batch of `batch` datagrams of `size` bytes
/// each, filled by one `recvmmsg`. Loop thread only (one per socket).
final class DatagramReceiveBuffers {
    let size: Int
    let batch: Int
    private let buffers: UnsafeMutablePointer<UInt8>
    private let addresses: UnsafeMutablePointer<UInt8>
    private var lengths: [Int]
    private var truncated: [UInt8]
    private var addressLengths: [UInt32]
    /// The last sender, so that a run of datagrams from one peer costs one `getnameinfo`.
    private var lastSender: SocketAddress?

    init(size: Int, batch: Int) {
        self.size = max(1, size)
        self.batch = min(max(1, batch), 64)
        buffers = .allocate(capacity: self.size * self.batch)
        addresses = .allocate(capacity: Int(MS_DATAGRAM_ADDRESS_SIZE) * self.batch)
        lengths = [Int](repeating: 0, count: self.batch)
        truncated = [UInt8](repeating: 0, count: self.batch)
        addressLengths = [UInt32](repeating: 0, count: self.batch)
    }

    deinit {
        buffers.deallocate()
        addresses.deallocate()
    }

    /// One `recvmmsg` of at most `limit` datagrams.
    func receive(_ fd: Int32, limit: Int) -> DatagramCallResult {
        let count = UInt32(min(limit, batch))
        let received = lengths.withUnsafeMutableBufferPointer { lengths in
            truncated.withUnsafeMutableBufferPointer { truncated in
                addressLengths.withUnsafeMutableBufferPointer { addressLengths in
                    ms_receive_datagrams(fd, buffers, size, count,
                                         UnsafeMutableRawPointer(lengths.baseAddress!).assumingMemoryBound(to: size_t.self),
                                         truncated.baseAddress!, addresses, addressLengths.baseAddress!)
                }
            }
        }
        if received > 0 { return .done(Int(received)) }
        let code = errno
        return code == EAGAIN || code == EWOULDBLOCK || received == 0 ? .wouldBlock : .failed(code)
    }

    /// Datagram `index` of the last batch: its bytes (at most `size`), whether it was cut, its
    /// real length, and its sender.
    func datagram(at index: Int) -> (bytes: [UInt8], isTruncated: Bool, length: Int, sender: SocketAddress?) {
        let length = lengths[index]
        let kept = min(length, size)
        let bytes = [UInt8](UnsafeBufferPointer(start: buffers + index * size, count: kept))
        let addressStart = addresses + index * Int(MS_DATAGRAM_ADDRESS_SIZE)
        let addressLength = Int(addressLengths[index])
        var sender: SocketAddress?
        if let last = lastSender, last.storage.count == addressLength,
           last.storage.withUnsafeBytes({ memcmp($0.baseAddress!, addressStart, addressLength) == 0 })
        {
            sender = last
        } else if addressLength > 0 {
            sender = UnsafeRawPointer(addressStart).withMemoryRebound(to: sockaddr.self, capacity: 1) {
                socketAddress($0, length: socklen_t(addressLength))
            }
            lastSender = sender
        }
        return (bytes, truncated[index] != 0, length, sender)
    }
}

/// One `sendmmsg` of `datagrams` (at most 64): each its bytes and its destination (nil: the
/// connected peer). `.done(n)` when the first `n` went (fewer than given when the buffer filled).
func sendDatagramBatch(_ fd: Int32, _ datagrams: ArraySlice<Datagram>) -> DatagramCallResult {
    let count = min(datagrams.count, 64)
    guard count > 0 else { return .done(0) }
    var payload: [UInt8] = []
    var sizes = [Int](repeating: 0, count: count)
    var addresses = [UInt8](repeating: 0, count: Int(MS_DATAGRAM_ADDRESS_SIZE) * count)
    var addressLengths = [UInt32](repeating: 0, count: count)
    for (offset, datagram) in datagrams.prefix(count).enumerated() {
        if count == 1 {
            payload = datagram.bytes
        } else {
            payload.append(contentsOf: datagram.bytes)
        }
        sizes[offset] = datagram.bytes.count
        if let address = datagram.address {
            let start = offset * Int(MS_DATAGRAM_ADDRESS_SIZE)
            addresses.replaceSubrange(start..<start + address.storage.count, with: address.storage)
            addressLengths[offset] = UInt32(address.storage.count)
        }
    }
    if payload.isEmpty { payload = [0] }  // a pointer even for zero-length datagrams
    let sent = payload.withUnsafeBufferPointer { payload in
        sizes.withUnsafeBufferPointer { sizes in
            addresses.withUnsafeBufferPointer { addresses in
                addressLengths.withUnsafeBufferPointer { addressLengths in
                    ms_send_datagrams(fd, payload.baseAddress!,
                                      UnsafeRawPointer(sizes.baseAddress!).assumingMemoryBound(to: size_t.self),
                                      UInt32(count), addresses.baseAddress!, addressLengths.baseAddress!)
                }
            }
        }
    }
    if sent > 0 { return .done(Int(sent)) }
    let code = errno
    return code == EAGAIN || code == EWOULDBLOCK ? .wouldBlock : .failed(code)
}

/// Whether `code` is EMSGSIZE (a datagram larger than the socket or the path allows).
func isMessageTooLarge(_ code: Int32) -> Bool { code == EMSGSIZE }
