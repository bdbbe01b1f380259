/// A listening TCP socket: accepts connections on one loop and hands each to a handler, on
/// that loop or spread over an `EventLoopGroup`.
///
/// When `accept(2)` runs out of file descriptors (`EMFILE`, `ENFILE`), the listener pauses for
/// 100 ms instead of spinning on the still-readable listening socket, then resumes.
///
/// Loop-bound: create, query and close it on its loop's thread.
public final class Listener {
    private let source: ListenerSource

    /// Listens on `host:port` (`"127.0.0.1"`, `"::1"`, `"0.0.0.0"`, `"localhost"`; port 0 picks
    /// a free port, see `port`). Each accepted connection is created on `group.next()` (or on
    /// `loop` when `group` is nil) and passed to `accept` there, on that loop's thread.
    ///
    /// Must be called on `loop`'s thread.
    /// - Throws: `EventLoopError.invalidAddress`, `.system` (address in use, …), `.wrongThread`.
    public init(host: String = "127.0.0.1", port: UInt16 = 0, on loop: EventLoop, group: EventLoopGroup? = nil,
                options: Connection.Options = .init(), backlog: Int32 = 511,
                accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Listener.init(host:port:on:…)") }
        source = try ListenerSource(loop: loop, socket: .binding(host: host, port: port, backlog: backlog),
                                    group: group, options: options, accept: accept)
    }

    /// Accepts on `descriptor`, a stream socket that is already bound and listening — passed by
    /// a service manager (see ``ActivatedSockets`` and ``init(activatedSocket:on:group:options:accept:)``),
    /// or by a parent process. Connections are handed to `accept` as with
    /// ``init(host:port:on:group:options:backlog:accept:)``. IPv4, IPv6 and unix stream sockets
    /// are accepted.
    ///
    /// The listener takes the descriptor over: it makes it non-blocking and close-on-exec, and
    /// closes it when the listener is closed. When the initialiser throws, the descriptor is
    /// left open and still the caller's.
    ///
    /// Must be called on `loop`'s thread.
    /// - Throws: `EventLoopError.notListeningSocket` when `descriptor` is not open, not a
    ///   socket, not a stream socket, or not listening (the reason says which); `.system`,
    ///   `.libevent`, `.wrongThread`.
    public init(adopting descriptor: Int32, on loop: EventLoop, group: EventLoopGroup? = nil,
                options: Connection.Options = .init(), accept: @escaping @Sendable (Connection) -> Void)
        throws(EventLoopError)
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Listener.init(adopting:on:…)") }
        source = try ListenerSource(loop: loop, socket: .adopting(descriptor), group: group, options: options,
                                    accept: accept)
    }

    /// The bound port (0 for a unix socket).
    public var port: UInt16 { source.port }

    /// The address the socket is bound to, for messages: `127.0.0.1:7000`, `[::1]:7000`, or a
    /// unix socket's path (`@name` in the abstract namespace).
    public var localAddress: String { source.localAddress }

    /// Connections accepted so far.
    public var acceptedCount: Int { source.acceptedCount }

    /// Whether the listener still accepts connections.
    public var isListening: Bool { !source.isClosed }

    /// Stops accepting and closes the listening socket. Connections already accepted are not
    /// affected. Idempotent. Loop thread only.
    public func close() {
        source.loop.preconditionOnLoop("Listener.close()")
        source.close()
    }
}

@available(*, unavailable)
extension Listener: Sendable {}

/// An accepted socket on its way to another loop: closed if it never gets there.
private final class AcceptedSocket: @unchecked Sendable {
    private var fd: Int32
    let peer: String
    init(fd: Int32, peer: String) {
        self.fd = fd
        self.peer = peer
    }
    func take() -> Int32 {
        defer { fd = -1 }
        return fd
    }
    deinit { if fd >= 0 { closeDescriptor(fd) } }
}

/// Where a listener's socket comes from.
enum ListeningSocket {
    /// A new socket bound to `host:port` and listening with `backlog`.
    case binding(host: String, port: UInt16, backlog: Int32)
    /// A descriptor that already listens (socket activation): checked, then owned.
    case adopting(Int32)
}

final class ListenerSource: Source {
    private var listener: SocketListener?
    private let target = Target()
    /// Weak: the group's loops hold this source, so a strong reference would be a cycle.
    private weak var group: EventLoopGroup?
    private let options: Connection.Options
    private var accept: (@Sendable (Connection) -> Void)?
    private var accepted: [AcceptedSocket] = []
    private var pauseTimer: TimerHandle?
    private(set) var port: UInt16 = 0
    private(set) var localAddress = ""
    private(set) var acceptedCount = 0

    /// The one initialiser every kind of listener goes through, whether it binds a new socket or
    /// adopts a descriptor that already listens.
    init(loop: EventLoop, socket: ListeningSocket, group: EventLoopGroup?, options: Connection.Options,
         accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        _ = ignoreSIGPIPE
        self.group = group
        self.options = options
        self.accept = accept
        super.init(loop: loop, priority: .input)
        target.source = self
        do {
            let made = switch socket {
            case .binding(let host, let port, let backlog):
                try SocketListener(base: loop.base, host: host, port: port, backlog: backlog, target: target)
            case .adopting(let fd):
                try SocketListener(base: loop.base, adopting: fd, target: target)
            }
            self.port = made.port
            self.localAddress = made.localAddress
            listener = made
        } catch {
            close()
            throw error
        }
    }

    override func perform(_ readiness: Readiness) {
        if readiness.contains(.signal) { pauseAfterAcceptFailure() }
        let batch = accepted
        accepted.removeAll()
        for socket in batch where !isClosed {
            acceptedCount += 1
            hand(socket)
        }
    }

    private func hand(_ socket: AcceptedSocket) {
        guard let accept else { return }
        let options = self.options
        let destination = group?.next() ?? loop
        let deliver: @Sendable () -> Void = {
            do {
                let source = try ConnectionSource(loop: destination, fd: socket.take(), peer: socket.peer,
                                                  options: options)
                accept(Connection(source: source))
            } catch {
                // The fd was closed by ConnectionSource; nothing to hand over.
            }
        }
        if destination === loop { deliver() } else { destination.execute(priority: .input, deliver) }
    }

    /// EMFILE/ENFILE: the listening socket stays readable, so stop polling it for a while.
    private func pauseAfterAcceptFailure() {
        guard pauseTimer == nil, let listener else { return }
        listener.disable()
        pauseTimer = loop.schedule(after: .milliseconds(100)) { [weak self] in
            guard let self, !self.isClosed else { return }
            self.pauseTimer = nil
            self.listener?.enable()
        }
    }

    override func didClose() {
        listener = nil
        accept = nil
        accepted.removeAll()  // closes the fds
        pauseTimer?.cancel()
        pauseTimer = nil
    }

    private final class Target: SocketListenerTarget {
        weak var source: ListenerSource?
        override func accepted(fd: Int32, peer: String) {
            guard let source else {
                closeDescriptor(fd)
                return
            }
            source.accepted.append(AcceptedSocket(fd: fd, peer: peer))
            source.fire(.read)
        }
        override func acceptFailed(errno: Int32) {
            source?.fire(.signal)
        }
    }
}
