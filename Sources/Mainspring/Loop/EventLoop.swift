import Synchronization

/// A libevent-backed run loop: timers, fd readiness, signals, line readers and posted work,
/// dispatched by priority on one thread.
///
/// ## Threads
/// A loop belongs to one thread. `EventLoop.main` belongs to the process main thread and
/// `EventLoop.current` to the calling thread. A loop made with `init` belongs to the first thread
/// that runs it or registers a source on it (`run`, `runOnce`, `spin`, `schedule`, `watch`, …);
/// those calls fail loudly on any other thread (`EventLoopError.wrongThread`, or a precondition
/// for the calls that cannot throw). `execute`, `stop` and `submit` work from any thread.
/// When the thread a loop belongs to exits, the loop is shut down for good: its sources are
/// closed and work still queued, or posted later, is dropped and counted in
/// `LoopMetrics.droppedAtShutdown`.
///
/// ## Who polls, who dispatches
/// libevent only demultiplexes (epoll, the timer heap). Its callbacks append a ready record and
/// return; Mainspring's scheduler runs the records afterwards, highest priority first, and the
/// loop polls again at least every `Configuration.pollInterval` (see `Scheduler` for the rules).
/// No user code runs inside `event_base_loop`, so any handler can `spin` the loop (nested,
/// several levels deep), and a handler is never re-entered while it runs.
///
/// ## Cost
/// A post from the loop's own thread takes no lock (a ring-buffer append); a post from another
/// thread takes one uncontended mutex and writes the loop's eventfd only when the loop sleeps.
/// An idle loop sleeps in `epoll_wait` with no timeout: no CPU, no wake-ups.
public final class EventLoop: @unchecked Sendable {
    /// The loop's fairness and metrics settings, fixed at creation.
    public let configuration: Configuration

    // MARK: Thread binding (any thread reads these; see EventLoop+Threads.swift)

    /// `pthread_self()` of the owning thread; 0 while unbound, `deadOwner` once it exited.
    let ownerThread = Atomic<UInt>(0)
    static let deadOwner = UInt.max
    /// Whether this is `EventLoop.main` (which only the process main thread may own).
    let isMainLoop: Bool

    // MARK: Cross-thread state

    /// Work posted from other threads (see EventLoop+Posting.swift).
    let remote = Protected(RemoteQueue())
    let stopRequested = Atomic<Bool>(false)
    let wakeup: WakeupDescriptor
    /// What the loop is doing, for other threads (see `activity`).
    let activityStamp = ActivityStamp()

    // MARK: Loop-thread state (touched only by the owner)

