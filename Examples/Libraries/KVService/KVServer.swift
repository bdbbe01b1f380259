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
