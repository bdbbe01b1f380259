#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The pure logic of a Redis-protocol (RESP2) server: one database of binary-safe keys holding
/// strings, lists, hashes and sets with expiry, and the commands on it, with Redis 7.0's
/// replies and error texts. No I/O: the server reads bytes into a `RESPParser`, passes each
/// command to `execute(_:session:into:)`, and writes the output buffer back.
///
/// ## Threads
/// A core and everything it hands out (`KVSlicedReply`) belong to one thread, the server's
/// loop; they are not `Sendable`.
///
/// ## Running a command
/// `execute` appends the reply to `output` and returns `.replied`, or `.close` (after `QUIT`'s
/// `+OK`: close once it is written), or `.sliced(reply)` for a command whose cost
/// grows with the data, when the data is large (`KVConfiguration.slicingThreshold` keys or
/// elements, 1000 by default). Smaller ones always run inline. A sliced reply is produced by
/// calling `reply.step(budget:into:)` until it returns true; each call does at most `budget`
/// units (keys scanned, elements encoded), and the server may run other clients' commands
/// between calls, but not this client's next ones (their replies must come after this one).
///
/// ## Consistency of sliced commands
/// - `KEYS pattern` is a scan of the live keyspace to its end. It reports exactly the keys that
///   existed when it began and still exist, unexpired, when the scan reaches them. So a key
///   that exists for the whole command (whatever writes change its value) is reported exactly
///   once; a key created after the command began is never reported; no key is reported twice.
///   (Keys are never moved while they exist: see *Scans* below.)
/// - `LRANGE`, `HGETALL`, `SMEMBERS` of a large value reply with the value as it was when the
///   command began: it is a copy-on-write snapshot, O(1) to take. A write to that key while the
///   reply is being produced copies the value first (O(n), once), and the reply is unchanged.
/// - `FLUSHALL`/`FLUSHDB` are atomic for every client: the keyspace is replaced by an empty one
///   at once (a sliced `KEYS` then reports nothing more); the old one is freed in slices.
/// - `DEL`/`UNLINK`/overwrite/expiry of a large value: the key is gone (or replaced) at once;
///   the old value is freed in slices. Nothing else can see it.
///
/// Freeing in slices is background work: while `hasPendingReclamation`, the server calls
/// `reclaim(budget:)` (from a low-priority feeder) until it returns true.
///
/// ## Expiry
/// Lazy (a key past its time is deleted when a command touches it) and active:
/// `activeExpireCycle(budget:)`, called by the server from a timer (every 100 ms, as Redis
/// does), looks at up to `budget` keys with a TTL, in order around the list of such keys, and
/// deletes the expired ones; like Redis it stops early when fewer than a quarter of a sample of
/// 20 had expired, and says whether another round soon is worthwhile. So a million keys that
/// expire together are removed a slice at a time.
///
/// ## Scans
/// Keys live in a slot array and never move while they exist (an index maps keys to slots;
/// freed slots are reused lowest first, and free slots at the end are dropped). A `SCAN`
/// cursor is a slot number, so a key that exists for the whole of a `SCAN` iteration is
/// returned exactly once, whatever is added or deleted meanwhile; a key deleted and created
/// again may be returned twice (Redis allows that too). `COUNT` is the number of occupied slots
/// one call looks at.
///
/// ## Limits
/// `KVConfiguration` holds `maxclients`, `proto-max-bulk-len` and `client-output-buffer-limit`
/// for `CONFIG GET`/`CONFIG SET`; the server enforces the client and output limits and builds
/// its parsers with `configuration.parserLimits`. `APPEND` refuses to grow a string past
/// `proto-max-bulk-len`. There is one database: `SELECT 0` works, other indexes fail.
///
/// A malformed request is the parser's to report (`RESPParser.Event.protocolError`): the server
/// writes that reply after the earlier ones and closes the connection.
///
/// ## Not as in Redis
/// - RESP3 is not spoken: `HELLO 3` answers `-NOPROTO unsupported protocol version` (redis-py 8
///   asks for RESP3 unless made with `protocol=2`). `HELLO 2` works, `AUTH default <any>` too.
/// - `SMEMBERS`, `HGETALL`, `KEYS` and `SCAN` list elements in slot order (freed slots are
///   reused), not in Redis's hash or listpack order; `SPOP` picks with another generator.
/// - `COMMAND DOCS` answers an empty array; `COMMAND`/`COMMAND INFO` entries have empty ACL
///   categories, tips, key specs and subcommands. `CONFIG` knows `maxclients`,
///   `proto-max-bulk-len`, `client-output-buffer-limit` (settable), and `save`, `appendonly`,
///   `databases` (read only). `INFO` has the fields listed in its sections only.
/// - `SCAN`'s `COUNT` counts occupied slots (and at most ten times as many slots in all), and its
///   cursor is a slot number, not Redis's reverse-binary bucket cursor.
/// - `DEL` frees a large value in slices like `UNLINK` (invisible to clients).
public final class KVCore {
    /// The settings `CONFIG GET`/`CONFIG SET` read and change.
    public var configuration: KVConfiguration
    /// What the server knows (pid, port, clients, extra `INFO` sections), read by `INFO` and
    /// `CLIENT LIST` when they run.
    public var statusProvider: () -> KVServerStatus
    /// The version `INFO` and `HELLO` report, for clients that look at it.
    public static let compatibleRedisVersion = "7.0.15"

