import Foundation
import KVCore
import Mainspring
import MainspringCore
import Synchronization

/// The server's settings (`mainspring-kv`'s command-line flags).
public struct KVServerOptions: Sendable {
    /// The address to listen on.
    public var host = "127.0.0.1"
    /// The port (0: any free port).
    public var port: UInt16 = 0
    /// Event loops (threads) for `mainspring-kv`'s group. The keyspace belongs to loop 0; see
    /// `KVServer`.
    public var loops = 1
    /// The hard limit on a client's buffered output, in bytes, used while `CONFIG`'s
    /// `client-output-buffer-limit normal` hard limit is 0 (its default); 0: no limit.
    public var clientOutputLimit = 64 << 20
    /// `maxclients` at start (`CONFIG SET maxclients` changes it).
    public var maxClients = 10_000
    /// Units of work (keys scanned, elements encoded or freed) per slice of a slow command.
    public var sliceUnits = 4_096

    public init() {}
}

/// The server's counters, bumped from every loop; read them from any thread.
public final class ServerCounters: Sendable {
    /// Clients connected now.
    public let connected = Atomic<Int>(0)
    /// Connections accepted so far (refused ones included).
    public let accepted = Atomic<Int>(0)
    /// Connections refused over `maxclients`.
    public let rejected = Atomic<Int>(0)
    /// Clients closed for their output buffer limit.
    public let outputLimitDisconnections = Atomic<Int>(0)
    /// Slow commands whose replies were fed a slice at a time.
    public let slicedCommands = Atomic<Int>(0)
    /// `maxclients` as the core's configuration has it (published by the keyspace's loop).
    let maxClients = Atomic<Int>(10_000)
    /// The hard output limit in force (`CONFIG`'s, or `--client-output-limit`); 0: none.
    let outputHardLimit = Atomic<Int>(0)
    let outputSoftLimit = Atomic<Int>(0)
    let outputSoftSeconds = Atomic<Int>(0)
    /// `proto-max-bulk-len` (the parsers read it before each batch).
    let protoMaxBulkLength = Atomic<Int>(512 << 20)
}

/// Carries a loop-bound value in a closure posted to the loop that owns it (the value is only
/// ever touched there).
struct LoopOwned<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// A Redis-protocol server: a `Listener` on the group's loops, one `Client` per connection on
/// the loop the connection lives on, and one `Store` (the `KVCore` and its feeders) on loop 0.
/// What `mainspring-kv` runs; a library so that tests run the very same server on simulated
/// loops (`MainspringTesting`) as well as on real ones.
///
/// A client on loop 0 runs its commands in place: parse what arrived, execute each command,
/// append the replies to one buffer, one `write` per batch. A client on another loop parses
/// there and posts the batch to loop 0, which executes it and posts the replies back (one batch
/// in flight per client, so replies stay in order).
public final class KVServer: Sendable {
    /// The loops it serves on (the keyspace on loop 0).
    public let group: EventLoopGroup
    /// Its counters (any thread).
    public let counters: ServerCounters
    /// The port it listens on (the one chosen when `options.port` was 0).
    public let port: UInt16
    private let listener: LoopOwned<Listener>
    private let store: LoopOwned<Store>
    /// Every loop's open clients, each touched on its own loop only.
    private let registries: [LoopOwned<ClientRegistry>]

