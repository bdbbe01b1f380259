/// A source of "now" for the scheduler: nanoseconds on a monotonic scale of its own. The loop
/// uses `FastClock`; tests drive the scheduler with a clock they advance by hand.
protocol SchedulerClock {
    func now() -> UInt64
    /// Whether `willRun` wants to hear of each record (a simulation's trace). A static false on
    /// a real loop's clock, so the specialised dispatch pass has no trace code at all.
    static var tracesDispatches: Bool { get }
    /// Called just before a record runs, when `tracesDispatches`.
    func willRun(_ job: borrowing ReadyRecord.Job)
    /// Called just after that record ran, when `tracesDispatches`.
    func didRun()
}

extension SchedulerClock {
    @inline(__always)
    static var tracesDispatches: Bool { false }

    @inline(__always)
    func willRun(_ job: borrowing ReadyRecord.Job) {}

    @inline(__always)
    func didRun() {}
}

extension FastClock: SchedulerClock {}

/// One unit of ready work: a posted closure or a fired source.
struct ReadyRecord {
    enum Job {
        /// Posted with `execute` (any thread). Kept `@Sendable`, as posted: converting the
        /// closure's type would copy it.
        case work(@Sendable () -> Void)
        /// Queued on the loop's own thread for the next turn.
        case loopWork(() -> Void)
        case source(Source)
        /// A Swift concurrency job posted on the loop's own thread — a slice of a task that
        /// prefers the loop, or of an actor pinned to it — with the loop it runs on: carried as
        /// is, so that posting it allocates nothing. (The loop is not retained: it owns the
        /// scheduler that holds the record.)
        case taskJob(UnownedJob, Unmanaged<EventLoop>)
        case actorJob(UnownedJob, Unmanaged<EventLoop>)
        /// What a record holds once it ran.
        case done
    }

    var job: Job
    /// When it became ready (posted, fired), on the scheduler's clock.
    var stamp: UInt64
    /// Where a record queued for the next turn goes when it becomes ready.
    var priority: Priority

    @inline(__always)
    init(work: consuming @escaping @Sendable () -> Void, stamp: UInt64, priority: Priority = .normal) {
        job = .work(work)
        self.stamp = stamp
        self.priority = priority
    }

    @inline(__always)
    init(loopWork: consuming @escaping () -> Void, stamp: UInt64, priority: Priority) {
        job = .loopWork(loopWork)
        self.stamp = stamp
        self.priority = priority
    }

    @inline(__always)
    init(job: UnownedJob, asTask: Bool, on loop: Unmanaged<EventLoop>, stamp: UInt64, priority: Priority) {
        self.job = asTask ? .taskJob(job, loop) : .actorJob(job, loop)
        self.stamp = stamp
        self.priority = priority
    }

    @inline(__always)
    init(source: Source, stamp: UInt64, priority: Priority) {
        job = .source(source)
        self.stamp = stamp
        self.priority = priority
    }

    /// The source, if the record is a fired source.
    var source: Source? {
        if case .source(let source) = job { return source }
        return nil
    }

    /// Runs the record once, leaving it `.done`: the job is moved out first (a swap, not a copy),
    /// so the closure or source reference is released once, after the call.
    @inline(__always)
    mutating func run() {
        var job = Job.done
        swap(&job, &self.job)
        switch job {
        case .work(let work): work()
        case .loopWork(let work): work()
        case .source(let source): source.run()
        case .taskJob(let job, let loop):
            loop._withUnsafeGuaranteedRef { $0.run(job, asTask: true, priority: priority) }
        case .actorJob(let job, let loop):
            loop._withUnsafeGuaranteedRef { $0.run(job, asTask: false, priority: priority) }
        case .done: break
        }
    }

    /// Hands a concurrency job that will never run here (its loop shut down with it queued) to
    /// the loop's fallback; other records are just dropped.
    consuming func drop() {
        switch job {
        case .taskJob(let job, let loop): loop._withUnsafeGuaranteedRef { $0.orphan(job, asTask: true) }
        case .actorJob(let job, let loop): loop._withUnsafeGuaranteedRef { $0.orphan(job, asTask: false) }
        default: break
        }
    }
}

