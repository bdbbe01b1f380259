import Foundation
import Mainspring
import MainspringTLS
import Synchronization

// One connection of `AsyncLineService` (AsyncLineService.swift): the actor that serves it on its
// loop, and the registry a shutdown drains.

/// The live sessions, so that a shutdown can drain them; sessions that start after the drain
/// began drain at once. (An `NSLock`, which ThreadSanitizer understands.)
final class SessionRegistry: Sendable {
    private struct State {
        var sessions: [ObjectIdentifier: AsyncSession] = [:]
        var isDraining = false
    }

    private let state = Guarded(State())

    /// Registers `session`; true if the service is draining already.
    func add(_ session: AsyncSession) -> Bool {
        state.withLock { state in
            state.sessions[ObjectIdentifier(session)] = session
            return state.isDraining
        }
    }

    func remove(_ session: AsyncSession) {
        _ = state.withLock { $0.sessions.removeValue(forKey: ObjectIdentifier(session)) }
    }

    /// From now on sessions drain; returns the ones already running.
    func startDraining() -> [AsyncSession] {
        state.withLock { state in
            state.isDraining = true
            return Array(state.sessions.values)
        }
    }
}

/// What the sessions of one loop share: one per loop, so that an idle connection's session
/// holds one reference for all of it.
final class SessionHost: Sendable {
    let feeder: Feeder
    let stats: StatsCounters
    let registry: SessionRegistry
    /// When the service started, on the loops' clock (virtual in a simulation), in nanoseconds.
    let startTime: UInt64
    let maxPendingReplies: Int
    let maxLineLength: Int

    init(feeder: Feeder, stats: StatsCounters, registry: SessionRegistry, startTime: UInt64,
         options: LineService.Options)
    {
        self.feeder = feeder
        self.stats = stats
        self.registry = registry
        self.startTime = startTime
        self.maxPendingReplies = options.maxPendingReplies
        self.maxLineLength = options.maxLineLength
    }
}

/// What a session needs beyond reading a line and answering it at once: replies waiting or in
/// flight (a `SLEEP`, a `WORK`, a reply behind another), a send under way, the end (a `QUIT`, a
/// drain). Made on first use: most connections never need one, and an idle connection holds its
/// session (three references, the smallest object but one).
final class SessionBacklog {
    /// Replies in request order (`nil` while the request is in flight); `first` is the next to
    /// send. A slot is `base + index`.
    var replies: [String?] = []
    var first = 0
    var base = 0
    var checksums: [Int: UInt64] = [:]
    /// `SLEEP`s and `WORK`s in flight, and `run` waiting for the last of them once the input ended.
    var inFlight = 0
    var allLanded: UnsafeContinuation<Void, Never>?
    /// Whether a task is sending replies (only one does, so that they go out in order).
    var isWriting = false
    var isDraining = false
    var isQuitting = false

    var count: Int { replies.count - first }
}

