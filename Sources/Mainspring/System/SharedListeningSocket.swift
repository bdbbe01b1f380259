// One listening socket that several loops accept from, each through a `Listener` adopting a
// duplicate of it (MainspringHTTP's server: every loop accepts for itself). Imports Glibc only.
#if canImport(Glibc)
import Glibc
#endif

/// A TCP or Unix stream socket bound and listening once, for several listeners: each adopts a
/// ``duplicate()`` (`Listener(.adopted(descriptor:), on:)`), so a loop stuck in a long callback
/// stops taking connections and the others take them. The socket itself closes when this object
/// goes; the duplicates listen on until their listeners close. Any thread.
package final class SharedListeningSocket: Sendable {
    private let fd: Int32
    /// The bound port (0 on a Unix socket).
    package let port: UInt16
    /// A Unix socket's file (nil for TCP and abstract names); removed by the owner, not here.
    package let unixFile: UnixSocketFile?

    /// `host:port` bound (`Listener`'s rules: a literal or "localhost"; port 0 picks one) and
    /// listening with `backlog`.
    /// - Throws: `.invalidAddress`, `.bindNeedsAddress`, `.system` (the address in use, say).
    package init(host: String, port: UInt16, backlog: Int32) throws(EventLoopError) {
        let address = try listeningAddress(for: host, port: port)
        fd = try bindListeningSocket(address, backlog: backlog).get()
        self.port = boundAddress(of: fd)?.port ?? port
        unixFile = nil
    }

    /// A Unix stream socket at `path` (`bindUnixListeningSocket`'s rules), listening.
    /// - Throws: `.invalidAddress`, `.unixSocketPathInUse`, `.system`.
    package init(unixPath path: String, mode: UInt16?, backlog: Int32) throws(EventLoopError) {
        (fd, unixFile) = try bindUnixListeningSocket(path, mode: mode, backlog: backlog)
        port = 0
    }

    /// A close-on-exec duplicate of the socket, for one listener to adopt (and close). Close it
    /// with ``closeDuplicate(_:)`` if no listener took it.
    package func duplicate() throws(EventLoopError) -> Int32 {
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw .system(function: "fcntl(F_DUPFD_CLOEXEC)", errno: errno) }
        return copy
    }

    /// Closes a duplicate that no listener adopted.
    package static func closeDuplicate(_ copy: Int32) { closeDescriptor(copy) }

    deinit { closeDescriptor(fd) }
}