/// The loop's fairness policy and its ready queues: which record runs next, and when to stop
/// dispatching and poll again.
///
/// ## The rules
/// - **Priorities.** `.input` before `.normal` before `.background`. Within a priority, work
///   posted on the loop's thread and work posted from other threads take turns, each FIFO.
/// - **Poll interval.** A dispatch pass (`runPass`) ends once it has run for
///   `pollInterval`, so the loop polls again and new input waits at most that long plus the
///   callback in progress.
/// - **Guaranteed share.** Time that higher-priority work uses while `.background` work waits
///   earns the background `share / (1 - share)` of itself in credit; once the credit reaches a
///   quantum (half a poll interval) the oldest background record runs next, and its time spends
///   the credit (down to a debt of two poll intervals). Background time on an otherwise idle
///   loop clears the account. Below a quantum priorities are strict, so short bursts of input
///   never wait behind background work.
/// - **Starvation bound.** A background record that has waited `maxStarvation` runs next.
/// - **Turns.** Work queued with `enqueueNextTurn` (fed slices, always-ready fds) becomes ready
///   only after the next poll; so a slice of fed work always lets input in first.
/// - **Input's output first.** When a pass goes on from `.input` records to lower-priority work,
///   what the input callbacks wrote is handed to the sockets first (`runPass`'s `afterInput`:
///   the loop's pre-poll actions), not after the pass: a reply does not wait for the pass's
///   `.normal` and `.background` work (a TLS handshake step is a millisecond of it).
///
/// The scheduler never reads a clock of its own: the policy takes `now`, and `runPass` takes
/// the clock it reads after each callback. That is the seam its unit tests use.
///
/// Loop thread only. A callback may spin the loop, which runs a nested `runPass` on this same
/// scheduler: that is why it is a class whose state is reread after every callback.
final class Scheduler {
    /// The settings of the rules, in nanoseconds.
    struct Policy {
        var pollInterval: UInt64
        var maxStarvation: UInt64
        var stallThreshold: UInt64
        /// Credit earned per nanosecond of higher-priority time while background work waits.
        var backgroundCreditRate: Double

        init(_ configuration: EventLoop.Configuration) {
            pollInterval = requirePositive(configuration.pollInterval, "EventLoop.Configuration.pollInterval")
            maxStarvation = requirePositive(configuration.maxStarvation, "EventLoop.Configuration.maxStarvation")
            stallThreshold = requirePositive(configuration.stallThreshold, "EventLoop.Configuration.stallThreshold")
            let share = configuration.backgroundShare.isFinite ? min(max(configuration.backgroundShare, 0), 0.9) : 0
            backgroundCreditRate = share / (1 - share)
        }

        /// The credit a waiting background record needs to go before higher-priority work.
        var backgroundQuantum: Int64 { max(1, Int64(clamping: pollInterval / 2)) }
        /// How far background work may run ahead of its share while others wait.
        var maxBackgroundDebt: Int64 { Int64(clamping: 2 &* pollInterval) }
        /// The most credit background work can hold.
        var maxBackgroundCredit: Int64 { Int64(clamping: maxStarvation) }
    }

    let policy: Policy
    private let local = PerPriority { _ in RingBuffer<ReadyRecord>() }
    @exclusivity(unchecked) private var remote = PerPriority(repeating: RemoteBatch())
    /// Per priority: whether the next pick goes to the remote batch (round robin with local work).
    @exclusivity(unchecked) private var preferRemote = PerPriority(repeating: false)
    /// Records that become ready after the next poll (one "turn" later).
    @exclusivity(unchecked) private var nextTurn: [ReadyRecord] = []
    /// How many of `nextTurn` are `.background`: fed work between two turns is waiting work.
    @exclusivity(unchecked) private var nextTurnBackground = 0
    /// Background work's credit (ns) under the guaranteed-share rule.
    @exclusivity(unchecked) private(set) var backgroundCredit: Int64 = 0
    /// Every callback's own time and every poll's time, summed: lets an outer callback subtract
    /// what nested passes did inside it.
    @exclusivity(unchecked) private var accountedNanoseconds: UInt64 = 0
    /// The time of the last clock read: the stamp for work posted on the loop's thread.
    @exclusivity(unchecked) private(set) var cachedNow: UInt64
    @exclusivity(unchecked) var counters: LoopCounters

