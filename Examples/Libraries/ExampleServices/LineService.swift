import Foundation
import Mainspring
import MainspringHTTP
import MainspringTLS
import Synchronization

/// The line protocol `mainspring-daemon` serves, on the loops of an `EventLoopGroup`: one
/// request per line, one reply line per request, in request order per connection (requests are
/// pipelined: a `SLEEP` does not hold back the `ECHO` behind it from being *processed*, only its
/// reply from being *sent* before the `SLEEP`'s).
///
/// | request | reply |
/// |---|---|
/// | `ECHO <text>` | `<text>` |
/// | `TIME` | the time, ISO 8601 |
/// | `SLEEP <ms>` | `SLEPT <ms>` after that long (a timer) |
/// | `WORK <n>` | `DONE <n> <checksum>` after n chunks fed through the loop's `Feeder` |
/// | `STATS` | `STATS key=value …` |
/// | `QUIT` | `BYE`, then the connection closes |
/// | anything else | `ERR <reason>` (too long, invalid UTF-8, unknown, bad argument) |
///
/// Bounded: lines over `Options.maxLineLength`, at most `Options.maxPendingReplies` replies
/// waiting per connection, the connection's output limit, and an idle timeout.
public final class LineService: Sendable {
    /// Limits of the service.
    public struct Options: Sendable {
        public var maxLineLength: Int
        /// Output buffered per connection before it stops reading (see `Connection`).
        public var outputLimit: Int
        /// Closes a connection without requests for this long; nil: never.
        public var idleTimeout: Duration?
        /// Requests whose replies may wait behind a slow one, per connection; more are refused.
        public var maxPendingReplies: Int
        /// How the loops' feeders pace `WORK`.
        public var workPacing: Feeder.Pacing
        /// A counter of the application's metrics (`MetricsRegistry`) that counts every request
        /// line, as `Stats.requests` does; nil for none.
        public var requestCounter: Counter? = nil

        public init(maxLineLength: Int = 4_096, outputLimit: Int = 256 * 1024, idleTimeout: Duration? = .seconds(300),
                    maxPendingReplies: Int = 10_000, workPacing: Feeder.Pacing = .budget(.milliseconds(1)))
        {
            self.maxLineLength = maxLineLength
            self.outputLimit = outputLimit
            self.idleTimeout = idleTimeout
            self.maxPendingReplies = maxPendingReplies
            self.workPacing = workPacing
        }
    }

    /// Counters of the service, for `STATS` and `SIGHUP`.
    public struct Stats: Sendable, Equatable, CustomStringConvertible {
        public var accepted = 0
        public var open = 0
        public var requests = 0
        public var errors = 0
        public var workJobs = 0

        public var description: String {
            "connections=\(accepted) open=\(open) requests=\(requests) errors=\(errors) work_jobs=\(workJobs)"
        }
    }

    /// Where the service accepts connections.
    public enum Endpoint: Sendable {
        /// A new socket bound to `host:port` (port 0: any free port).
        case address(host: String, port: UInt16)
        /// A listening socket passed by the service manager (socket activation).
        case activated(ActivatedSockets.Socket)
        /// A new Unix stream socket at `path` (a file with `mode`, nil: the umask's; or "@name"
        /// in the abstract namespace), with `Listener(.unix(path:mode:), on:)`'s rules: a stale
        /// socket file is replaced, a live one or another kind of file is an error, the file
        /// goes when the service stops. Plaintext only: with TLS it is
        /// `LineServiceError.tlsOnUnixSocket`.
        case unix(path: String, mode: UInt16? = nil)
    }

    public let group: EventLoopGroup
    public let options: Options
    /// The port the service listens on (0 on a unix socket).
    public let port: UInt16
    /// The address the service listens on ("127.0.0.1:7000", a unix socket's path).
    public let localAddress: String
    private let stats: StatsCounters
    private let contexts: [LoopContext]
    private let listenerBox: UncheckedBox<Listener>
    /// When it started, on its loops' clock (virtual in a simulation), in nanoseconds.
    private let startTime: UInt64

