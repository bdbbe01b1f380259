import Foundation
import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// A blocking loopback TCP client for tests (plain sockets, no Mainspring).
package final class TestClient: @unchecked Sendable {
    package let fd: Int32
    private var pending: [UInt8] = []

    package init(port: UInt16, host: String = "127.0.0.1") throws {
        // The descriptor is stored only once connected: a class whose init throws after its
        // properties are set runs `deinit`, which would close the descriptor a second time (by
        // then perhaps another thread's: a new loop's epoll instance, say).
        fd = try connectTestSocket(port: port, host: host)
    }

    deinit { close(fd) }

    /// How long a read waits before it gives up (10 s unless set): longer for a client whose
    /// server has much to do first (under a sanitizer, seconds become tens of seconds).
    package func setReceiveTimeout(seconds: Int) {
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    package func send(_ text: String) { send(Array(text.utf8)) }

    /// Sends all of `bytes` (blocking).
    package func send(_ bytes: some Collection<UInt8>) {
        sendAll(Array(bytes), to: fd)
    }

    /// Reads one line (without "\n"); nil at end of file, error or timeout.
    package func readLine() -> String? {
        while true {
            if let newline = pending.firstIndex(of: 0x0A) {
                let line = String(decoding: pending[..<newline], as: UTF8.self)
                pending.removeSubrange(...newline)
                return line
            }
            var chunk = [UInt8](repeating: 0, count: 4_096)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            // A socket with a receive timeout is not restarted after a signal handler, even with
            // SA_RESTART, and tests in this process raise signals: retry the interrupted call.
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return nil }
            pending += chunk[0..<n]
        }
    }

    /// Reads until end of file; returns everything read.
    package func readToEnd() -> String {
        var all = pending
        pending = []
        var chunk = [UInt8](repeating: 0, count: 4_096)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            all += chunk[0..<n]
        }
        return String(decoding: all, as: UTF8.self)
    }

    package func shutdownWrite() { shutdown(fd, Int32(SHUT_WR)) }
}

// There is no `freePort()` (bind port 0, read it back, release it) any more, on purpose: the
// released port is back in the kernel's ephemeral range, where any port-0 bind or outgoing
// connect of a test running in parallel may be given it before whoever it was meant for binds
// it. A listener of this process binds port 0 itself and reads its port back; a subprocess is
// handed ports from `subprocessPorts(_:)` (and retried on "Address already in use"); a connect
// that must be refused goes to a `RefusingPort`.

/// A loopback TCP port where a connect is refused (`ECONNREFUSED`) for as long as this value
/// lives: a socket bound to 127.0.0.1:0 that never listens. A connect to a bound, non-listening
/// TCP socket is answered with a reset; and as the port stays bound, no other test (nor anyone
/// else) can be given it for a listener meanwhile — unlike a port that was bound and released,
/// which anybody may have taken by the time the connect happens.
package final class RefusingPort: @unchecked Sendable {
    package let port: UInt16
    private let fd: Int32

    package init() throws {
        // Stored only once bound: a class whose init throws after its properties are set runs
        // `deinit`, which would close the descriptor a second time.
        (fd, port) = try bindLoopbackTCPSocket()
    }

    deinit { close(fd) }
}

/// A TCP socket bound to 127.0.0.1 port 0 (the kernel picks the port), not listening yet: its
/// descriptor and the port it got. Closed again when binding fails.
package func bindLoopbackTCPSocket() throws -> (fd: Int32, port: UInt16) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EMFILE) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
        }
    }
    guard bound else {
        let code = errno
        close(fd)
        throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EADDRINUSE)
    }
    return (fd, UInt16(bigEndian: address.sin_port))
}

/// The kernel's ephemeral port range (`/proc/sys/net/ipv4/ip_local_port_range`): where port-0
/// binds and outgoing connects get their ports. Linux's default, 32768…60999, when unreadable.
package func ephemeralPortRange() -> ClosedRange<UInt16> {
    let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
    let numbers = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { UInt16($0) }
    guard numbers.count == 2, numbers[0] <= numbers[1] else { return 32_768...60_999 }
    return numbers[0]...numbers[1]
}

/// `count` distinct TCP ports on 127.0.0.1 for a subprocess to bind itself (`systemd-socket-activate
/// -l`, a daemon's `--port`): random ones OUTSIDE the kernel's ephemeral range, each bindable
/// right now. No port-0 bind and no outgoing connect is ever given a port outside that range,
/// so the only race left is with another explicit pick (another test, another program): the
/// caller retries with new ports when the subprocess reports "Address already in use".
package func subprocessPorts(_ count: Int) throws -> [UInt16] {
    let ephemeral = ephemeralPortRange()
    // Below the range (from 10000, clear of the well-known and most registered services' ports),
    // or above it when the range starts too low for that.
    let candidates: [ClosedRange<UInt16>] = [10_000...max(10_000, ephemeral.lowerBound &- 1),
                                             min(65_535, ephemeral.upperBound &+ 1)...65_535]
        .filter { !$0.overlaps(ephemeral) }
    guard !candidates.isEmpty else { throw POSIXError(.EADDRNOTAVAIL) }
    var picked: [UInt16] = []
    var tries = 0
    while picked.count < count {
        tries += 1
        if tries > 1_000 { throw POSIXError(.EADDRINUSE) }
        let range = candidates.randomElement()!
        let port = UInt16.random(in: range)
        if picked.contains(port) || !isBindable(port) { continue }
        picked.append(port)
    }
    return picked
}

/// Whether 127.0.0.1:`port` can be bound right now (bound and released at once; without
/// SO_REUSEADDR, so a port in use in any way — listening, connected, bound — is not).
private func isBindable(_ port: UInt16) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}

/// A blocking TCP socket (close-on-exec) connected to `host`:`port` (IPv4, or IPv6 when `host`
/// has a colon), whose reads give up after `receiveTimeoutSeconds`: the tests' plain clients
/// (`TestClient`, the KV tests' `RESPClient`). Throws the connect's errno.
package func connectTestSocket(port: UInt16, host: String = "127.0.0.1", receiveTimeoutSeconds: Int = 10) throws -> Int32 {
    let family = host.contains(":") ? AF_INET6 : AF_INET
    let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EMFILE) }
    var rc: Int32
    if family == AF_INET {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        inet_pton(AF_INET, host, &address.sin_addr)
        rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
    } else {
        var address = sockaddr_in6()
        address.sin6_family = sa_family_t(AF_INET6)
        address.sin6_port = port.bigEndian
        inet_pton(AF_INET6, host, &address.sin6_addr)
        rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
        }
    }
    guard rc == 0 else {
        let code = errno
        close(fd)
        throw POSIXError(POSIXErrorCode(rawValue: code) ?? .ECONNREFUSED)
    }
    var timeout = timeval(tv_sec: receiveTimeoutSeconds, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    return fd
}

/// Sends all of `bytes` on the blocking socket `fd` (retrying after EINTR); stops early, quietly,
/// when the peer is gone.
package func sendAll(_ bytes: [UInt8], to fd: Int32) {
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { return }
        offset += n
    }
}
