// TCP_NODELAY for evhttp's connections, in a file that imports only Glibc: the socket constants
// are declared again by libevent's headers, and a whole-module build would otherwise see them
// from two modules.
#if canImport(Glibc)
import Glibc
#endif

/// Turns Nagle's algorithm off on an accepted HTTP connection: a response written as several
/// records (HTTPS writes its head and body as TLS records of their own) goes out at once, not
/// after the client's delayed ACK. Once per connection, before its first response.
func disableNagle(_ fd: Int32) {
    var one: Int32 = 1
    _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
}

/// Closes a descriptor the server took over and could not hand on (a WebSocket upgrade whose
/// connection could not be made).
func closeDescriptor(_ fd: Int32) {
    _ = close(fd)
}