    /// Starts listening on `host:port` (0: any free port, see `port`); connections are spread
    /// over the group's loops. Call from outside the group's loops.
    public convenience init(group: EventLoopGroup, host: String = "127.0.0.1", port: UInt16 = 0,
                            options: Options = .init(), tls: TLSServerContext? = nil) throws
    {
        try self.init(group: group, endpoint: .address(host: host, port: port), options: options, tls: tls)
    }

    /// Starts accepting on `endpoint`; connections are spread over the group's loops. Call from
    /// outside the group's loops.
    public init(group: EventLoopGroup, endpoint: Endpoint, options: Options = .init(), tls: TLSServerContext? = nil) throws {
        self.group = group
        self.options = options
        stats = StatsCounters(requestCounter: options.requestCounter)
        let contexts = group.loops.map { LoopContext(loop: $0, pacing: options.workPacing) }
        self.contexts = contexts
        let acceptor = group.loops[0]
        let stats = self.stats
        let startTime = acceptor.monotonicNow()
        self.startTime = startTime
        let connectionOptions = Connection.Options(maxLineLength: options.maxLineLength,
                                                   outputLimit: options.outputLimit, idleTimeout: options.idleTimeout)
        let accept: @Sendable (Connection) -> Void = { connection in
            guard let context = contexts.first(where: { $0.loop === connection.loop }) else { return }
            stats.accepted.add(1, ordering: .relaxed)
            stats.open.add(1, ordering: .relaxed)
            context.adopt(connection, options: options, stats: stats, startTime: startTime)
        }
        let made = try acceptor.runAndWait {
            switch (endpoint, tls) {
            case (.address(let host, let port), nil):
                try Listener(.tcp(host: host, port: port), on: acceptor, group: group, options: connectionOptions,
                             accept: accept)
            case (.activated(let socket), nil):
                try Listener(.activated(socket), on: acceptor, group: group, options: connectionOptions,
                             accept: accept)
            case (.address(let host, let port), let tls?):
                try Listener(.tcp(host: host, port: port), on: acceptor, group: group, options: connectionOptions, tls: tls,
                             accept: accept)
            case (.activated(let socket), let tls?):
                try Listener(.activated(socket), on: acceptor, group: group, options: connectionOptions, tls: tls,
                             accept: accept)
            case (.unix(let path, let mode), nil):
                try Listener(.unix(path: path, mode: mode), on: acceptor, group: group, options: connectionOptions,
                             accept: accept)
            case (.unix(let path, _), _?):
                throw LineServiceError.tlsOnUnixSocket(path: path)
            }
        }
        listenerBox = UncheckedBox(made)
        self.port = made.port
        self.localAddress = made.localAddress
    }

    /// A snapshot of the counters. Any thread.
    public var currentStats: Stats { stats.snapshot }

    /// Stops accepting, lets every connection finish the requests it has in flight (their
    /// replies are sent; new requests get `ERR shutting down`), closes the connections, then
    /// shuts the group down within `gracePeriod`. Blocks; call from outside the group.
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(5)) -> EventLoopGroup.ShutdownReport {
        let acceptor = group.loops[0]
        let listener = listenerBox
        acceptor.execute { listener.value.close() }
        for context in contexts {
            context.loop.execute { context.drain() }
        }
        return group.shutdownBlocking(gracePeriod: gracePeriod)
    }
}

/// What a line service cannot be asked to do.
public enum LineServiceError: Error, Sendable, Equatable, CustomStringConvertible {
    /// TLS on a Unix socket endpoint: Mainspring's TLS listeners take TCP addresses and
    /// activated sockets only.
    case tlsOnUnixSocket(path: String)

    public var description: String {
        switch self {
        case .tlsOnUnixSocket(let path): return "TLS is not offered on a unix socket (\(path)); serve it in plaintext"
        }
    }
}