    let base: EventBase
    /// The ready queues and the fairness policy.
    let scheduler: Scheduler
    /// The loop's clock seam (LoopClock.swift): the dispatcher's stamps and deadlines on the
    /// calibrated cycle counter, timers and spin timeouts on `CLOCK_MONOTONIC` (`monotonicNow()`)
    /// — or both on the simulation's virtual clock when the loop is simulated.
    let timeSource: DispatchClock
    /// The simulation that drives this loop (`MainspringTesting`); nil for a real loop.
    let simulation: (any LoopSimulating)?
    /// What the loop reaches the world through: the kernel, or its simulation (see `LoopWorld`).
    let world: any LoopWorld
    /// Whether this loop is simulated (`MainspringTesting`): its time is virtual and it refuses
    /// real descriptors. (`simulation != nil` as a plain flag: the hot paths test it without
    /// copying, and so retaining, the existential.)
    @_spi(Simulation)
    public let isSimulated: Bool
    private var wakeupTarget: WakeupTarget?
    /// Target of the timer that bounds a blocking poll in `spin(until:timeout:)`: does nothing.
    private let timeoutTarget = NativeEventTarget()
    /// Run (once) before the next poll: handing buffered output to the sockets. See
    /// `beforeNextPoll`.
    @exclusivity(unchecked) var prePollParticipants: [any PollPreparing] = []
    /// The other half of a double buffer with `prePollParticipants`: the list being run, so that
    /// participants added meanwhile go to the next poll and neither array ever reallocates.
    @exclusivity(unchecked) private var preparingParticipants: [any PollPreparing] = []
    /// Emptied output buffers of connections that wrote everything they had (see
    /// `ConnectionSource.flushPendingOutput`): a connection takes one when it next writes, so
    /// that an idle connection holds no buffer and a request allocates none. At most
    /// `ConnectionSource.maxSpareOutputBuffers`; past that, a connection keeps its own.
    @exclusivity(unchecked) var spareOutputBuffers: [[UInt8]] = []
    /// The stamp of sources fired during the current poll (0: not read yet).
    @exclusivity(unchecked) var pollStamp: UInt64 = 0
    /// How many `run`/`spin` calls are on the stack.
    @exclusivity(unchecked) private var runDepth = 0
    var sources: [ObjectIdentifier: Source] = [:]
    /// Open sources with `keepsLoopBusy`, plus in-flight work of `LoopAttachment`s (see
    /// `isQuiescent`).
    var busySources = 0
    /// The timers' deadlines, in order (Events/TimerQueue.swift).
    private(set) lazy var timerQueue = TimerQueue(loop: self)
    /// Open, shut down (posts counted as dropped instead of queued), or being freed (nothing may
    /// take a reference to the loop any more). Loop thread only, or `deinit`.
    var lifecycle = LoopLifecycle()
    /// The loop's inotify descriptor and its file watches, while it has any
    /// (Files/FileWatchSources.swift). Loop thread only.
    var fileWatchHub: InotifyHub?
    /// `EventLoop.main` only: the Dispatch main-queue bridge, installed when the loop first runs.
    var mainQueueSource: MainQueueSource?
    /// The serial executor of the actors pinned to this loop (see Executor.swift).
    let actorExecutor = LoopActorExecutor()
    /// The priority of jobs enqueued from this loop's thread right now: `.input` while an input
    /// source resumes the task waiting for it (see `resumingInput`). Loop thread only.
    var jobPriority: Priority = .normal

    // MARK: Creation

    /// Creates a loop, not yet bound to a thread.
    ///
    /// - Throws: `EventLoopError.libevent` or `.system` when libevent or the eventfd cannot be
    ///   created (out of file descriptors, say).
    public convenience init(configuration: Configuration = .init()) throws(EventLoopError) {
        try self.init(configuration: configuration, isMainLoop: false)
    }

    /// Creates a loop driven by `simulation` (`MainspringTesting`): its time is the simulation's
    /// virtual clock, it runs on the thread that drives the simulation, and it refuses real
    /// descriptors (`EventLoopError.simulatedLoop`).
    @_spi(Simulation)
    public convenience init(simulation: any LoopSimulating, configuration: Configuration = .init())
        throws(EventLoopError)
    {
        try self.init(configuration: configuration, isMainLoop: false, simulation: simulation)
    }

    init(configuration: Configuration, isMainLoop: Bool, simulation: (any LoopSimulating)? = nil)
        throws(EventLoopError)
    {
        self.configuration = configuration
        self.isMainLoop = isMainLoop
        self.simulation = simulation
        self.isSimulated = simulation != nil
        self.world = Self.makeWorld(for: simulation)
        self.timeSource = DispatchClock(fast: FastClock.shared, virtual: simulation?.clock)
        self.base = try EventBase()
        self.wakeup = try WakeupDescriptor()
        self.scheduler = Scheduler(policy: .init(configuration), collectsQueueWait: configuration.collectsMetrics,
                                   now: timeSource.now())
        let target = WakeupTarget()
        let event = try NativeEvent(base: base, fd: wakeup.fd, readiness: .read, persistent: true, target: target)
        try event.add()
        target.native = event
        target.descriptor = wakeup
        wakeupTarget = target
        actorExecutor.loop = self
        world.loopMade(self)
    }

    deinit {
        // Nobody can run this loop any more: close its sources (their handlers are dropped, not
        // called) and count the work that will never run.
        lifecycle.beginFreeing()
        _ = shutdownNow()
        wakeupTarget?.native = nil
    }

    // MARK: Running