/// One connection, on its loop: requests in, replies out in request order.
actor AsyncSession {
    let connection: Connection
    nonisolated var unownedExecutor: UnownedSerialExecutor { connection.loop.asUnownedSerialExecutor() }
    private let host: SessionHost
    /// The backlog, once made (see `SessionBacklog`; `backlog` makes it).
    private var madeBacklog: SessionBacklog?

    init(connection: Connection, host: SessionHost) {
        self.connection = connection
        self.host = host
    }

    private nonisolated var stats: StatsCounters { host.stats }

    /// The backlog, made now if it was not yet.
    private var backlog: SessionBacklog {
        if let madeBacklog { return madeBacklog }
        let made = SessionBacklog()
        madeBacklog = made
        return made
    }

    // The backlog's flags under their own names: false while there is none; setting one false
    // makes none.
    private var isWriting: Bool {
        get { madeBacklog?.isWriting ?? false }
        set { if madeBacklog != nil || newValue { backlog.isWriting = newValue } }
    }

    private var isDraining: Bool {
        get { madeBacklog?.isDraining ?? false }
        set { if madeBacklog != nil || newValue { backlog.isDraining = newValue } }
    }

    private var isQuitting: Bool {
        get { madeBacklog?.isQuitting ?? false }
        set { if madeBacklog != nil || newValue { backlog.isQuitting = newValue } }
    }

    private var pending: Int { madeBacklog?.count ?? 0 }

    /// Serves the connection until it closes; requests still in flight finish first.
    ///
    /// The common request — an immediate reply with nothing in flight ahead of it and room in
    /// the output — is handled and answered synchronously, with no async call: each call into
    /// one of this actor's async methods costs the runtime an executor switch, which reads the
    /// task's executor preference under a lock. Other replies go through `reply`. The loop
    /// itself keeps nothing else across its suspension: an idle connection's task holds this
    /// function's frame while it waits for the next line, and every async call inlined here
    /// would add its own locals to that frame (so `reply` and `finish` are not inlined).
    ///
    /// The session registers itself with the service (for a shutdown's drain) and leaves the
    /// registry at the end: the task's closure is then a single call, capturing the session
    /// alone.
    func run() async {
        if host.registry.add(self) { drain() }
        do {
            for try await event in connection.lines {
                guard let text = handle(event), !answeredNow(text) else { continue }
                await reply(text)
            }
        } catch {
            // Closed under us (reset, idle timeout, cancelled): nothing more to read.
        }
        await finish()
    }

    /// Queues `text` at once when nothing is in flight ahead of it and the output has room (on
    /// the loop's thread `trySend` is exact); false when the reply has to go through `reply`
    /// (or the connection closed: `reply` then finds out). Not inlined, so that none of its
    /// temporaries end up in `run`'s frame.
    @inline(never)
    private func answeredNow(_ text: String) -> Bool {
        guard pending == 0 && !isWriting && connection.trySend(line: text) else { return false }
        if text.hasPrefix("ERR") { stats.errors.add(1, ordering: .relaxed) }
        closeIfDone()
        return true
    }

    /// Sends `text` now if nothing is in flight ahead of it, else puts it in its place.
    @inline(never)
    private func reply(_ text: consuming String) async {
        if pending == 0 && !isWriting {
            isWriting = true
            await send(text)
            isWriting = false
            if pending > 0 { await flush() }
        } else {
            place(reserve(), text)
            await flush()
        }
        closeIfDone()
    }

    /// The input ended: waits for the requests in flight, then closes.
    @inline(never)
    private func finish() async {
        if let backlog = madeBacklog, backlog.inFlight > 0 { await withUnsafeContinuation { backlog.allLanded = $0 } }
        connection.close()
        host.registry.remove(self)
        stats.open.subtract(1, ordering: .relaxed)
    }

    /// A `SLEEP` or `WORK` of this session, in a task of its own (isolated to the session, so
    /// on its loop). Not a task group around `run`: a group costs every idle connection some
    /// 560 bytes and frames in its task, and most connections never make one of these requests.
    private func startInFlight(_ body: @escaping @Sendable (isolated AsyncSession) async -> Void) {
        backlog.inFlight += 1
        Task {
            await body(self)
            self.landed()
        }
    }

    private func landed() {
        let backlog = self.backlog
        backlog.inFlight -= 1
        if backlog.inFlight == 0, let waiting = backlog.allLanded {
            backlog.allLanded = nil
            waiting.resume()
        }
    }

    /// Finish what is in flight, refuse new requests, close when the last reply is out.
    func drain() {
        isDraining = true
        closeIfDone()
    }

    /// Handles one event; returns the reply to send now (in order), if it has one already.
    private func handle(_ event: LineEvent) -> String? {
        switch event {
        case .line(let text):
            stats.countRequest()
            if isDraining || isQuitting { return "ERR shutting down" }
            if pending >= host.maxPendingReplies {
                return "ERR too many requests in flight (\(host.maxPendingReplies))"
            }
            return serve(text)
        case .tooLong(let bytes):
            return "ERR line too long (\(bytes) bytes; the limit is \(host.maxLineLength))"
        case .invalidUTF8(let bytes):
            return "ERR invalid UTF-8 (\(bytes) bytes)"
        case .endOfFile, .error:
            if madeBacklog == nil {
                // Nothing in flight or being written: close now (and make no backlog for it).
                connection.close()
            } else {
                isQuitting = true
                closeIfDone()
            }
            return nil
        }
    }

    private func serve(_ line: String) -> String? {
        switch DaemonCommand.parse(line) {
        case .failure(let error):
            return "ERR \(error)"
        case .success(.echo(let text)):
            return String(text)
        case .success(.time):
            return DaemonCommand.timeReply(on: connection.loop)
        case .success(.stats):
            let metrics = connection.loop.metrics
            let wait = metrics.queueWait[.input]?.percentile(0.99) ?? .zero
            return "STATS \(stats.snapshot) uptime_s=\(DaemonCommand.uptimeSeconds(since: host.startTime, on: connection.loop)) "
                + "loop_callbacks=\(metrics.totalCallbacks) loop_stalls=\(metrics.stalls) "
                + "loop_input_wait_p99_us=\(wait.components.attoseconds / 1_000_000_000_000)"
        case .success(.quit):
            isQuitting = true
            return "BYE"
        case .success(.sleep(let milliseconds)):
            let slot = reserve()
            let loop = connection.loop
            startInFlight { session in
                // `try?`: sleep throws only when the loop shuts down, which closes the
                // connection; the reply then goes nowhere either way.
                _ = try? await loop.sleep(for: .milliseconds(milliseconds))
                await session.fill(slot, "SLEPT \(milliseconds)")
            }
            return nil
        case .success(.work(let chunks)):
            let slot = reserve()
            stats.workJobs.add(1, ordering: .relaxed)
            backlog.checksums[slot] = 0
            // The chunks run on this loop, between its callbacks: the session's own thread.
            let job = host.feeder.feed(chunks: chunks) { index in
                self.assumeIsolated { session in
                    let backlog = session.backlog
                    backlog.checksums[slot] = WorkUnit.run(seed: UInt64(index), into: backlog.checksums[slot] ?? 0)
                }
            }
            startInFlight { session in
                let outcome = await job.outcome
                await session.finishWork(slot, chunks: chunks, outcome: outcome)
            }
            return nil
        }
    }

    private func finishWork(_ slot: Int, chunks: Int, outcome: FeedOutcome) async {
        let checksum = backlog.checksums.removeValue(forKey: slot) ?? 0
        await fill(slot, outcome == .completed ? "DONE \(chunks) \(checksum)" : "ERR work cancelled")
    }

    private func reserve() -> Int {
        let backlog = self.backlog
        backlog.replies.append(nil)
        return backlog.base + backlog.replies.count - 1
    }

    /// Puts a reply in its slot (a slot of a finished connection is gone: ignored).
    private func place(_ slot: Int, _ text: String) {
        guard let backlog = madeBacklog else { return }
        let index = slot - backlog.base
        guard index >= backlog.first, index < backlog.replies.count else { return }
        backlog.replies[index] = text
    }

    /// A reply of a request that was in flight (`SLEEP`, `WORK`).
    private func fill(_ slot: Int, _ text: String) async {
        place(slot, text)
        await flush()
        closeIfDone()
    }

    /// Sends the replies that are ready, in order, unless another task is sending already.
    private func flush() async {
        guard !isWriting, let backlog = madeBacklog else { return }
        isWriting = true
        while backlog.first < backlog.replies.count, let ready = backlog.replies[backlog.first] {
            backlog.first += 1
            await send(ready)
        }
        if backlog.first == backlog.replies.count {
            backlog.base += backlog.replies.count
            backlog.replies.removeAll(keepingCapacity: backlog.replies.capacity <= 64)
            backlog.first = 0
        }
        isWriting = false
    }

    /// Sends one reply. Not isolated (it touches no state of the session), so calling it costs
    /// no executor check: it runs where the caller runs, on this loop.
    private nonisolated(nonsending) func send(_ text: String) async {
        if text.hasPrefix("ERR") { stats.errors.add(1, ordering: .relaxed) }
        do {
            try await connection.send(line: text)
        } catch {
            // Closed: the rest of the replies have nowhere to go.
        }
    }

    private func closeIfDone() {
        if (isQuitting || isDraining) && pending == 0 && !isWriting && connection.isOpen {
            connection.close()
        }
    }
}