/// The service's counters: atomics, bumped on every request from every loop.
final class StatsCounters: Sendable {
    let accepted = Atomic<Int>(0)
    let open = Atomic<Int>(0)
    let requests = Atomic<Int>(0)
    let errors = Atomic<Int>(0)
    let workJobs = Atomic<Int>(0)
    /// The application's metric for requests, when the service was given one.
    let requestCounter: Counter?

    init(requestCounter: Counter? = nil) { self.requestCounter = requestCounter }

    func countRequest() {
        requests.add(1, ordering: .relaxed)
        requestCounter?.increment()
    }

    var snapshot: LineService.Stats {
        LineService.Stats(accepted: accepted.load(ordering: .relaxed), open: open.load(ordering: .relaxed),
                          requests: requests.load(ordering: .relaxed), errors: errors.load(ordering: .relaxed),
                          workJobs: workJobs.load(ordering: .relaxed))
    }
}

/// One loop's share of the service: its feeder and its connections. Only used on that loop.
private final class LoopContext: @unchecked Sendable {
    let loop: EventLoop
    let feeder: Feeder
    private var sessions: [ObjectIdentifier: Session] = [:]
    private var isDraining = false

    init(loop: EventLoop, pacing: Feeder.Pacing) {
        self.loop = loop
        self.feeder = Feeder(loop: loop, priority: .background, pacing: pacing)
    }

    func adopt(_ connection: Connection, options: LineService.Options, stats: StatsCounters,
               startTime: UInt64)
    {
        let session = Session(connection: connection, context: self, options: options, stats: stats,
                              startTime: startTime)
        let id = ObjectIdentifier(session)
        sessions[id] = session
        connection.onClose { [weak self] _ in
            stats.open.subtract(1, ordering: .relaxed)
            self?.sessions[id] = nil
        }
        if isDraining { session.drain() } else { session.start() }
    }

    func drain() {
        isDraining = true
        for session in Array(sessions.values) { session.drain() }
    }
}

/// One connection: requests in, replies out in request order.
private final class Session {
    let connection: Connection
    unowned let context: LoopContext
    let options: LineService.Options
    let stats: StatsCounters
    /// When the service started, on the loops' clock, in nanoseconds.
    let startTime: UInt64
    /// Replies in request order; nil while the request is still in flight.
    /// Replies in request order, filled as they are ready; whether each is an error (`ERR`).
    private var replies: [(text: String, isError: Bool)?] = []
    private var firstReply = 0
    private var isDraining = false
    private var isQuitting = false
    private var inFlightJobs: [FeedJob] = []

    init(connection: Connection, context: LoopContext, options: LineService.Options,
         stats: StatsCounters, startTime: UInt64)
    {
        self.connection = connection
        self.context = context
        self.options = options
        self.stats = stats
        self.startTime = startTime
    }

    func start() {
        connection.readLines { [unowned self] event in self.handle(event) }
    }

    /// Finish what is in flight, refuse new requests, close when the last reply is out.
    func drain() {
        isDraining = true
        if pending == 0 { connection.close() } else { start() }
    }

    private var pending: Int { replies.count - firstReply }

    private func handle(_ event: LineEvent) {
        switch event {
        case .line(let text):
            stats.countRequest()
            if isDraining || isQuitting {
                reply(now: "ERR shutting down")
            } else if pending >= options.maxPendingReplies {
                reply(now: "ERR too many requests in flight (\(options.maxPendingReplies))")
            } else {
                serve(text)
            }
        case .tooLong(let bytes):
            reply(now: "ERR line too long (\(bytes) bytes; the limit is \(options.maxLineLength))")
        case .invalidUTF8(let bytes):
            reply(now: "ERR invalid UTF-8 (\(bytes) bytes)")
        case .endOfFile, .error:
            isQuitting = true
            closeIfDone()
        }
    }