    /// Runs the loop until `stop()` is called: polls, dispatches, sleeps in epoll when idle.
    ///
    /// A `stop()` that arrives while the loop is not running makes the next `run()` return at
    /// once, so a `stop()` racing a `run()` starting on another thread is never lost. Work still
    /// queued when `run()` returns stays queued and runs the next time the loop runs.
    ///
    /// - Throws: `EventLoopError.wrongThread` when the loop belongs to another thread (or, for
    ///   `EventLoop.main`, the caller is not the main thread); `.system` (`event_base_loop`, with
    ///   the errno) if polling fails.
    public func run() throws(EventLoopError) {
        guard claimThread() else {
            throw .wrongThread(function: isMainLoop ? "EventLoop.main.run() (main thread only)" : "EventLoop.run()")
        }
        try installMainQueueBridgeIfNeeded()
        try whileRunning { () throws(EventLoopError) in
            while !stopRequested.exchange(false, ordering: .acquiring) {
                if try iterate(blocking: true, deadline: nil, condition: { false }) < 0 {
                    throw .simulatedLoop(refused: "to wait forever: nothing is runnable and no deadline is armed (deadlock)")
                }
            }
        }
    }

    /// Runs one iteration: one poll (waiting for an event when `blocking` and nothing is ready),
    /// then ready work for at most `Configuration.pollInterval`.
    ///
    /// Must be called on the loop's thread (precondition). A failing poll — epoll refusing the
    /// loop's own descriptors, which leaves the loop unusable — stops the program with the
    /// error (`run()` throws it instead).
    /// - Returns: how many callbacks ran (0 when nothing was ready).
    @discardableResult
    @available(*, noasync, message: "loop thread only, and it would run the loop inside a task; in async code await what you wait for (`sleep(for:)`, a read)")
    public func runOnce(blocking: Bool = true) -> Int {
        preconditionOnLoop("EventLoop.runOnce(blocking:)")
        installMainQueueBridgeOrDie()
        return whileRunning(nested: false) { iterateOrDie(blocking: blocking, deadline: nil, condition: { false }) }
    }

    /// Runs the loop until `condition` holds, the timeout passes, or `stop()` is called — the
    /// `RunLoop.run(mode:before:)` pattern done right: the thread sleeps in epoll while waiting.
    ///
    /// Works from inside any handler, nested to any depth: the handler that spins is held back
    /// (never re-entered), everything else keeps running. `condition` is checked before
    /// starting and after every callback, on this thread. A condition changed by another thread
    /// is only noticed when the loop wakes up, so change it inside `execute { … }`.
    ///
    /// Must be called on the loop's thread (precondition). A failing poll stops the program,
    /// as for `runOnce`.
    /// - Parameters:
    ///   - condition: what to wait for; checked on this thread, before starting and after
    ///     every callback.
    ///   - timeout: the longest to spin; `nil` for no limit, negative counts as zero.
    /// - Returns: whether `condition` holds on return (`false` after a timeout or a `stop()`).
    ///   A `stop()` ends every nested spin; the outermost `run` or `spin` consumes it.
    @discardableResult
    @available(*, noasync, message: "loop thread only, and it would run the loop inside a task; in async code await what you wait for (`sleep(for:)`, a read, `job.outcome`)")
    public func spin(until condition: () -> Bool, timeout: Duration? = nil) -> Bool {
        preconditionOnLoop("EventLoop.spin(until:timeout:)")
        installMainQueueBridgeOrDie()
        if condition() { return true }
        let deadline = timeout.map { monotonicNow() &+ $0.clampedNanoseconds }
        return whileRunning {
            while true {
                if stopRequested.load(ordering: .acquiring) {
                    if runDepth == 1 { stopRequested.store(false, ordering: .relaxed) }
                    return condition()
                }
                if let deadline, monotonicNow() >= deadline { return condition() }
                if iterateOrDie(blocking: true, deadline: deadline, condition: condition) < 0 {
                    return condition()  // a simulated loop that can never make progress
                }
                if condition() { return true }
            }
        }
    }

    /// Asks the loop to stop: `run()` returns (and nested `spin`s return `false`) after the
    /// callback in progress. Any thread; never blocks.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Runs `body` as this thread's running loop; as one more level of `run`/`spin` unless
    /// `nested` is false (`runOnce`, which does not consume a `stop()`).
    private func whileRunning<Result, Failure: Error>(nested: Bool = true, _ body: () throws(Failure) -> Result)
        throws(Failure) -> Result
    {
        let previousRunning = Self.runningLoop.value
        Self.runningLoop.set(self)
        let depth = nested ? 1 : 0
        runDepth += depth
        let outermost = previousRunning !== self
        if outermost { activityStamp.set(timeSource.now()) }
        defer {
            runDepth -= depth
            Self.runningLoop.set(previousRunning)
            if outermost { activityStamp.set(ActivityStamp.notRunning) }
        }
        return try body()
    }