    init(policy: Policy, collectsQueueWait: Bool, now: UInt64) {
        self.policy = policy
        self.cachedNow = now
        self.counters = LoopCounters(collectsQueueWait: collectsQueueWait)
    }

    // MARK: Queueing

    /// Makes `record` ready at `priority`.
    @inline(__always)
    func enqueue(_ record: consuming ReadyRecord, _ priority: Priority) {
        // (A switch on the stored rings, not `local[priority]`: the subscript returns the ring
        // as a new reference, a retain/release pair per record.)
        switch priority {
        case .input: local.input.append(record)
        case .normal: local.normal.append(record)
        case .background: local.background.append(record)
        }
    }

    /// Queues `record` to become ready (at `record.priority`) after the next poll.
    func enqueueNextTurn(_ record: consuming ReadyRecord) {
        if record.priority == .background { nextTurnBackground &+= 1 }
        nextTurn.append(record)
    }

    /// Makes the records queued for the next turn ready, stamped with `clock`'s now: closures go
    /// to their queue, sources are fired with their turn readiness. Called after each poll.
    func promoteNextTurn<Clock: SchedulerClock>(clock: Clock) {
        guard !nextTurn.isEmpty else { return }
        let now = clock.now()
        let promoted = nextTurn
        nextTurn.removeAll(keepingCapacity: true)
        nextTurnBackground = 0
        for var record in promoted {
            record.stamp = now
            if let source = record.source {
                source.fire(source.turnReadiness)
            } else {
                enqueue(record, record.priority)
            }
        }
    }

    /// Takes cross-thread posts into every priority's batch that is used up (called with the
    /// remote queue's lock held). Returns how many it took.
    @inline(__always)
    func takeRemote(from queue: inout RemoteQueue, now: UInt64) -> Int {
        if queue.isEmpty { return 0 }
        return remote.input.refill(from: &queue.items.input, at: now)
            + remote.normal.refill(from: &queue.items.normal, at: now)
            + remote.background.refill(from: &queue.items.background, at: now)
    }

    /// Whether anything is ready or queued for the next turn.
    var hasReadyWork: Bool {
        higherPriorityWaiting || !local.background.isEmpty || !remote.background.isEmpty || !nextTurn.isEmpty
    }

    /// Adds time the loop spent outside callbacks (a poll) to the nested-time account.
    func accountPoll(nanoseconds: UInt64) { accountedNanoseconds &+= nanoseconds }

    /// Drops every queued record (the loop is shutting down). Returns how many there were.
    func removeAll() -> Int {
        var dropped = nextTurn.count
        for priority in Priority.allCases {
            // A concurrency job is a suspended task: it is handed on, never just dropped.
            while case let record? = local[priority].popFirst() {
                record.drop()
                dropped += 1
            }
            dropped += remote[priority].remaining
            remote[priority] = RemoteBatch()
        }
        nextTurn.removeAll()
        nextTurnBackground = 0
        return dropped
    }

    // MARK: Dispatching

    /// Runs ready records, by `next(now:)`, until `pollInterval` has passed (the callback in
    /// progress finishes), nothing is ready, or `shouldStop` says so (checked after each
    /// callback). Reads `clock` once before and once after each callback. Calls `afterInput`
    /// after an `.input` record when no more input is ready and lower-priority work is (the
    /// loop writes the replies to input there, rather than after the pass: see "Input's output
    /// first"), and reads the clock after it. Returns how many ran.
    @inline(__always)
    func runPass<Clock: SchedulerClock>(clock: Clock, afterInput: () -> Void = {}, until shouldStop: () -> Bool) -> Int {
        var now = clock.now()
        cachedNow = now
        counters.iterations &+= 1
        let passDeadline = now &+ policy.pollInterval
        var ran = 0
        while case (var record, let priority)? = next(now: now) {
            let start = now
            let stamp = record.stamp
            let accountedBefore = accountedNanoseconds
            // Background work waits while this runs if it is ready, or queued for the next turn
            // (fed work between two turns): either way this callback's time earns it credit.
            let backgroundWaited = priority != .background && backgroundIsWaiting
            if Clock.tracesDispatches { clock.willRun(record.job) }
            record.run()
            if Clock.tracesDispatches { clock.didRun() }
            now = clock.now()
            cachedNow = now
            let elapsed = now &- start
            let nested = accountedNanoseconds &- accountedBefore
            let own = elapsed > nested ? elapsed &- nested : 0
            accountedNanoseconds &+= own
            account(priority, own: own, waited: start > stamp ? start &- stamp : 0,
                    backgroundWaited: backgroundWaited)
            ran &+= 1
            // The last input record for now, with lower-priority work next: what input wrote
            // goes out first. (Checked after input records only: it costs other work nothing.)
            if priority == .input, !inputIsReady, lowerPriorityIsReady {
                afterInput()
                now = clock.now()
                cachedNow = now
            }
            if now >= passDeadline || shouldStop() { break }
            // Fed work queues its next turn for after the next poll, so at most one background
            // turn is ready per pass. While background work still has credit and higher-priority
            // work waits, poll now: the next turn becomes ready and can use the credit. Otherwise
            // one long input callback per pass would cap background work at one turn per such
            // callback, far below its guaranteed share.
            if priority == .background, nextTurnBackground > 0, backgroundCredit >= policy.backgroundQuantum,
                higherPriorityWaiting
            {
                break
            }
        }
        return ran
    }

