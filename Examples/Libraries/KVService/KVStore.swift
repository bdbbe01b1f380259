import Foundation
import KVCore
import Mainspring
import MainspringCore
import Synchronization

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