    /// Binds and starts serving. From outside the group's loops it waits for loop 0 to set up the
    /// keyspace and the listener; on loop 0's thread (a simulated group's driving thread) it
    /// does that in place.
    public init(group: EventLoopGroup, options: KVServerOptions) throws {
        self.group = group
        let counters = ServerCounters()
        counters.maxClients.store(options.maxClients, ordering: .relaxed)
        counters.outputHardLimit.store(options.clientOutputLimit, ordering: .relaxed)
        self.counters = counters
        let registries = group.loops.map { LoopOwned(ClientRegistry(loop: $0)) }
        self.registries = registries
        let storeLoop = group.loops[0]
        // The connection's own output limit: reading pauses above it, and a sliced reply waits
        // for the client to drain below half of it (see `Store.runSliced`).
        let pacingLimit = options.clientOutputLimit > 0 ? options.clientOutputLimit : 64 << 20
        let connectionOptions = Connection.Options(maxLineLength: 65_536, outputLimit: pacingLimit,
                                                   idleTimeout: nil, closeTimeout: .seconds(2))
        let made = try runAndWait(on: storeLoop) { () throws -> (Store, Listener) in
            let store = Store(loop: storeLoop, group: group, options: options, counters: counters)
            let shared = LoopOwned(store)
            // The library's listener: accepted sockets have TCP_NODELAY (a batch's replies that go
            // out in two writes do not wait for the client's delayed ACK).
            let listener = try Listener(.tcp(host: options.host, port: options.port), on: storeLoop, group: group,
                                        options: connectionOptions) { connection in
                guard let registry = registries.first(where: { $0.value.loop === connection.loop }) else { return }
                Client.accept(connection, store: shared.value, counters: counters, registry: registry.value)
            }
            store.port = Int(listener.port)
            return (store, listener)
        }
        store = LoopOwned(made.0)
        listener = LoopOwned(made.1)
        port = made.1.port
    }

    /// Stops serving: closes the listener and every client's connection (what they had
    /// buffered goes out for at most their close timeout, 2 s), each on its own loop, and stops
    /// the server's timers (the keyspace stays in memory until the server is released). Any
    /// thread; returns at once. Idempotent.
    public func close() {
        listener.value.close()
        let store = self.store
        store.value.isStopped.store(true, ordering: .relaxed)
        store.value.loop.execute { store.value.stopTimers() }
        for registry in registries {
            registry.value.loop.execute { registry.value.closeAll() }
        }
    }
}

/// The clients open on one loop (that loop's thread only), for `KVServer.close`.
final class ClientRegistry {
    let loop: EventLoop
    private var clients: [ObjectIdentifier: Client] = [:]
    init(loop: EventLoop) { self.loop = loop }
    func add(_ client: Client) { clients[ObjectIdentifier(client)] = client }
    func remove(_ client: Client) { clients[ObjectIdentifier(client)] = nil }
    func closeAll() {
        for client in clients.values { client.connection.close() }
    }
}

/// Runs `body` on `loop` and waits for its result (from another thread; on the loop's own
/// thread it runs `body` in place).
func runAndWait<T>(on loop: EventLoop, _ body: @escaping () throws -> T) throws -> T {
    if loop.isCurrent { return try body() }
    let result = Mutex<Result<LoopOwned<T>, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let work = LoopOwned(body)
    loop.execute {
        let outcome = Result { LoopOwned(try work.value()) }
        result.withLock { $0 = outcome }
        done.signal()
    }
    done.wait()
    return try result.withLock { $0! }.get().value
}

// MARK: The keyspace's side (loop 0)

/// The `KVCore` and what runs on it besides commands: the sliced replies' feeder, the
/// maintenance feeder (freeing big values, active expiry), the 100 ms timer. Loop 0 only.
final class Store {
    let loop: EventLoop
    let group: EventLoopGroup
    let core: KVCore
    let options: KVServerOptions
    let counters: ServerCounters
    /// Slow commands' replies, a slice per chunk.
    let replies: Feeder
    /// Freeing big values and keyspaces; active expiry cycles that have more to do.
    let maintenance: Feeder
    var port = 0
    private var reclaiming = false
    private var expiring = false
    private var slicedInFlight = 0
    private var publishedConfiguration: KVConfiguration
    /// The latest metrics of every loop (loop 0's is read live), for `INFO mainspring`.
    let loopMetrics: MetricsBoard
    private var timers: [TimerHandle] = []
    /// Set by `KVServer.close()`: the other loops' metrics timers cancel themselves (any thread).
    let isStopped = Atomic<Bool>(false)
    /// Every client's session record, for `CLIENT LIST`.
    var clients: [Int64: Client] = [:]

