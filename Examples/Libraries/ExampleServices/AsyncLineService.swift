import Foundation
import Mainspring
import MainspringTLS
import Synchronization

/// `LineService`'s protocol, limits and replies, written with async/await: the listener's
/// connections are iterated in a task on the acceptor loop, and each connection is served by an
/// actor pinned to its own loop, run by a child task that prefers that loop — so reading a
/// line, handling it and sending the reply never leave the connection's thread.
///
/// Requests are pipelined as in `LineService`: a `SLEEP` (a child task awaiting the loop's
/// timer) or a `WORK` (fed through the loop's `Feeder`) does not hold back the requests behind
/// it from being processed, only their replies from being sent before its own. One task sends
/// at a time, in request order; while the peer does not read, `send` suspends, reading stops,
/// and the peer's sends block in TCP.
public final class AsyncLineService: Sendable {
    public let group: EventLoopGroup
    public let options: LineService.Options
    /// The port the service listens on (its first endpoint's; 0 on a unix socket).
    public let port: UInt16
    /// The address the service listens on ("127.0.0.1:7000", a unix socket's path): its first
    /// endpoint's.
    public var localAddress: String { listeners[0].localAddress }
    /// Every address the service listens on, in the order of its endpoints.
    public var localAddresses: [String] { listeners.map(\.localAddress) }
    private let listeners: [Listener]
    private let registry: SessionRegistry
    private let stats: StatsCounters
    private let serving: [Task<Void, Never>]

    /// Starts listening on `host:port` (0: any free port, see `port`) and serving; connections
    /// are spread over the group's loops. Any task.
    public convenience init(group: EventLoopGroup, host: String = "127.0.0.1", port: UInt16 = 0,
                            options: LineService.Options = .init(), tls: TLSServerContext? = nil) async throws
    {
        try await self.init(group: group, endpoint: .address(host: host, port: port), options: options, tls: tls)
    }

    /// Starts serving on `endpoint` — a new socket, or one passed by socket activation —, over
    /// TLS when `tls` is given. Connections are spread over the group's loops. Any task.
    public convenience init(group: EventLoopGroup, endpoint: LineService.Endpoint, options: LineService.Options = .init(),
                            tls: TLSServerContext? = nil) async throws
    {
        try await self.init(group: group, endpoints: [endpoint], options: options, tls: tls)
    }

    /// Starts serving on every one of `endpoints` (at least one: a TCP address and a unix
    /// socket, say), one listener each, with the same counters, limits and loops. `tls` applies
    /// to the TCP and activated endpoints; a unix endpoint with `tls` is
    /// `LineServiceError.tlsOnUnixSocket`. If one endpoint cannot listen, those already
    /// listening are closed and the error is thrown. Any task.
    public init(group: EventLoopGroup, endpoints: [LineService.Endpoint], options: LineService.Options = .init(),
                tls: TLSServerContext? = nil) async throws
    {
        precondition(!endpoints.isEmpty, "AsyncLineService needs at least one endpoint")
        self.group = group
        self.options = options
        let stats = StatsCounters(requestCounter: options.requestCounter)
        let registry = SessionRegistry()
        let connectionOptions = Connection.Options(maxLineLength: options.maxLineLength,
                                                   outputLimit: options.outputLimit, idleTimeout: options.idleTimeout)
        var listeners: [Listener] = []
        do {
            for endpoint in endpoints {
                listeners.append(try await Self.listen(on: endpoint, group: group, options: connectionOptions, tls: tls))
            }
        } catch {
            for listener in listeners { listener.close() }
            throw error
        }
        let loops = group.loops
        let startTime = loops[0].monotonicNow()
        let hosts = loops.map { loop in
            SessionHost(feeder: Feeder(loop: loop, priority: .background, pacing: options.workPacing), stats: stats,
                        registry: registry, startTime: startTime, options: options)
        }
        self.serving = listeners.map { listener in
            Task(executorPreference: loops[0]) {
                // A throwing group, though no session throws: its child closures are then
                // `async throws` as the runtime calls them, with no reabstraction thunk (two
                // more frames in every idle connection's task). `try?` drops nothing: the
                // sessions never throw and the loop below catches its own end.
                try? await withThrowingDiscardingTaskGroup { tasks in
                    do {
                        for try await connection in listener.connections {
                            stats.accepted.add(1, ordering: .relaxed)
                            stats.open.add(1, ordering: .relaxed)
                            let host = hosts[loops.firstIndex { $0 === connection.loop } ?? 0]
                            // Made here, so that the task's closure captures one reference,
                            // which is then its context: no box in every idle connection.
                            let session = AsyncSession(connection: connection, host: host)
                            tasks.addTask(executorPreference: connection.loop) { () async throws in
                                await session.run()
                            }
                        }
                    } catch {
                        // Cancelled: the listener is closed; the sessions finish on their own.
                    }
                }
            }
        }
        self.listeners = listeners
        self.registry = registry
        self.stats = stats
        self.port = listeners[0].port
    }

    private static func listen(on endpoint: LineService.Endpoint, group: EventLoopGroup, options: Connection.Options,
                               tls: TLSServerContext?) async throws -> Listener
    {
        switch (endpoint, tls) {
        case (.address(let host, let port), nil):
            try await Listener(.tcp(host: host, port: port), on: group.loops[0], group: group, options: options)
        case (.activated(let socket), nil):
            try await Listener(.activated(socket), on: group.loops[0], group: group, options: options)
        case (.address(let host, let port), let tls?):
            try await Listener(.tcp(host: host, port: port), on: group.loops[0], group: group, options: options, tls: tls)
        case (.activated(let socket), let tls?):
            try await Listener(.activated(socket), on: group.loops[0], group: group, options: options, tls: tls)
        case (.unix(let path, let mode), nil):
            try await Listener(.unix(path: path, mode: mode), on: group.loops[0], group: group, options: options)
        case (.unix(let path, _), _?):
            throw LineServiceError.tlsOnUnixSocket(path: path)
        }
    }

    /// A snapshot of the counters. Any thread.
    public var currentStats: LineService.Stats { stats.snapshot }

    /// Stops accepting, lets every connection finish the requests it has in flight (their
    /// replies are sent; new requests get `ERR shutting down`), closes the connections, then
    /// shuts the group down within `gracePeriod` (one deadline for all loops). Any task outside
    /// the group's loops.
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(5)) async -> EventLoopGroup.ShutdownReport {
        for listener in listeners { listener.close() }
        for session in registry.startDraining() { await session.drain() }
        let report = await group.shutdown(gracePeriod: gracePeriod)
        for task in serving { await task.value }
        return report
    }
}
