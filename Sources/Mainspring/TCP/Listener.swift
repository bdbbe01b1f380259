import Synchronization

/// A listening TCP socket: accepts connections on one loop and hands each to a handler, or to
/// the task iterating `connections` — created on that loop or spread over an `EventLoopGroup`.
///
/// ```swift
/// // Callbacks: made on the loop's thread, each connection handed to `accept` on its loop.
/// let listener = try Listener(port: 7000, on: loop, group: group) { connection in … }
///
/// // Async: made from any task, connections iterated.
/// let listener = try await Listener(port: 7000, on: group.loops[0], group: group)
/// for try await connection in listener.connections { … }
/// ```
///
/// When `accept(2)` runs out of file descriptors (`EMFILE`, `ENFILE`), the listener pauses for
/// 100 ms instead of spinning on the still-readable listening socket, then resumes.
///
/// The handle is `Sendable`: `close()`, its properties and the async members work from any
/// thread; the callback initialiser is loop-thread only.
public final class Listener: @unchecked Sendable {
    /// Loop thread only.
    private let source: ListenerSource
    private let queue: ConnectionQueue?
    private let shared: ListenerShared

    /// The loop that accepts (the handle keeps it alive). Any thread.
    public let loop: EventLoop

    /// The bound port. Any thread.
    public let port: UInt16

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
        let shared = ListenerShared()
        source = try ListenerSource(loop: loop, socket: .binding(host: host, port: port, backlog: backlog),
                                    group: group, options: options, delivery: .handler(accept), shared: shared)
        self.shared = shared
        self.queue = nil
        self.loop = loop
        self.port = source.port
        self.localAddress = source.localAddress
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
        let shared = ListenerShared()
        source = try ListenerSource(loop: loop, socket: .adopting(descriptor), group: group, options: options,
                                    delivery: .handler(accept), shared: shared)
        self.shared = shared
        self.queue = nil
        self.loop = loop
        self.port = source.port
        self.localAddress = source.localAddress
    }

    /// Listens on `host:port` like the callback initialiser, and queues the accepted
    /// connections for `connections`. Any task: it hops to `loop` to bind (no hop from a task
    /// that prefers `loop`).
    ///
    /// Accepting pauses while `maxWaitingConnections` accepted connections wait to be taken,
    /// so a consumer that lags leaves further clients in the kernel's backlog.
    /// - Throws: `EventLoopError.invalidAddress`, `.system` (address in use, …), `.loopClosed`.
    public convenience init(host: String = "127.0.0.1", port: UInt16 = 0, on loop: EventLoop,
                            group: EventLoopGroup? = nil, options: Connection.Options = .init(),
                            backlog: Int32 = 511) async throws(EventLoopError)
    {
        try await self.init(socket: .binding(host: host, port: port, backlog: backlog), on: loop, group: group,
                            options: options)
    }

    /// Accepts on `descriptor` (a socket that already listens; see the callback
    /// ``init(adopting:on:group:options:accept:)`` for the checks and the ownership), and queues
    /// the accepted connections for `connections`. Any task.
    /// - Throws: `EventLoopError.notListeningSocket`, `.system`, `.libevent`, `.loopClosed`.
    public convenience init(adopting descriptor: Int32, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init()) async throws(EventLoopError)
    {
        try await self.init(socket: .adopting(descriptor), on: loop, group: group, options: options)
    }

    /// The async initialisers' common part: makes the source on `loop`, delivering to a queue.
    private init(socket: ListeningSocket, on loop: EventLoop, group: EventLoopGroup?, options: Connection.Options)
        async throws(EventLoopError)
    {
        let queue = ConnectionQueue()
        let shared = ListenerShared()
        let made: Result<(UncheckedListenerSource, UInt16, String), EventLoopError> = await withUnsafeContinuation {
            continuation in
            let start: @Sendable () -> Void = {
                do throws(EventLoopError) {
                    let source = try ListenerSource(loop: loop, socket: socket, group: group, options: options,
                                                    delivery: .queue(queue), shared: shared)
                    continuation.resume(returning: .success((UncheckedListenerSource(source), source.port,
                                                             source.localAddress)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
            if loop.isCurrent {
                start()
            } else {
                loop.execute(start, orElse: { continuation.resume(returning: .failure(.loopClosed)) })
            }
        }
        let (source, boundPort, boundAddress) = try made.get()
        self.source = source.value
        self.shared = shared
        self.queue = queue
        self.loop = loop
        self.port = boundPort  // read on the loop's thread
        self.localAddress = boundAddress
    }

    /// The address the socket is bound to, for messages: `127.0.0.1:7000`, `[::1]:7000`, or a
    /// unix socket's path (`@name` in the abstract namespace). Any thread.
    public let localAddress: String

    /// Accepted connections waiting to be taken from `connections` above which accepting pauses.
    public static let maxWaitingConnections = 16

    /// Connections accepted so far. Any thread.
    public var acceptedCount: Int { shared.accepted.load(ordering: .relaxed) }

    /// Whether the listener still accepts connections. Any thread.
    public var isListening: Bool { !shared.isClosed.load(ordering: .acquiring) }

    /// Stops accepting and closes the listening socket. Connections already accepted are not
    /// affected (those still waiting in `connections` are delivered, then the iteration ends).
    /// Idempotent. Any thread: on the loop's thread the socket closes at once, from elsewhere
    /// the close is posted to the loop.
    public func close() {
        if loop.isCurrent {
            source.close()
        } else {
            let source = UncheckedListenerSource(self.source)
            loop.execute { source.value.close() }
        }
    }

    /// The accepted connections, each on its loop (`connection.loop`), for a listener made
    /// without a handler. Ends when the listener is closed (after the connections it had
    /// accepted) or its loop shuts down.
    ///
    /// One consumer (a second iteration is a precondition failure). Cancelling the iterating task
    /// closes the listener and throws `CancellationError`. Serve each connection in a task of its
    /// own on its loop:
    ///
    /// ```swift
    /// try await withThrowingDiscardingTaskGroup { tasks in
    ///     for try await connection in listener.connections {
    ///         tasks.addTask(executorPreference: connection.loop) { await serve(connection) }
    ///     }
    /// }
    /// ```
    public var connections: Connections {
        guard let queue else {
            preconditionFailure("Mainspring: Listener.connections: this listener hands its connections to its accept handler; make it with the async initialiser (no handler) to iterate them")
        }
        return Connections(listener: self, queue: queue)
    }

    /// `Listener.connections`: an `AsyncSequence` of accepted `Connection`s.
    public struct Connections: AsyncSequence, Sendable {
        public typealias Element = Connection
        public typealias Failure = CancellationError
        let listener: Listener
        let queue: ConnectionQueue

        /// Claims the connections (precondition: the first and only consumer).
        public func makeAsyncIterator() -> Iterator {
            queue.claim()
            return Iterator(listener: listener, queue: queue)
        }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let listener: Listener
            let queue: ConnectionQueue

            public mutating func next() async throws(CancellationError) -> Connection? {
                try await next(isolation: nil)
            }

            public mutating func next(isolation actor: isolated (any Actor)?) async throws(CancellationError) -> Connection? {
                try await listener.nextConnection(isolation: actor)
            }
        }
    }

    private func nextConnection(isolation: isolated (any Actor)?) async throws(CancellationError) -> Connection? {
        guard let queue else { return nil }
        if Task.isCancelled {
            cancelFromTask()
            throw CancellationError()
        }
        let taken = queue.take()
        if taken.resumeAccepting { resumeAccepting() }
        switch taken.outcome {
        case .connection(let connection): return connection
        case .end: return nil
        case .wait: break
        }
        let outcome: ConnectionQueue.Outcome = await withTaskCancellationHandler(operation: {
            await withUnsafeContinuation(isolation: isolation) { continuation in
                let taken = queue.takeOrPark(continuation)
                if taken.resumeAccepting { resumeAccepting() }
            }
        }, onCancel: {
            queue.cancelWaiter()
            self.cancelFromTask()
        }, isolation: isolation)
        switch outcome {
        case .connection(let connection): return connection
        case .end: return nil
        case .wait: throw CancellationError()  // resumed by the cancellation
        }
    }

    private func resumeAccepting() {
        let source = UncheckedListenerSource(self.source)
        loop.execute { source.value.resumeAfterConsumer() }
    }

    private func cancelFromTask() { close() }
}

/// What a `Listener` handle reads from any thread.
final class ListenerShared: Sendable {
    let accepted = Atomic<Int>(0)
    let isClosed = Atomic<Bool>(false)
}

/// Carries the loop-side state to the loop's thread (only used there).
struct UncheckedListenerSource: @unchecked Sendable {
    let value: ListenerSource
    init(_ value: ListenerSource) { self.value = value }
}

/// The accepted connections of a listener without a handler, between the loops that create
/// them and the task that takes them. One lock; the continuation is resumed outside it.
final class ConnectionQueue: Sendable {
    enum Outcome: Sendable {
        case connection(Connection)
        case end
        case wait
    }

    private struct State {
        var ready: [Connection] = []
        var first = 0
        /// Accepted and not yet taken (including those on their way to their loop).
        var pending = 0
        var waiter: UnsafeContinuation<Outcome, Never>?
        var isFinished = false
        var isClaimed = false
        var acceptIsPaused = false
        /// The consumer's task was cancelled: it never waits again.
        var isCancelled = false
    }

    private let state = Protected(State())

    func claim() {
        let claimed = state.withLock { state -> Bool in
            defer { state.isClaimed = true }
            return !state.isClaimed
        }
        precondition(claimed, "Mainspring: Listener.connections: the connections already have a consumer; iterate them once, from one task")
    }

    /// Acceptor thread: one more connection accepted. Returns whether accepting must pause.
    func reserve() -> Bool {
        state.withLock { state in
            state.pending += 1
            if state.pending >= Listener.maxWaitingConnections && !state.acceptIsPaused {
                state.acceptIsPaused = true
                return true
            }
            return false
        }
    }

    /// Whether the consumer's task is suspended waiting for a connection.
    var hasWaiter: Bool { state.withLock { $0.waiter != nil } }

    /// Whether accepting is paused for the consumer.
    var isAcceptPaused: Bool { state.withLock { $0.acceptIsPaused } }

    /// A reserved connection could not be made (its fd was closed).
    func release() {
        let (waiter, outcome) = state.withLock { state -> (UnsafeContinuation<Outcome, Never>?, Outcome) in
            state.pending -= 1
            return Self.wakeIfDone(&state)
        }
        waiter?.resume(returning: outcome)
    }

    /// A reserved connection is ready, on its loop.
    func push(_ connection: Connection) {
        let waiter = state.withLock { state -> UnsafeContinuation<Outcome, Never>? in
            guard let waiter = state.waiter else {
                state.ready.append(connection)
                return nil
            }
            state.waiter = nil
            state.pending -= 1
            return waiter
        }
        waiter?.resume(returning: .connection(connection))
    }

    /// The listener closed: the consumer ends once the pending connections are delivered.
    func finish() {
        let (waiter, outcome) = state.withLock { state -> (UnsafeContinuation<Outcome, Never>?, Outcome) in
            state.isFinished = true
            return Self.wakeIfDone(&state)
        }
        waiter?.resume(returning: outcome)
    }

    private static func wakeIfDone(_ state: inout State) -> (UnsafeContinuation<Outcome, Never>?, Outcome) {
        guard state.isFinished, state.pending == 0, let waiter = state.waiter else { return (nil, .end) }
        state.waiter = nil
        return (waiter, .end)
    }

    /// Takes a ready connection, or tells whether the iteration has ended; `resumeAccepting`
    /// when accepting was paused and may resume now.
    func take() -> (outcome: Outcome, resumeAccepting: Bool) {
        state.withLock { Self.take(&$0) }
    }

    /// `take`, or parks `continuation` until a connection arrives or the listener closes.
    func takeOrPark(_ continuation: UnsafeContinuation<Outcome, Never>) -> (outcome: Outcome, resumeAccepting: Bool) {
        let (taken, parked) = state.withLock { state -> ((outcome: Outcome, resumeAccepting: Bool), Bool) in
            let taken = Self.take(&state)
            guard case .wait = taken.outcome, !state.isCancelled else { return (taken, false) }
            state.waiter = continuation
            return (taken, true)
        }
        // Not parked: a connection, the end, or a cancelled consumer (`.wait`: its `next` throws).
        if !parked { continuation.resume(returning: taken.outcome) }
        return taken
    }

    private static func take(_ state: inout State) -> (outcome: Outcome, resumeAccepting: Bool) {
        if state.first < state.ready.count {
            let connection = state.ready[state.first]
            state.first += 1
            if state.first == state.ready.count {
                state.ready.removeAll(keepingCapacity: true)
                state.first = 0
            }
            state.pending -= 1
            var resume = false
            if state.acceptIsPaused && state.pending < Listener.maxWaitingConnections {
                state.acceptIsPaused = false
                resume = true
            }
            return (.connection(connection), resume)
        }
        if state.isFinished && state.pending == 0 { return (.end, false) }
        return (.wait, false)
    }

    /// The consumer's task was cancelled: resumes it (its `next` then throws).
    func cancelWaiter() {
        let waiter = state.withLock { state -> UnsafeContinuation<Outcome, Never>? in
            state.isCancelled = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: .wait)
    }
}

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
    /// Where accepted connections go.
    enum Delivery {
        case handler(@Sendable (Connection) -> Void)
        case queue(ConnectionQueue)
    }

    private var listener: SocketListener?
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
    init(loop: EventLoop, socket: ListeningSocket, group: EventLoopGroup?, options: Connection.Options,
         delivery: Delivery, shared: ListenerShared) throws(EventLoopError)
    {
        _ = ignoreSIGPIPE
        self.group = group
        self.options = options
        self.delivery = delivery
        self.shared = shared
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
        switch delivery {
        case .handler(let accept):
            deliver = {
                do {
                    let source = try ConnectionSource(loop: destination, fd: socket.take(), peer: socket.peer,
                                                      options: options)
                    accept(Connection(source: source))
                } catch {
                    // The fd was closed by ConnectionSource; nothing to hand over.
                }
            }
        case .queue(let queue):
            if queue.reserve() { listener?.disable() }
            deliver = {
                do {
                    let source = try ConnectionSource(loop: destination, fd: socket.take(), peer: socket.peer,
                                                      options: options)
                    queue.push(Connection(source: source))
                } catch {
                    queue.release()
                }
            }
            release = { queue.release() }
        }
        if destination === loop { deliver() } else { destination.execute(priority: .input, deliver, orElse: release) }
    }

    /// The task suspended in `connections`, if any.
    var suspendedTasks: Int {
        if case .queue(let queue) = delivery, queue.hasWaiter { return 1 }
        return 0
    }

    /// The consumer of `connections` caught up: accept again (unless out of descriptors).
    func resumeAfterConsumer() {
        guard !isClosed, pauseTimer == nil else { return }
        listener?.enable()
    }

    /// EMFILE/ENFILE: the listening socket stays readable, so stop polling it for a while.
    private func pauseAfterAcceptFailure() {
        guard pauseTimer == nil, let listener else { return }
        listener.disable()
        pauseTimer = loop.schedule(after: .milliseconds(100)) { [weak self] in
            guard let self, !self.isClosed else { return }
            self.pauseTimer = nil
            if case .queue(let queue) = self.delivery, queue.isAcceptPaused { return }
            self.listener?.enable()
        }
    }

    override func didClose() {
        shared.isClosed.store(true, ordering: .releasing)
        listener = nil
        if case .queue(let queue) = delivery { queue.finish() }
        delivery = nil
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