    let clock: () -> Int64
    let monotonicClock: () -> Int64
    let monotonicStart: Int64
    // The hot state is not checked for exclusive access at run time (each check is a call into
    // the runtime and a thread-local lookup, about an eighth of a SET's cost): the core belongs
    // to one thread, and its methods never hand out overlapping accesses to these properties.
    @exclusivity(unchecked) var keyspace = ByteMap<KeyEntry>()
    /// The keys with a TTL: slot and time (each entry knows its position here). Kept apart
    /// from the slots, which would otherwise all carry 8 bytes of time that most keys lack.
    @exclusivity(unchecked) var expiring: [ExpiryRecord] = []
    /// Changes when `FLUSHALL` replaces the keyspace: sliced scans stop then.
    @exclusivity(unchecked) var keyspaceGeneration: UInt64 = 0
    /// The sliced `KEYS` commands in progress, told of each key created ahead of their cursor
    /// (`noteInsertion`). Weak: a reply dropped unfinished (its client gone) drops out.
    @exclusivity(unchecked) var keysScans: [WeakKeysScan] = []
    @exclusivity(unchecked) var cachedNow: Int64?
    @exclusivity(unchecked) var reclaimer = Reclaimer()
    var nextSessionID: Int64 = 1
    var expireCursor = 0
    var averageTTL: Int64 = 0

    // Statistics.
    @exclusivity(unchecked) var totalCommands: Int64 = 0
    @exclusivity(unchecked) var keyspaceHits: Int64 = 0
    @exclusivity(unchecked) var keyspaceMisses: Int64 = 0
    @exclusivity(unchecked) var expiredKeys: Int64 = 0
    var opsSamples: [Int64] = Array(repeating: 0, count: 16)
    var opsSampleIndex = 0
    var lastSample: (time: Int64, commands: Int64)?

    /// Creates an empty core.
    /// - Parameters:
    ///   - configuration: the initial settings.
    ///   - clock: the wall-clock time in Unix milliseconds (expiry uses it; tests pass their own).
    ///   - monotonicClock: milliseconds that never go back (uptime, the ops rate): a loop's
    ///     clock, virtual in a simulation.
    ///   - statusProvider: the server's figures for `INFO` and `CLIENT LIST`.
    public init(
        configuration: KVConfiguration = KVConfiguration(),
        clock: @escaping () -> Int64 = KVCore.systemTimeMilliseconds,
        monotonicClock: @escaping () -> Int64 = KVCore.monotonicMilliseconds,
        statusProvider: @escaping () -> KVServerStatus = { KVServerStatus() }
    ) {
        self.configuration = configuration
        self.clock = clock
        self.monotonicClock = monotonicClock
        self.statusProvider = statusProvider
        self.monotonicStart = monotonicClock()
    }

