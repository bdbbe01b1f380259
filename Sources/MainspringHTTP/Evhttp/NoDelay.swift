// TCP_NODELAY for evhttp's connections, and the descriptor steps of taking a connection over (a
// WebSocket upgrade). The socket constants (SOCK_STREAM, …) come from <sys/socket.h>, which
// libevent's headers include too: which module clang credits them to depends on the order it
// reads the headers in, and a whole-module (release) build then finds them only in the files
// that import both — so every file of this module that names one imports CLibevent as well as
// Glibc.
internal import CLibevent
import MainspringCore
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

/// A close-on-exec duplicate of `fd`, or nil.
func duplicateDescriptor(_ fd: Int32) -> Int32? {
    let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
    return copy >= 0 ? copy : nil
}

/// A fresh, unconnected Unix socket (close-on-exec) to put in place of a socket taken over, or
/// nil when none can be made.
func makePlaceholderSocket() -> Int32? {
    let placeholder = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    return placeholder >= 0 ? placeholder : nil
}

/// Points the descriptor number `fd` at `placeholder` in one step, close-on-exec (the core's
/// `duplicateCloseOnExec`: `dup3`), and closes `placeholder`'s own number: whatever still uses
/// `fd` — shuts it down, closes it — no longer reaches the socket it was.
func move(_ placeholder: Int32, onto fd: Int32) {
    _ = duplicateCloseOnExec(placeholder, onto: fd)
    _ = close(placeholder)
}
