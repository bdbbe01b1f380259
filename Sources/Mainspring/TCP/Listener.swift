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
        source = try ListenerSource(loop: loop, host: host, port: port, group: group, options: options,
                                    backlog: backlog, accept: accept)
    }

    /// The bound port.
    public var port: UInt16 { source.port }

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
    private(set) var acceptedCount = 0

    init(loop: EventLoop, host: String, port: UInt16, group: EventLoopGroup?, options: Connection.Options,
         backlog: Int32, accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        _ = ignoreSIGPIPE
        self.group = group
        self.options = options
        self.accept = accept
        super.init(loop: loop, priority: .input)
        target.source = self
        do {
            let socket = try SocketListener(base: loop.base, host: host, port: port, backlog: backlog, target: target)
            self.port = socket.port
            listener = socket
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
