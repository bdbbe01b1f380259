/// An accepted socket on its way to another loop: released if it never gets there.
private final class AcceptedSocket: @unchecked Sendable {
    private var endpoint: StreamEndpoint?
    let peer: String
    init(_ endpoint: StreamEndpoint, peer: String) {
        self.endpoint = endpoint
        self.peer = peer
    }
    /// The endpoint, now the caller's (nil if taken already).
    func take() -> StreamEndpoint? {
        defer { endpoint = nil }
        return endpoint
    }
    deinit { endpoint?.release() }
}

/// Where a listener's socket comes from.
enum ListeningSocket {
    /// A new socket bound to `host:port` and listening with `backlog`.
    case binding(host: String, port: UInt16, backlog: Int32)
    /// A descriptor that already listens (socket activation): checked, then owned.
    case adopting(Int32)
    /// A new Unix stream socket at `path` ("@name": abstract), its file made with `mode`.
    case unix(path: String, mode: UInt16?, backlog: Int32)
}

/// A step between accepting a socket and handing its connection over — a TLS handshake
/// (`MainspringTLS`) — that a listener made with it runs on the connection's loop.
package protocol AcceptedSocketPreparer: Sendable {
    /// On `loop`'s thread: makes the connection over `endpoint` (now the preparer's to release),
    /// at its own pace, then calls `done` once, on `loop`'s thread, with the connection — or nil
    /// if it could not be made (the endpoint is then released, and the preparer counted or
    /// reported why).
    func prepare(_ endpoint: StreamEndpoint, peer: String, on loop: EventLoop, options: Connection.Options,
                 done: @escaping (Connection?) -> Void)
}

final class ListenerSource: Source {
    /// Where accepted connections go.
    enum Delivery {
        case handler(@Sendable (Connection) -> Void)
        case queue(ConnectionQueue)
    }

    /// The listening socket, as the loop's world made it (nil once closed).
    private var listener: (any ListeningPort)?
    private let target = Target()
    /// Weak: the group's loops hold this source, so a strong reference would be a cycle.
    private weak var group: EventLoopGroup?
    private let options: Connection.Options
    private var delivery: Delivery?
    private let shared: ListenerShared
    private var accepted: [AcceptedSocket] = []
    private var pauseTimer: TimerHandle?
    private(set) var port: UInt16 = 0
    private(set) var localAddress = ""

    /// The one initialiser every kind of listener goes through, whether it binds a new socket or
    /// adopts a descriptor that already listens, and hands connections to a handler or a queue.
    /// Runs between the accept and the hand-over (a TLS handshake), if set.
    private let preparer: (any AcceptedSocketPreparer)?

    init(loop: EventLoop, socket: ListeningSocket, group: EventLoopGroup?, options: Connection.Options,
         delivery: Delivery, shared: ListenerShared, preparer: (any AcceptedSocketPreparer)? = nil) throws(EventLoopError)
    {
        _ = ignoreSIGPIPE
        options.check("Listener")
        self.group = group
        self.options = options
        self.delivery = delivery
        self.shared = shared
        self.preparer = preparer
        super.init(loop: loop, priority: .input)
        target.source = self
        do {
            let made = try loop.world.listen(socket, on: loop, target: target)
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
            shared.accepted.add(1, ordering: .relaxed)
            hand(socket)
        }
    }