    /// The system's wall-clock time in Unix milliseconds.
    public static func systemTimeMilliseconds() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Int64(spec.tv_sec) * 1000 + Int64(spec.tv_nsec) / 1_000_000
    }

    /// The machine's monotonic time in milliseconds (`CLOCK_MONOTONIC`): the default for a core
    /// without a loop (a loop's clock is virtual in a simulation: the server passes it).
    public static func monotonicMilliseconds() -> Int64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return Int64(spec.tv_sec) * 1000 + Int64(spec.tv_nsec) / 1_000_000
    }

    /// A new connection's session, with the next client id.
    public func makeSession() -> KVSession {
        defer { nextSessionID += 1 }
        return KVSession(id: nextSessionID)
    }

    /// The number of keys (expired ones not yet removed included, as in Redis's `DBSIZE`).
    public var keyCount: Int { keyspace.count }

    /// The number of keys with a TTL.
    public var expiringKeyCount: Int { expiring.count }

    /// Commands executed so far (`total_commands_processed`).
    public var commandsProcessed: Int64 { totalCommands }

    /// Whether freed values or keyspaces still wait to be released by `reclaim(budget:)`.
    public var hasPendingReclamation: Bool { !reclaimer.isEmpty }

    /// Releases up to about `budget` elements of freed values and keyspaces; returns true when
    /// nothing is left. O(budget).
    @discardableResult
    public func reclaim(budget: Int) -> Bool {
        reclaimer.step(budget: max(budget, 1), threshold: configuration.slicingThreshold)
    }

    /// Takes an instantaneous-ops sample (`instantaneous_ops_per_sec`); the server calls it
    /// every 100 ms or so.
    public func sampleInstantaneousMetrics() {
        let now = monotonicClock()
        if let last = lastSample, now > last.time {
            let rate = (totalCommands - last.commands) * 1000 / (now - last.time)
            opsSamples[opsSampleIndex] = rate
            opsSampleIndex = (opsSampleIndex + 1) % opsSamples.count
        }
        lastSample = (now, totalCommands)
    }

    // MARK: Time

    /// The command's time: read from the clock once per command, when first needed.
    @inline(__always)
    var now: Int64 {
        if let cached = cachedNow { return cached }
        let time = clock()
        cachedNow = time
        return time
    }

    // MARK: Keys

    /// The slot of `key` if it exists and has not expired (an expired one is deleted).
    @inline(__always)
    func liveSlot(_ key: [UInt8], hash: UInt64) -> Int? {
        guard let slot = keyspace.find(key, hash: hash) else { return nil }
        let position = keyspace.slots[slot].value!.expiryPosition
        if position >= 0 && now > expiring[Int(position)].expireAt {
            deleteExpired(slot: slot)
            return nil
        }
        return slot
    }

    @inline(__always)
    func liveSlot(_ key: [UInt8]) -> Int? {
        liveSlot(key, hash: ByteHash.hash(key))
    }

    /// `liveSlot` counting a keyspace hit or miss (Redis's `lookupKeyRead`).
    @inline(__always)
    func readSlot(_ key: [UInt8]) -> Int? {
        let slot = liveSlot(key)
        if slot == nil { keyspaceMisses += 1 } else { keyspaceHits += 1 }
        return slot
    }

    @inline(__always)
    func entry(at slot: Int) -> KeyEntry {
        keyspace.slots[slot].value!
    }

    /// The absolute expiry (Unix ms) of the key in occupied `slot`, or `KeyEntry.persistent`.
    @inline(__always)
    func expireAt(slot: Int) -> Int64 {
        let position = keyspace.slots[slot].value!.expiryPosition
        return position >= 0 ? expiring[Int(position)].expireAt : KeyEntry.persistent
    }

    func deleteExpired(slot: Int) {
        expiredKeys += 1
        deleteKey(slot: slot)
    }

    /// Removes the key in `slot`; a large value goes to the reclaimer.
    func deleteKey(slot: Int) {
        if keyspace.slots[slot].value!.hasExpiry { clearExpiry(slot: slot) }
        let removed = keyspace.remove(slot: slot)
        dispose(removed.value.value)
    }

    /// Drops a value no key holds any more: a large one is freed in slices later.
    @inline(__always)
    func dispose(_ value: KVValue) {
        switch value {
        case .string: return
        default:
            if value.elementCount >= configuration.slicingThreshold { reclaimer.add(value) }
        }
    }

    /// Creates `key` (absent) with `value`; returns its slot.
    @discardableResult
    func insertKey(_ key: [UInt8], hash: UInt64, value: KVValue) -> Int {
        let slot = keyspace.insertNew(key, hash: hash, value: KeyEntry(value: value))
        if !keysScans.isEmpty { noteInsertion(slot: slot) }
        return slot
    }

    /// Tells each sliced `KEYS` in progress of a key created in `slot` ahead of its cursor: it
    /// did not exist when the scan began, so the scan skips it (see *Consistency of sliced
    /// commands*). This replaces an 8-byte creation epoch in every slot; it costs nothing
    /// while no sliced `KEYS` runs, and a set entry per key created ahead of one while it does.
    func noteInsertion(slot: Int) {
        var index = 0
        while index < keysScans.count {
            guard let scan = keysScans[index].progress else {
                keysScans.remove(at: index)
                continue
            }
            if slot >= scan.cursor && slot < scan.end { scan.createdAhead.insert(slot) }
            index += 1
        }
    }

    /// A sliced `KEYS` is over (or abandoned): it needs no more news of insertions.
    func endKeysScan(_ progress: KeysScanProgress) {
        keysScans.removeAll { $0.progress == nil || $0.progress === progress }
    }

    /// Sets `key` to `value` (creating it or replacing any value); drops the TTL unless `keepTTL`.
    /// Returns the slot.
    @discardableResult
    func store(_ key: [UInt8], _ value: KVValue, keepTTL: Bool = false) -> Int {
        let hash = ByteHash.hash(key)
        if let slot = keyspace.find(key, hash: hash) {
            let old = keyspace.modifyValue(at: slot) { entry -> KVValue in
                var value = value
                swap(&value, &entry.value)
                return value
            }
            if !keepTTL && keyspace.slots[slot].value!.expiryPosition >= 0 { clearExpiry(slot: slot) }
            dispose(old)
            return slot
        }
        return insertKey(key, hash: hash, value: value)
    }

    /// Changes the value in `slot` in place (the value is moved out for `body`, so a list or map
    /// that nobody else shares is changed without a copy).
    @inline(__always)
    func modifyValue<R>(at slot: Int, _ body: (inout KVValue) throws -> R) rethrows -> R {
        try keyspace.modifyValue(at: slot) { entry in
            var value = KVValue.placeholder
            swap(&value, &entry.value)
            defer { swap(&value, &entry.value) }
            return try body(&value)
        }
    }

    /// Sets the absolute expiry of the key in `slot`.
    func setExpiry(slot: Int, at time: Int64) {
        let existing = keyspace.slots[slot].value!.expiryPosition
        if existing >= 0 {
            expiring[Int(existing)].expireAt = time
            return
        }
        let position = Int32(expiring.count)
        keyspace.modifyValue(at: slot) { $0.expiryPosition = position }
        expiring.append(ExpiryRecord(slot: Int32(slot), expireAt: time))
    }

    /// Makes the key in `slot` persistent.
    func clearExpiry(slot: Int) {
        let position = keyspace.modifyValue(at: slot) { entry -> Int32 in
            let position = entry.expiryPosition
            entry.expiryPosition = -1
            return position
        }
        guard position >= 0 else { return }
        let last = expiring.removeLast()
        if Int(position) < expiring.count {
            expiring[Int(position)] = last
            keyspace.modifyValue(at: Int(last.slot)) { $0.expiryPosition = position }
        }
    }

    /// Replaces the keyspace with an empty one; the old one is freed in slices.
    func flushKeyspace() {
        let old = keyspace
        keyspace = ByteMap()
        expiring = []
        keysScans = []  // they stop at their next step (the generation changed)
        keyspaceGeneration += 1
        expireCursor = 0
        averageTTL = 0
        if old.slotCount > 0 { reclaimer.add(keyspace: old) }
    }

    // MARK: Active expiry

    /// What one `activeExpireCycle(budget:)` did.
    public struct ExpireCycleResult: Sendable, Hashable {
        /// Keys with a TTL looked at.
        public var checked: Int
        /// Of those, the expired ones deleted.
        public var expired: Int
        /// Whether many keys looked expired (a quarter of the last sample or more) and the
        /// budget ran out: another cycle soon would find more.
        public var hasMore: Bool
    }

    /// Deletes expired keys, looking at up to `budget` keys with a TTL, 20 at a time, going on
    /// round the list of such keys from where the last cycle stopped; stops after a sample of
    /// 20 in which fewer than 5 had expired. O(budget).
    @discardableResult
    public func activeExpireCycle(budget: Int) -> ExpireCycleResult {
        cachedNow = nil
        let time = now
        var checked = 0
        var expired = 0
        var lastSampleExpired = 0
        var lastSampleSize = 0
        var ttlSum: Int64 = 0
        var ttlSamples: Int64 = 0
        while checked < budget && !expiring.isEmpty {
            var sample = 0
            lastSampleExpired = 0
            while sample < 20 && checked < budget && !expiring.isEmpty {
                if expireCursor >= expiring.count { expireCursor = 0 }
                let record = expiring[expireCursor]
                let slot = Int(record.slot)
                let expireAt = record.expireAt
                sample += 1
                checked += 1
                if time > expireAt {
                    deleteExpired(slot: slot)  // moves the last one into this position
                    expired += 1
                    lastSampleExpired += 1
                } else {
                    ttlSum += expireAt - time
                    ttlSamples += 1
                    expireCursor += 1
                }
            }
            lastSampleSize = sample
            if lastSampleExpired * 4 < sample { break }
        }
        if ttlSamples > 0 {
            let average = ttlSum / ttlSamples
            averageTTL = averageTTL == 0 ? average : (averageTTL / 50) * 49 + average / 50
        }
        if expiring.isEmpty { averageTTL = 0 }
        let hasMore = checked >= budget && lastSampleSize > 0 && lastSampleExpired * 4 >= lastSampleSize && !expiring.isEmpty
        return ExpireCycleResult(checked: checked, expired: expired, hasMore: hasMore)
    }
}