    init(loop: EventLoop, group: EventLoopGroup, options: KVServerOptions, counters: ServerCounters) {
        self.loop = loop
        self.group = group
        self.options = options
        self.counters = counters
        var configuration = KVConfiguration()
        configuration.maxClients = options.maxClients
        // Expiry on the loop's calendar: the system's on a real loop, virtual time in a simulation.
        core = KVCore(configuration: configuration, clock: { [loop] in loop.calendarMilliseconds() },
                      monotonicClock: { [loop] in Int64(loop.monotonicNow() / 1_000_000) })
        publishedConfiguration = configuration
        replies = Feeder(loop: loop, priority: .background, pacing: .budget(.milliseconds(1)))
        maintenance = Feeder(loop: loop, priority: .background, pacing: .budget(.milliseconds(1)))
        loopMetrics = MetricsBoard(Array(repeating: nil, count: group.loops.count))
        core.statusProvider = { [unowned self] in self.status() }
        publish(configuration)
        timers.append(loop.schedule(every: .milliseconds(100)) { [unowned self] _ in self.tick() })
        // The other loops publish their metrics for INFO every 100 ms.
        let shared = LoopOwned(self)
        for (index, other) in group.loops.enumerated() where index > 0 {
            other.execute {
                _ = other.schedule(every: .milliseconds(100)) { timer in
                    guard !shared.value.isStopped.load(ordering: .relaxed) else { return timer.cancel() }
                    let metrics = other.metrics
                    shared.value.loopMetrics.withLock { $0[index] = metrics }
                }
            }
        }
    }

    /// Stops the 100 ms timer (`KVServer.close()`).
    func stopTimers() {
        for timer in timers { timer.cancel() }
        timers = []
    }

    // MARK: After commands

    /// After a batch of commands: publish a changed configuration, start freeing what the
    /// commands released.
    @inline(__always)
    func afterBatch() {
        if core.configuration != publishedConfiguration { publish(core.configuration) }
        if core.hasPendingReclamation && !reclaiming { startReclaiming() }
    }

    private func publish(_ configuration: KVConfiguration) {
        publishedConfiguration = configuration
        counters.maxClients.store(configuration.maxClients, ordering: .relaxed)
        counters.protoMaxBulkLength.store(configuration.protoMaxBulkLength, ordering: .relaxed)
        let normal = configuration.normalOutputBufferLimit
        let hard = normal.hardLimit > 0 || normal.softLimit > 0 ? normal.hardLimit : options.clientOutputLimit
        counters.outputHardLimit.store(hard, ordering: .relaxed)
        counters.outputSoftLimit.store(normal.softLimit, ordering: .relaxed)
        counters.outputSoftSeconds.store(normal.softSeconds, ordering: .relaxed)
    }

    /// Frees released values and keyspaces through the maintenance feeder, a slice per chunk.
    private func startReclaiming() {
        reclaiming = true
        let core = self.core
        let units = options.sliceUnits
        let done = Flag()
        let job = maintenance.feed(Until(done)) { _ in
            yieldCore()
            if core.reclaim(budget: units) { done.value = true }
        }
        job.onCompletion { [unowned self] _ in
            self.reclaiming = false
            if self.core.hasPendingReclamation { self.startReclaiming() }
        }
    }

    /// Every 100 ms: the ops/s sample, an active expiry cycle (more through the feeder while it
    /// finds many expired keys), loop 0's metrics.
    private func tick() {
        core.sampleInstantaneousMetrics()
        let metrics = loop.metrics
        loopMetrics.withLock { $0[0] = metrics }
        guard !expiring else { return }
        let result = core.activeExpireCycle(budget: 200)
        if result.hasMore {
            expiring = true
            let core = self.core
            let done = Flag()
            let job = maintenance.feed(Until(done)) { _ in
                yieldCore()
                if !core.activeExpireCycle(budget: 200).hasMore { done.value = true }
            }
            job.onCompletion { [unowned self] _ in
                self.expiring = false
                self.afterBatch()
            }
        }
        afterBatch()
    }

    // MARK: Sliced replies

