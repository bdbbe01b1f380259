// Socket type flags for the files that also import CLibevent. Glibc's SOCK_* constants are an
// enum that libevent's headers declare again; in a whole-module (release) build, a file that
// imports only Glibc then cannot see them once a CLibevent file has used them first. Spelling
// them here, in a file that imports only Glibc, keeps every use on one declaration.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// `socket(2)` type values and flags.
enum SocketType {
    static let stream = Int32(SOCK_STREAM.rawValue)
    static let datagram = Int32(SOCK_DGRAM.rawValue)
    static let nonBlocking = Int32(SOCK_NONBLOCK.rawValue)
    static let closeOnExec = Int32(SOCK_CLOEXEC.rawValue)
}

/// Turns Nagle's algorithm off on a TCP socket (`TCP_NODELAY`), as Mainspring does for every
/// TCP connection it accepts or opens: replies go out when written, not after the peer's
/// delayed ACK (up to 40 ms) — which TLS, writing a record per write, would otherwise meet on
/// every exchange. Other sockets (Unix, say) refuse the option; that is ignored.
func disableNagle(_ fd: Int32) {
    var one: Int32 = 1
    _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
}

/// Sends what the kernel takes at once of `bytes` on the connected stream socket `fd`: never
/// blocks, never raises SIGPIPE. Returns the bytes sent — 0 when the socket would block or the
/// send failed (the caller then buffers them, and the buffered write reports the failure).
func sendWithoutBlocking(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Int {
    guard let base = bytes.baseAddress, !bytes.isEmpty, fd >= 0 else { return 0 }
    let flags = Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)
    guard case .bytes(let sent) = retryingInterrupts({ send(fd, base, bytes.count, flags) }) else { return 0 }
    return sent
}