    /// The next record by priority, tempered by fairness: a waiting `.background` record runs
    /// before higher-priority work once it has earned a quantum of credit or has waited
    /// `maxStarvation`.
    @inline(__always)
    func next(now: UInt64) -> (ReadyRecord, Priority)? {
        if backgroundIsReady, higherPriorityWaiting, let stamp = oldestBackgroundStamp,
            backgroundCredit >= policy.backgroundQuantum || now &- min(stamp, now) >= policy.maxStarvation,
            let record = take(.background)
        {
            return (record, .background)
        }
        if let record = take(.input) { return (record, .input) }
        if let record = take(.normal) { return (record, .normal) }
        if let record = take(.background) { return (record, .background) }
        return nil
    }

    /// Books one callback: its metrics, and the guaranteed share's credit.
    @inline(__always)
    func account(_ priority: Priority, own: UInt64, waited: UInt64, backgroundWaited: Bool) {
        counters.record(priority: priority, own: own, waited: waited)
        if own > policy.stallThreshold { counters.recordStall(own) }
        switch priority {
        case .background:
            if higherPriorityWaiting {
                backgroundCredit = max(backgroundCredit &- Int64(clamping: own), -policy.maxBackgroundDebt)
            } else {
                backgroundCredit = 0
            }
        case .input, .normal:
            if backgroundWaited {
                let earned = Int64(Double(own) * policy.backgroundCreditRate)
                backgroundCredit = min(backgroundCredit &+ earned, policy.maxBackgroundCredit)
            }
        }
    }

    // MARK: Queue state

    private var backgroundIsReady: Bool { !local.background.isEmpty || !remote.background.isEmpty }

    private var backgroundIsWaiting: Bool { backgroundIsReady || nextTurnBackground > 0 }

    private var inputIsReady: Bool { !local.input.isEmpty || !remote.input.isEmpty }

    private var lowerPriorityIsReady: Bool {
        !local.normal.isEmpty || !remote.normal.isEmpty || backgroundIsReady
    }

    private var higherPriorityWaiting: Bool {
        !local.input.isEmpty || !local.normal.isEmpty || !remote.input.isEmpty || !remote.normal.isEmpty
    }

    /// The stamp of the oldest ready background record, local or remote.
    private var oldestBackgroundStamp: UInt64? {
        switch (local.background.peekFirst { $0.stamp }, remote.background.firstStamp) {
        case let (local?, remote?): return min(local, remote)
        case let (local?, nil): return local
        case let (nil, remote?): return remote
        case (nil, nil): return nil
        }
    }

    /// One record of a priority: local and cross-thread work take turns when both are ready.
    @inline(__always)
    private func take(_ priority: Priority) -> ReadyRecord? {
        let remoteIsEmpty = remote[priority].isEmpty
        if !local[priority].isEmpty && (remoteIsEmpty || !preferRemote[priority]) {
            preferRemote.update(priority) { $0 = true }
            switch priority {
            case .input: return local.input.popFirst()
            case .normal: return local.normal.popFirst()
            case .background: return local.background.popFirst()
            }
        }
        if !remoteIsEmpty {
            preferRemote.update(priority) { $0 = false }
            return remote.update(priority) { $0.popFirst() }
        }
        return nil
    }
}