    // MARK: The iteration

    /// `iterate` for the calls that cannot throw: a poll failure is unrecoverable, so it is fatal.
    @discardableResult
    private func iterateOrDie(blocking: Bool, deadline: UInt64?, condition: () -> Bool) -> Int {
        do {
            return try iterate(blocking: blocking, deadline: deadline, condition: condition)
        } catch {
            fatalError("Mainspring: the loop cannot poll: \(error)")
        }
    }

    /// Polls once, then dispatches. `deadline` (monotonic ns) bounds a blocking poll. Returns
    /// how many callbacks ran; -1 only on a simulated loop that can never make progress.
    ///
    /// (Kept small, with the rare and the per-pass parts in functions of their own, so that the
    /// optimiser inlines the dispatch pass, `Scheduler.runPass`, here: otherwise the closure
    /// below retains and releases the loop once per callback.)
    private func iterate(blocking: Bool, deadline: UInt64?, condition: () -> Bool) throws(EventLoopError) -> Int {
        if isSimulated { return iterateSimulated(blocking: blocking, deadline: deadline, condition: condition) }
        // Before the decision to block: handing output over can make work (a connection whose
        // response went out takes the next request it had buffered — a pipelined one), which a
        // blocking poll would leave waiting for the next event or timer.
        runPrePollActions()
        // One lock per pass: either take the cross-thread posts, or (nothing to do at all)
        // declare the loop asleep so that the next producer writes the eventfd.
        let mightSleep = blocking && !scheduler.hasReadyWork
        let tookRemote = mightSleep && takeRemoteWork(orSleep: true)
        let mayBlock = mightSleep && !tookRemote
        let timeoutEvent = mayBlock && deadline != nil ? try armPollTimeout(deadline: deadline!) : nil
        defer { timeoutEvent?.delete() }
        let pollStart = mayBlock ? timeSource.fast.now() : 0
        scheduler.counters.polls += 1
        if mayBlock { activityStamp.set(0) }
        pollStamp = 0
        try base.poll(blocking: mayBlock)
        let polled = timeSource.fast.now()
        activityStamp.set(polled)
        if mayBlock { scheduler.accountPoll(nanoseconds: polled &- pollStart) }
        if let target = wakeupTarget, target.didFire {
            target.didFire = false
            scheduler.counters.wakeups += 1
        }
        if !tookRemote { _ = takeRemoteWork(orSleep: false) }
        scheduler.promoteNextTurn(clock: timeSource.fast)
        return scheduler.runPass(clock: timeSource.fast, afterInput: { runPrePollActions() }) {
            stopRequested.load(ordering: .relaxed) || condition()
        }
    }

    /// `iterate` on a simulated loop: no poll. Due timers fire at the virtual now; when
    /// `blocking` and nothing is runnable, the simulation runs its other loops and moves virtual
    /// time to the next deadline (no later than `deadline`) first. Returns -1 when nothing can
    /// ever become runnable.
    @inline(never)
    private func iterateSimulated(blocking: Bool, deadline: UInt64?, condition: () -> Bool) -> Int {
        if blocking && !hasRunnableWork, let simulation {
            guard simulation.waitForWork(on: self, until: deadline) else { return -1 }
        }
        return runSimulatedIteration(condition: condition)
    }