    private func serve(_ line: String) {
        switch DaemonCommand.parse(line) {
        case .failure(let error):
            reply(now: "ERR \(error)")
        case .success(.echo(let text)):
            reply(now: text, isError: false)  // the slice of `line`: no copy unless it must wait
        case .success(.time):
            reply(now: DaemonCommand.timeReply(on: connection.loop))
        case .success(.stats):
            let metrics = connection.loop.metrics
            let wait = metrics.queueWait[.input]?.percentile(0.99) ?? .zero
            reply(now: "STATS \(stats.snapshot) uptime_s=\(DaemonCommand.uptimeSeconds(since: startTime, on: connection.loop)) "
                + "loop_callbacks=\(metrics.totalCallbacks) loop_stalls=\(metrics.stalls) "
                + "loop_input_wait_p99_us=\(wait.components.attoseconds / 1_000_000_000_000)")
        case .success(.quit):
            reply(now: "BYE")
            isQuitting = true
            closeIfDone()
        case .success(.sleep(let milliseconds)):
            let slot = reserve()
            connection.loop.schedule(after: .milliseconds(milliseconds)) { [weak self] in
                self?.fill(slot, "SLEPT \(milliseconds)", isError: false)
            }
        case .success(.work(let chunks)):
            let slot = reserve()
            stats.workJobs.add(1, ordering: .relaxed)
            var checksum: UInt64 = 0
            let job = context.feeder.feed(chunks: chunks) { index in
                checksum = WorkUnit.run(seed: UInt64(index), into: checksum)
            }
            inFlightJobs.append(job)
            job.onCompletion { [weak self] outcome in
                guard let self else { return }
                self.inFlightJobs.removeAll { $0 === job }
                let completed = outcome == .completed
                self.fill(slot, completed ? "DONE \(chunks) \(checksum)" : "ERR work cancelled", isError: !completed)
            }
        }
    }

    private func reply(now text: String) { reply(now: text[...], isError: text.hasPrefix("ERR")) }

    /// Replies now, or as soon as the replies ahead of it are out. A slice (an echo's text)
    /// goes straight out without a string of its own when nothing is in flight ahead of it.
    private func reply(now text: Substring, isError: Bool) {
        if pending == 0 {
            // Nothing in flight ahead of it: straight out, no slot.
            connection.writeLine(text)
            if isError { stats.errors.add(1, ordering: .relaxed) }
            closeIfDone()
        } else {
            fill(reserve(), String(text), isError: isError)
        }
    }

    private func reserve() -> Int {
        replies.append(nil)
        return replies.count - 1
    }

    private func fill(_ slot: Int, _ text: String, isError: Bool) {
        guard slot >= firstReply, slot < replies.count else { return }
        replies[slot] = (text, isError)
        while firstReply < replies.count, let ready = replies[firstReply] {
            connection.writeLine(ready.text)
            if ready.isError { stats.errors.add(1, ordering: .relaxed) }
            firstReply += 1
        }
        if firstReply == replies.count {
            replies.removeAll(keepingCapacity: true)
            firstReply = 0
        }
        closeIfDone()
    }

    private func closeIfDone() {
        if (isQuitting || isDraining) && pending == 0 && connection.isOpen { connection.close() }
    }
}

/// One chunk of `WORK`: about 50 µs of arithmetic, deterministic, so clients can check replies.
public enum WorkUnit {
    /// Mixes `seed` into `checksum` through 20,000 rounds of a 64-bit xorshift.
    public static func run(seed: UInt64, into checksum: UInt64) -> UInt64 {
        var x = seed &* 0x9E37_79B9_7F4A_7C15 | 1
        for _ in 0..<20_000 {
            x ^= x << 13
            x ^= x >> 7
            x ^= x << 17
        }
        return checksum &+ x
    }

    /// The checksum a `WORK <chunks>` reply carries.
    public static func checksum(chunks: Int) -> UInt64 {
        (0..<chunks).reduce(0) { run(seed: UInt64($1), into: $0) }
    }
}
