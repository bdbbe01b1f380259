internal import CLibevent
#if canImport(Glibc)
import Glibc
#endif

// libevent's evconnlistener (accepting), wrapped: the kernel's `ListeningPort`. As in
// Sockets.swift, every C callback argument is the Swift target, passed unretained.

/// Receives an evconnlistener's callbacks.
class SocketListenerTarget {
    /// A connection was accepted: `endpoint` (a non-blocking descriptor, or a simulated
    /// stream's end) is now owned by the callee.
    func accepted(_ endpoint: StreamEndpoint, peer: String) {}
    /// `accept(2)` failed with `errno` (EMFILE when out of descriptors, say).
    func acceptFailed(errno: Int32) {}
}

/// A listening socket on a base: bound here (`evconnlistener_new_bind`) or adopted from a
/// descriptor that already listens (`evconnlistener_new`). Owns the socket: `deinit` closes it.
/// The kernel's `ListeningPort`.
final class SocketListener: ListeningPort {
    private let raw: OpaquePointer
    private let base: EventBase
    /// The bound port (useful when binding port 0); 0 for a unix socket.
    let port: UInt16
    /// The bound address, for messages: "127.0.0.1:7000", "[::1]:7000", a unix socket's path.
    let localAddress: String

    /// Binds `host:port` (a literal or "localhost"; a name is refused: see `listeningAddress(for:port:)`)
    /// and listens.
    init(base: EventBase, host: String, port: UInt16, backlog: Int32, target: SocketListenerTarget)
        throws(EventLoopError)
    {
        try base.refuseIfSimulated("a TCP listener on \(host):\(port)")
        let address = try listeningAddress(for: host, port: port)
        let fd = try bindListeningSocket(address, backlog: backlog).get()
        let arg = callbackArgument(for: target)
        let flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC)
        // A backlog of 0: the socket listens already, so libevent does not call listen(2).
        guard let listener = evconnlistener_new(base.raw, listenerAcceptTrampoline, arg, flags, 0, fd) else {
            let code = errno
            closeDescriptor(fd)
            throw .libevent(function: "evconnlistener_new", errno: code)
        }
        (self.port, self.localAddress) = boundPortAndName(of: fd)
        self.raw = listener
        self.base = base
        evconnlistener_set_error_cb(listener, listenerErrorTrampoline)
    }

    /// Adopts `fd`, a stream socket already bound and listening (passed by socket activation,
    /// say): checks that it is one, makes it non-blocking and close-on-exec, and accepts on it.
    /// From then on the listener owns it; when this throws, `fd` is left open, still the
    /// caller's.
    init(base: EventBase, adopting fd: Int32, target: SocketListenerTarget) throws(EventLoopError) {
        try base.refuseIfSimulated("a listener adopting descriptor \(fd)")
        if let problem = listeningStreamSocketProblem(fd) {
            throw .notListeningSocket(descriptor: fd, reason: problem)
        }
        if let code = setNonBlocking(fd) { throw .system(function: "fcntl(\(fd), F_SETFL, O_NONBLOCK)", errno: code) }
        if let code = setCloseOnExec(fd) { throw .system(function: "fcntl(\(fd), F_SETFD, FD_CLOEXEC)", errno: code) }
        let arg = callbackArgument(for: target)
        let flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC)
        // A backlog of 0: the socket already listens, so libevent does not call listen(2).
        guard let listener = evconnlistener_new(base.raw, listenerAcceptTrampoline, arg, flags, 0, fd) else {
            throw .libevent(function: "evconnlistener_new", errno: errno)
        }
        (self.port, self.localAddress) = boundPortAndName(of: fd)
        self.raw = listener
        self.base = base
        evconnlistener_set_error_cb(listener, listenerErrorTrampoline)
    }

    /// Binds a Unix stream socket at `path` (see `bindUnixListeningSocket`) and listens; the
    /// socket file is removed when the listener goes.
    init(base: EventBase, unixPath path: String, mode: UInt16?, backlog: Int32, target: SocketListenerTarget)
        throws(EventLoopError)
    {
        try base.refuseIfSimulated("a unix socket listener on \(path)")
        let (fd, file) = try bindUnixListeningSocket(path, mode: mode, backlog: backlog)
        let arg = callbackArgument(for: target)
        let flags = UInt32(LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC)
        guard let listener = evconnlistener_new(base.raw, listenerAcceptTrampoline, arg, flags, 0, fd) else {
            let code = errno
            closeDescriptor(fd)
            file?.remove()
            throw .libevent(function: "evconnlistener_new", errno: code)
        }
        // The path asked for: the kernel's name is the temporary one it was bound under.
        (self.port, self.localAddress) = (0, path)
        self.raw = listener
        self.base = base
        self.socketFile = file
        evconnlistener_set_error_cb(listener, listenerErrorTrampoline)
    }

    /// The Unix socket file this listener made, removed with it.
    private var socketFile: UnixSocketFile?

    deinit {
        evconnlistener_free(raw)
        socketFile?.remove()
    }

    /// Accepts again. - Throws: `.libevent` with the errno when the loop refuses the socket.
    func enable() throws(EventLoopError) {
        try base.takeInjectedFailure("evconnlistener_enable")
        try check(evconnlistener_enable(raw), "evconnlistener_enable")
    }

    /// Stops accepting (`evconnlistener_disable` only deletes its event: it cannot fail).
    func disable() { evconnlistener_disable(raw) }

    func setAccepting(_ accepting: Bool) throws(EventLoopError) {
        if accepting { try enable() } else { disable() }
    }

    /// Stops accepting; the socket closes (and a Unix socket's file goes) when the listener is
    /// released.
    func close() { disable() }
}

private let listenerAcceptTrampoline: evconnlistener_cb = { _, fd, address, length, arg in
    let target = callbackTarget(arg, as: SocketListenerTarget.self)
    disableNagle(fd)
    target.accepted(.descriptor(fd), peer: describe(address, length))
}

private let listenerErrorTrampoline: evconnlistener_errorcb = { _, arg in
    let code = errno
    callbackTarget(arg, as: SocketListenerTarget.self).acceptFailed(errno: code)
}