    /// One iteration of a simulated loop, never waiting: the pre-poll actions, the timers due at
    /// the virtual now, the cross-thread posts, the next turn, then one dispatch pass (each
    /// dispatch told to the simulation for its trace). Returns how many callbacks ran.
    @_spi(Simulation)
    public func runSimulatedIteration(condition: () -> Bool = { false }) -> Int {
        guard let simulation else { return 0 }
        let clock = SimulatedDispatchClock(loop: self, simulation: simulation)
        runPrePollActions()
        // What a poll would run of libevent's own (a freed bufferevent's finalizer, say).
        if base.hasActiveCallbacks { base.runActiveCallbacks() }
        scheduler.counters.polls += 1
        pollStamp = 0
        let now = clock.now()  // never 0: virtual readings start at `VirtualClock.epoch`
        activityStamp.set(now)
        timerQueue.fireDue(now: now)
        _ = takeRemoteWork(orSleep: false)
        scheduler.promoteNextTurn(clock: clock)
        let ran = whileRunning(nested: false) {
            scheduler.runPass(clock: clock, afterInput: { runPrePollActions() }) {
                stopRequested.load(ordering: .relaxed) || condition()
            }
        }
        // Between its iterations a simulated loop waits for the simulation to drive it, as a
        // real one waits in its poll: `.waiting` (unless an outer dispatch of it goes on, or it
        // is shut down).
        if Self.runningLoop.value !== self && !lifecycle.isShutDown { activityStamp.set(0) }
        return ran
    }

    /// Whether a simulated loop has something to do at the current virtual instant: ready work,
    /// cross-thread posts, work for the next turn, output to flush, or a timer that is due.
    @_spi(Simulation)
    public var hasRunnableWork: Bool {
        if scheduler.hasReadyWork || !prePollParticipants.isEmpty || !remote.withLock({ $0.isEmpty }) { return true }
        if base.hasActiveCallbacks { return true }
        if let due = timerQueue.nextDeadline, due <= monotonicNow() { return true }
        return false
    }

    /// The earliest armed deadline of the loop's timers (virtual ns on a simulated loop).
    @_spi(Simulation)
    public var nextDeadline: UInt64? { timerQueue.nextDeadline }

    /// What is still open on the loop, one line per kind of source with a count ("2
    /// TimerSource"), for a simulation's deadlock report. Loop thread only.
    @_spi(Simulation)
    public var openSourceSummary: [String] {
        var counts: [String: Int] = [:]
        for source in sources.values { counts[source.traceLabel, default: 0] += 1 }
        return counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }
    }

    /// Takes the cross-thread posts into the scheduler (one lock). With `orSleep`, an empty queue
    /// instead marks the loop asleep, so that the next poster writes the eventfd; without it, the
    /// loop is awake. Returns whether it took any.
    @inline(never)
    private func takeRemoteWork(orSleep: Bool) -> Bool {
        // After a poll the clock is read before the lock, so that a poster waits as briefly as
        // possible; before one, only if there is something to take (usually there is not).
        let polled = orSleep ? 0 : pollStamp == 0 ? timeSource.now() : pollStamp
        let taken = remote.withLock { queue -> Int in
            if orSleep {
                if queue.sleepIfEmpty() { return 0 }
            } else {
                queue.wake()
                if queue.isEmpty { return 0 }
            }
            return scheduler.takeRemote(from: &queue, now: orSleep ? timeSource.now() : polled)
        }
        scheduler.counters.remoteItems &+= taken
        return taken > 0
    }

    /// A timer that ends a blocking poll at `deadline` (monotonic ns), for `spin(until:timeout:)`.
    @inline(never)
    private func armPollTimeout(deadline: UInt64) throws(EventLoopError) -> NativeEvent {
        let now = monotonicNow()
        let event = try NativeEvent(timerOn: base, target: timeoutTarget)
        try event.add(timeoutNanoseconds: deadline > now ? deadline - now : 0)
        return event
    }

    /// Runs the actions registered with `beforeNextPoll` (hands coalesced output to the sockets,
    /// re-arms the timer): before each poll, and in a pass once its `.input` records have run
    /// and lower-priority work is next.
    private func runPrePollActions() {
        guard !prePollParticipants.isEmpty else { return }
        swap(&prePollParticipants, &preparingParticipants)
        for participant in preparingParticipants { participant.prepareForPoll() }
        preparingParticipants.removeAll(keepingCapacity: true)
    }
}

/// Drains the loop's eventfd when it fires (inside the poll: internal work only).
private final class WakeupTarget: NativeEventTarget {
    var native: NativeEvent?
    var descriptor: WakeupDescriptor?
    /// Set when the eventfd fired; the loop counts it as a wake-up and clears it.
    var didFire = false
    override func nativeEventFired(_ readiness: Readiness) {
        descriptor?.drain()
        didFire = true
    }
}
