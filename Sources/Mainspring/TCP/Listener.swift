import Synchronization

/// A listening TCP socket: accepts connections on one loop and hands each to a handler, or to
/// the task iterating `connections` — created on that loop or spread over an `EventLoopGroup`.
///
/// ```swift
/// // Callbacks: made on the loop's thread, each connection handed to `accept` on its loop.
/// let listener = try Listener(.tcp(port: 7000), on: loop, group: group) { connection in … }
///
/// // Async: made from any task, connections iterated.
/// let listener = try await Listener(.tcp(port: 7000), on: group.loops[0], group: group)
/// for try await connection in listener.connections { … }
/// ```
///
/// Where it listens is an ``Endpoint`` — a TCP port, a Unix path, a descriptor that already
/// listens, a socket systemd passed — given to the one initializer of each form: with a handler
/// (``init(_:on:group:options:accept:)``, loop thread) or for `connections`
/// (``init(_:on:group:options:)``, any task). `MainspringTLS` adds `tls:` to both.
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
    /// - Throws: `EventLoopError.invalidAddress`, `.bindNeedsAddress` (a host name: resolve it
    ///   first with `EventLoop.resolve(_:port:timeout:)`), `.system` (address in use, …),
    ///   `.wrongThread`.
    @available(*, deprecated, message: "use Listener(.tcp(host:port:backlog:), on:group:options:accept:)")
    public convenience init(host: String = "127.0.0.1", port: UInt16 = 0, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), backlog: Int32 = 511,
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(socket: .binding(host: host, port: port, backlog: backlog), on: loop, group: group, options: options,
                      preparer: nil, function: "Listener.init(host:port:on:…)", accept: accept)
    }

    /// The callback initialisers' common part: makes the source on `loop`, delivering to `accept`.
    init(socket: ListeningSocket, on loop: EventLoop, group: EventLoopGroup?, options: Connection.Options,
                 preparer: (any AcceptedSocketPreparer)?, function: StaticString,
                 accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        guard loop.claimThread() else { throw .wrongThread(function: "\(function)") }
        let shared = ListenerShared()
        source = try ListenerSource(loop: loop, socket: socket, group: group, options: options, delivery: .handler(accept),
                                    shared: shared, preparer: preparer)
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
    @available(*, deprecated, message: "use Listener(.adopted(descriptor:), on:group:options:accept:)")
    public convenience init(adopting descriptor: Int32, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init(), accept: @escaping @Sendable (Connection) -> Void)
        throws(EventLoopError)
    {
        try self.init(socket: .adopting(descriptor), on: loop, group: group, options: options, preparer: nil,
                      function: "Listener.init(adopting:on:…)", accept: accept)
    }

    /// Listens on `host:port` like the callback initialiser, and queues the accepted
    /// connections for `connections`. Any task: it hops to `loop` to bind (no hop from a task
    /// that prefers `loop`).
    ///
    /// Accepting pauses while `maxWaitingConnections` accepted connections wait to be taken,
    /// so a consumer that lags leaves further clients in the kernel's backlog.
    /// - Throws: `EventLoopError.invalidAddress`, `.bindNeedsAddress` (a host name: resolve it
    ///   first with `EventLoop.resolve(_:port:timeout:)`), `.system` (address in use, …),
    ///   `.loopClosed`.
    @available(*, deprecated, message: "use Listener(.tcp(host:port:backlog:), on:group:options:) async")
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
    @available(*, deprecated, message: "use Listener(.adopted(descriptor:), on:group:options:) async")
    public convenience init(adopting descriptor: Int32, on loop: EventLoop, group: EventLoopGroup? = nil,
                            options: Connection.Options = .init()) async throws(EventLoopError)
    {
        try await self.init(socket: .adopting(descriptor), on: loop, group: group, options: options)
    }

    /// The async initialisers' common part: makes the source on `loop`, delivering to a queue.
    init(socket: ListeningSocket, on loop: EventLoop, group: EventLoopGroup?, options: Connection.Options,
                 preparer: (any AcceptedSocketPreparer)? = nil) async throws(EventLoopError)
    {
        let queue = ConnectionQueue()
        let shared = ListenerShared()
        let made: Result<(LoopBound<ListenerSource>, UInt16, String), EventLoopError> = await withUnsafeContinuation {
            continuation in
            let start: @Sendable () -> Void = {
                do throws(EventLoopError) {
                    let source = try ListenerSource(loop: loop, socket: socket, group: group, options: options,
                                                    delivery: .queue(queue), shared: shared, preparer: preparer)
                    continuation.resume(returning: .success((LoopBound(source), source.port,
                                                             source.localAddress)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
            loop.executeNowOrPost(start, orElse: { continuation.resume(returning: .failure(.loopClosed)) })
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

    /// The library's rule for handles: dropping the last one ends nothing that can still run. A
    /// listener with an accept handler lives on until `close()` or its loop's shutdown; one made
    /// for `connections` whose handle and sequences are all gone could hand its connections to
    /// nobody, so it closes as `close()` closes it (the connections it had accepted close too).
    deinit {
        guard queue != nil else { return }
        let source = LoopBound(self.source)
        loop.execute { source.value.close() }
    }

    /// Stops accepting and closes the listening socket. Connections already accepted are not
    /// affected (those still waiting in `connections` are delivered, then the iteration ends).
    /// Idempotent. Any thread: on the loop's thread the socket closes at once, from elsewhere
    /// the close is posted to the loop.
    public func close() {
        if loop.isCurrent {
            source.close()
        } else {
            let source = LoopBound(self.source)
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
            usageFailure("Mainspring: Listener.connections: this listener hands its connections to its accept handler; make it with the async initialiser (no handler) to iterate them")
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

            public nonisolated(nonsending) mutating func next() async throws(CancellationError) -> Connection? {
                try await listener.nextConnection()
            }

            /// `next()`, on the caller's executor (see `Connection.Lines.Iterator`).
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async throws(CancellationError) -> Connection? {
                try await listener.nextConnection()
            }
        }
    }

    private nonisolated(nonsending) func nextConnection() async throws(CancellationError) -> Connection? {
        let isolation = #isolation
        guard let queue else { return nil }
        if Task.isCancelled {
            cancelFromTask()
            throw CancellationError()
        }
        let taken = queue.take()
        if taken.resumeAccepting { resumeAccepting() }
        switch taken.outcome {
        case .element(let connection): return connection
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
        case .element(let connection): return connection
        case .end: return nil
        case .wait: throw CancellationError()  // resumed by the cancellation
        }
    }

    /// Stops accepting (`false`: new connections wait in the kernel's listen backlog) or
    /// accepts again (`true`), for an owner with a connection limit of its own (the HTTP
    /// server's `maxConnections`). A listener out of descriptors still waits out its pause.
    /// The listener's loop's thread only.
    package func setAccepting(_ accepting: Bool) {
        loop.preconditionOnLoop("Listener.setAccepting(_:)")
        source.setAccepting(accepting)
    }

    private func resumeAccepting() {
        source.postResumeAfterConsumer()
    }

    private func cancelFromTask() { close() }
}

/// What a `Listener` handle reads from any thread.
final class ListenerShared: Sendable {
    let accepted = Atomic<Int>(0)
    let isClosed = Atomic<Bool>(false)
}