    private func hand(_ socket: AcceptedSocket) {
        guard let delivery else { return }
        let options = self.options
        let destination = group?.next() ?? loop
        let deliver: @Sendable () -> Void
        var release: @Sendable () -> Void = {}
        // Makes the connection on its loop — at once, or through the preparer (then a
        // connection that fails on its way is simply not delivered).
        let preparer = self.preparer
        // A simulated program's listener: what it accepts is the program's too, on any loop.
        let owner = loop.simulatedOwner(of: self)
        let make: @Sendable (@escaping (Connection?) -> Void) -> Void = { done in
            guard let endpoint = socket.take() else { return done(nil) }
            if let preparer {
                // What the preparer opens for it (a handshake's timer) is the simulated program's
                // too, wherever this runs: it ends with the program.
                SimulatedOwnership.$current.withValue(owner) {
                    preparer.prepare(endpoint, peer: socket.peer, on: destination, options: options) { connection in
                        if let connection, let owner { destination.setSimulatedOwner(owner, of: connection.source) }
                        done(connection)
                    }
                }
                return
            }
            // nil only when the loop cannot make the socket (out of memory, descriptors): the
            // endpoint was released, and the connection is not delivered.
            let source = try? ConnectionSource(loop: destination, endpoint: endpoint, peer: socket.peer, options: options)
            if let source, let owner { destination.setSimulatedOwner(owner, of: source) }
            done(source.map { Connection(source: $0) })
        }
        switch delivery {
        case .handler(let accept):
            deliver = { make { connection in if let connection { accept(connection) } } }
        case .queue(let queue):
            // Connections being prepared (a TLS handshake, which may take its client's time)
            // are not counted against the queue until they are ready: a few slow clients must
            // not stop the listener.
            let prepares = preparer != nil
            if !prepares, queue.reserve() { stopAccepting() }
            // Runs on the connection's loop; accepting resumes on this one.
            let acceptor = LoopBound(self)
            let resumeAccepting: @Sendable (Bool) -> Void = { resume in
                if resume { acceptor.value.postResumeAfterConsumer() }
            }
            let pause: @Sendable () -> Void = { acceptor.value.postPauseForConsumer() }
            deliver = {
                make { connection in
                    guard let connection else {
                        if !prepares { resumeAccepting(queue.release()) }
                        return
                    }
                    if prepares, queue.reserve() { pause() }
                    resumeAccepting(queue.push(connection))
                }
            }
            release = { if !prepares { resumeAccepting(queue.release()) } }
        }
        if destination === loop { deliver() } else { destination.execute(priority: .input, deliver, orElse: release) }
    }

    /// The consumer of `connections` lags (prepared connections reached the limit): stop
    /// accepting until it catches up. Posted to the listener's loop from the connection's; the
    /// queue's state decides there, so a pause and a resume that cross on their way agree.
    func postPauseForConsumer() {
        let source = LoopBound(self)
        loop.execute { source.value.resumeAfterConsumer() }
    }

    /// The task suspended in `connections`, if any.
    var suspendedTasks: Int {
        if case .queue(let queue) = delivery, queue.hasWaiter { return 1 }
        return 0
    }

    /// The consumer of `connections` caught up: accept again (unless out of descriptors).
    func resumeAfterConsumer() {
        guard !isClosed, pauseTimer == nil else { return }
        if case .queue(let queue) = delivery, queue.isAcceptPaused {
            stopAccepting()
            return
        }
        enableAccepting()
    }

    /// Accepts again; if the loop refuses the listening socket, the listener fails (it would
    /// never accept again): counted in `LoopMetrics.sourceFailures`, and closed — `isListening`
    /// turns false and `connections` ends.
    private func enableAccepting() {
        do {
            try listener?.setAccepting(true)
        } catch {
            registrationFailed(error)
        }
    }

    /// `resumeAfterConsumer`, asked from any thread (the consumer's task, a connection's loop):
    /// posted to the listener's loop.
    func postResumeAfterConsumer() {
        let source = LoopBound(self)
        loop.execute { source.value.resumeAfterConsumer() }
    }

    /// The owner's own pause (`Listener.setAccepting`): off, as when the consumer lags; on
    /// again unless closed or out of descriptors.
    func setAccepting(_ accepting: Bool) {
        guard !isClosed else { return }
        if !accepting {
            stopAccepting()
        } else if pauseTimer == nil {
            enableAccepting()
        }
    }

    /// EMFILE/ENFILE: the listening socket stays readable, so stop polling it for a while.
    private func pauseAfterAcceptFailure() {
        guard pauseTimer == nil, let listener else { return }
        try? listener.setAccepting(false)  // stopping cannot fail
        pauseTimer = loop.schedule(after: .milliseconds(100)) { [weak self] in
            guard let self, !self.isClosed else { return }
            self.pauseTimer = nil
            if case .queue(let queue) = self.delivery, queue.isAcceptPaused { return }
            self.enableAccepting()
        }
    }

    /// Stops accepting (the backlog holds new connections).
    private func stopAccepting() {
        try? listener?.setAccepting(false)  // stopping cannot fail
    }

    override func didClose() {
        shared.isClosed.store(true, ordering: .releasing)
        listener?.close()
        listener = nil
        if case .queue(let queue) = delivery { queue.finish() }
        delivery = nil
        accepted.removeAll()  // closes the fds
        pauseTimer?.cancel()
        pauseTimer = nil
    }

    private final class Target: SocketListenerTarget {
        weak var source: ListenerSource?
        override func accepted(_ endpoint: StreamEndpoint, peer: String) {
            guard let source else {
                endpoint.release()
                return
            }
            source.accepted.append(AcceptedSocket(endpoint, peer: peer))
            source.fire(.read)
        }
        override func acceptFailed(errno: Int32) {
            source?.fire(.signal)
        }
    }
}