    /// Produces `reply` a slice at a time through the replies feeder, each slice handed to
    /// `client` as it is made, pausing while the client's output is over its limit; `then` runs
    /// when the reply is complete (or the client has gone).
    func runSliced(_ reply: KVSlicedReply, for client: Client, then: @escaping () -> Void) {
        counters.slicedCommands.add(1, ordering: .relaxed)
        slicedInFlight += 1
        let state = SlicedState(reply)
        let units = options.sliceUnits
        let done = Flag()
        var jobBox: FeedJob?
        let job = replies.feed(Until(done)) { _ in
            yieldCore()
            guard client.isOpen, let job = jobBox else {
                done.value = true
                return
            }
            // A reply made in one go at the end (KEYS) goes out 256 KiB per chunk, so that no
            // chunk copies megabytes while other clients wait.
            var output: [UInt8]
            if state.pendingOffset < state.pending.count {
                let end = min(state.pending.count, state.pendingOffset + SlicedState.piece)
                output = Array(state.pending[state.pendingOffset..<end])
                state.pendingOffset = end
                if end == state.pending.count {
                    state.pending = []
                    state.pendingOffset = 0
                    if state.replyDone { done.value = true }
                }
            } else {
                output = []
                output.reserveCapacity(64 * 1024)
                if state.reply.step(budget: units, into: &output) { state.replyDone = true }
                if output.count > SlicedState.piece {
                    state.pending = output
                    state.pendingOffset = SlicedState.piece
                    output = Array(state.pending[0..<SlicedState.piece])
                } else if state.replyDone {
                    done.value = true
                }
            }
            if client.isLocal {
                client.writeLocal(output)
                if !done.value && !client.connection.isWritable {
                    job.pause()
                    client.connection.onWritable { job.resume() }
                }
            } else if !output.isEmpty || done.value {
                // Another loop: the slice is posted there, and the job waits until it is written
                // and the client is writable again (one slice in flight).
                if !done.value { job.pause() }
                let slice = LoopOwned((client, output, done.value ? nil : job))
                client.loop.execute(priority: .input) {
                    let (client, output, job) = slice.value
                    client.writeLocal(output)
                    guard let job else { return }
                    // Closed meanwhile: the job ends at its next chunk (onWritable would not fire).
                    if client.connection.isOpen { client.connection.onWritable { job.resume() } } else { job.resume() }
                }
            }
        }
        jobBox = job
        client.slicedJob = job
        job.onCompletion { [unowned self] _ in
            jobBox = nil
            client.slicedJob = nil
            self.slicedInFlight -= 1
            then()
            self.afterBatch()
        }
    }

    // MARK: INFO

    func status() -> KVServerStatus {
        var status = KVServerStatus()
        status.processID = Int(getpid())
        status.tcpPort = port
        status.connectedClients = counters.connected.load(ordering: .relaxed)
        status.usedMemory = residentMemory()
        let now = loop.clock.now  // the group's loops share one clock (virtual when simulated)
        status.clients = clients.values.sorted { $0.session.id < $1.session.id }.map { client in
            KVClientInfo(
                id: client.session.id, address: client.connection.remoteAddress,
                name: client.session.name.map { String(decoding: $0, as: UTF8.self) } ?? "",
                ageSeconds: Int(client.connectedAt.duration(to: now).components.seconds),
                outputBytes: client.isLocal ? client.connection.bufferedOutputBytes : 0,
                inputBytes: client.isLocal ? client.parser.bufferedByteCount : 0,
                lastCommand: client.session.lastCommand)
        }
        status.extraStats = [
            ("total_connections_received", "\(counters.accepted.load(ordering: .relaxed))"),
            ("rejected_connections", "\(counters.rejected.load(ordering: .relaxed))"),
            ("client_output_buffer_limit_disconnections", "\(counters.outputLimitDisconnections.load(ordering: .relaxed))"),
            ("sliced_commands", "\(counters.slicedCommands.load(ordering: .relaxed))"),
        ]
        status.extraSections = [KVInfoSection(name: "mainspring", fields: mainspringFields())]
        return status
    }

    /// `INFO mainspring`: each loop's fairness figures (loop 0's live, the others' at most
    /// 100 ms old).
    private func mainspringFields() -> [(String, String)] {
        var snapshots = loopMetrics.withLock { $0 }
        snapshots[0] = loop.metrics
        var fields: [(String, String)] = [
            ("loops", "\(group.loops.count)"),
            ("keyspace_loop", "0"),
            ("sliced_replies_in_flight", "\(slicedInFlight)"),
            ("reclamation_pending", core.hasPendingReclamation ? "1" : "0"),
        ]
        for (index, metrics) in snapshots.enumerated() {
            guard let metrics else { continue }
            let name = "loop\(index)"
            fields.append(("\(name)_polls", "\(metrics.polls)"))
            fields.append(("\(name)_callbacks", "\(metrics.totalCallbacks)"))
            for priority in Priority.allCases {
                let label = "\(priority)"
                fields.append(("\(name)_callbacks_\(label)", "\(metrics.callbacks[priority] ?? 0)"))
                fields.append(("\(name)_busy_ms_\(label)", milliseconds(metrics.busyTime[priority] ?? .zero)))
                let wait = metrics.queueWait[priority]?.percentile(0.99) ?? .zero
                fields.append(("\(name)_queue_wait_p99_ms_\(label)", milliseconds(wait)))
            }
            fields.append(("\(name)_stalls", "\(metrics.stalls)"))
            fields.append(("\(name)_longest_stall_ms", milliseconds(metrics.longestStall)))
            fields.append(("\(name)_longest_callback_ms", milliseconds(metrics.longestCallback)))
        }
        return fields
    }
}

/// A duration in milliseconds with three decimals.
func milliseconds(_ duration: Duration) -> String {
    let (seconds, attoseconds) = duration.components
    let micros = seconds * 1_000_000 + attoseconds / 1_000_000_000_000
    let fraction = micros % 1000
    return "\(micros / 1000).\(fraction < 10 ? "00" : fraction < 100 ? "0" : "")\(fraction)"
}

/// The process's resident memory in bytes (`/proc/self/statm`).
func residentMemory() -> Int {
    // Unreadable (no procfs): INFO reports 0 bytes, as for an unknown figure; nothing else reads it.
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// Before each chunk of background work (a slow command's reply, freeing, active expiry): lets
/// a thread that is waiting for this core run first.
///
/// Why: the feeders keep input waiting at most one turn (about 1 ms) inside the loop, but the
/// operating system does not know that. A client woken on this core (by the reply to its PING)
/// waited behind the busy loop thread until the scheduler's next tick, 4 ms with HZ=250, often
/// two or three: PINGs of 8 and 12 ms during `KEYS *` over a million keys, when no callback of
/// the loop took more than 2.5 ms (`perf sched timehist`: the pinging thread's scheduling delay
/// was 10.5 ms while the loop ran 11.9 ms without a break, on the same core). A server shares
/// its cores with its clients, sidecars and other servers; a slice of background work is the
/// right moment to let them go first. `sched_yield` costs well under a microsecond a chunk
/// (a chunk is about 4,096 keys or elements, a hundred microseconds and more), and returns at
/// once when nothing else waits. Only background chunks yield: a command batch never does.
@inline(__always)
func yieldCore() {
    sched_yield()
}

/// A flag a feeder job's body sets when it is done (loop thread only).
final class Flag {
    var value = false
}

/// The items of a job that runs until its body sets `flag`: the feeder asks for the next
/// item after each chunk, so the job completes in the chunk that finished the work.
struct Until: Sequence, IteratorProtocol {
    let flag: Flag
    init(_ flag: Flag) { self.flag = flag }
    mutating func next() -> Void? { flag.value ? nil : () }
}

/// A sliced reply being produced (the feeder's body changes it).
final class SlicedState {
    /// The most output a chunk writes.
    static let piece = 256 * 1024
    var reply: KVSlicedReply
    /// Whether `reply` has produced all of its output.
    var replyDone = false
    /// Output made but not yet written (past the first piece of a large step), from `pendingOffset`.
    var pending: [UInt8] = []
    var pendingOffset = 0
    init(_ reply: KVSlicedReply) { self.reply = reply }
}

/// The loops' latest metrics, written by each loop and read by loop 0, behind an `NSLock`:
/// ThreadSanitizer understands it (it does not see `Mutex`'s futex, and reported these accesses
/// as a race).
final class MetricsBoard: @unchecked Sendable {
    private let lock = NSLock()
    private var metrics: [LoopMetrics?]

    init(_ metrics: [LoopMetrics?]) { self.metrics = metrics }

    func withLock<Result>(_ body: (inout [LoopMetrics?]) -> Result) -> Result {
        lock.lock()
        defer { lock.unlock() }
        return body(&metrics)
    }
}
