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
/// return; Mainspring runs the records afterwards, highest priority first, and polls again at
/// least every `Configuration.pollInterval`. No user code runs inside `event_base_loop`, so any
/// handler can `spin` the loop (nested, several levels deep), and a handler is never re-entered
/// while it runs.
///
/// ## Cost
/// A post from the loop's own thread takes no lock (a ring-buffer append); a post from another
/// thread takes one uncontended mutex and writes the loop's eventfd only when the loop sleeps.
/// An idle loop sleeps in `epoll_wait` with no timeout: no CPU, no wake-ups.
public final class EventLoop: @unchecked Sendable {
    /// The loop's fairness and metrics settings, fixed at creation.
    public let configuration: Configuration

    // MARK: Thread binding (any thread reads these)

    /// `pthread_self()` of the owning thread; 0 while unbound, `deadOwner` once it exited.
    private let ownerThread = Atomic<UInt>(0)
    private static let deadOwner = UInt.max
    /// Whether this is `EventLoop.main` (which only the process main thread may own).
    let isMainLoop: Bool

    // MARK: Cross-thread state

    private let remote = Protected(RemoteQueue())
    private let stopRequested = Atomic<Bool>(false)
    private let wakeup: WakeupDescriptor

    // MARK: Loop-thread state (touched only by the owner)

    let base: EventBase
    private var wakeupTarget: WakeupTarget?
    /// Target of the timer that bounds a blocking poll in `spin(until:timeout:)`: does nothing.
    private let timeoutTarget = NativeEventTarget()
    @exclusivity(unchecked) private var inputQueue = RingBuffer<ReadyRecord>()
    @exclusivity(unchecked) private var normalQueue = RingBuffer<ReadyRecord>()
    @exclusivity(unchecked) private var backgroundQueue = RingBuffer<ReadyRecord>()
    /// Run (once) just before the next poll: handing buffered output to libevent, which only
    /// writes while it polls. See `beforeNextPoll`.
    @exclusivity(unchecked) private var prePollActions: [() -> Void] = []
    /// Records that become ready after the next poll (one "turn" later).
    @exclusivity(unchecked) private var nextTurn: [ReadyRecord] = []
    /// How many of `nextTurn` are `.background`: fed work between two turns is waiting work.
    @exclusivity(unchecked) private var nextTurnBackground = 0
    /// Cross-thread posts taken from `remote`, one batch per priority, consumed in place.
    @exclusivity(unchecked) private var inputRemote = RemoteBatch()
    @exclusivity(unchecked) private var normalRemote = RemoteBatch()
    @exclusivity(unchecked) private var backgroundRemote = RemoteBatch()
    /// Per priority: whether the next pick goes to the remote batch (round robin with local work).
    @exclusivity(unchecked) private var preferRemote: (Bool, Bool, Bool) = (false, false, false)
    private var sources: [ObjectIdentifier: Source] = [:]
    /// Open sources with `keepsLoopBusy` (see `isQuiescent`).
    private var busySources = 0
    /// The timers' deadlines, in order (Events/TimerQueue.swift).
    private(set) lazy var timerQueue = TimerQueue(loop: self)
    /// Set by `shutdownNow()`: posts are counted as dropped instead of queued.
    private var isShutDown = false
    /// `EventLoop.main` only: the Dispatch main-queue bridge, installed when the loop first runs.
    var mainQueueSource: MainQueueSource?
    /// The time of the last clock read: the stamp for posts and readiness.
    @exclusivity(unchecked) private(set) var cachedNow: UInt64
    @exclusivity(unchecked) private var pollStamp: UInt64 = 0
    /// How many `run`/`spin` calls are on the stack.
    @exclusivity(unchecked) private var runDepth = 0
    /// Background work's credit (ns) under the guaranteed-share rule; see `nextRecord`.
    @exclusivity(unchecked) private var backgroundCredit: Int64 = 0
    /// Every callback's own time and every poll's time, summed: lets an outer callback subtract
    /// what nested spins did inside it.
    @exclusivity(unchecked) private var accountedNanoseconds: UInt64 = 0
    @exclusivity(unchecked) var counters: LoopCounters

    /// The dispatcher's clock (a calibrated cycle counter): every stamp and deadline of the
    /// scheduler uses it. Timers and spin timeouts use `monotonicNanoseconds()` instead.
    let clock = FastClock.shared
    private let pollIntervalNanoseconds: UInt64
    private let maxStarvationNanoseconds: UInt64
    private let stallThresholdNanoseconds: UInt64
    private let backgroundCreditRate: Double
    /// The credit a waiting background record needs to go before higher-priority work: half a
    /// poll interval. Below it, priorities are strict; so short bursts of input never wait.
    private var backgroundQuantum: Int64 { max(1, Int64(clamping: pollIntervalNanoseconds / 2)) }
    /// How far background work may run ahead of its share while others wait (two poll intervals).
    private var maxBackgroundDebt: Int64 { Int64(clamping: 2 &* pollIntervalNanoseconds) }

    // MARK: Creation

    /// Creates a loop, not yet bound to a thread.
    ///
    /// - Throws: `EventLoopError.libevent` or `.system` when libevent or the eventfd cannot be
    ///   created (out of file descriptors, say).
    public convenience init(configuration: Configuration = .init()) throws {
        try self.init(configuration: configuration, isMainLoop: false)
    }

    init(configuration: Configuration, isMainLoop: Bool) throws(EventLoopError) {
        self.configuration = configuration
        self.isMainLoop = isMainLoop
        self.base = try EventBase()
        self.wakeup = try WakeupDescriptor()
        self.pollIntervalNanoseconds = configuration.pollInterval.clampedNanoseconds
        self.maxStarvationNanoseconds = configuration.maxStarvation.clampedNanoseconds
        self.stallThresholdNanoseconds = configuration.stallThreshold.clampedNanoseconds
        let share = configuration.backgroundShare.isFinite ? min(max(configuration.backgroundShare, 0), 0.9) : 0
        self.backgroundCreditRate = share / (1 - share)
        self.cachedNow = FastClock.shared.now()
        self.counters = LoopCounters(collectsQueueWait: configuration.collectsMetrics)
        let target = WakeupTarget()
        let event = try NativeEvent(base: base, fd: wakeup.fd, readiness: .read, persistent: true, target: target)
        try event.add()
        target.native = event
        target.descriptor = wakeup
        wakeupTarget = target
    }

    deinit {
        // Nobody can run this loop any more: close its sources (their handlers are dropped, not
        // called) and count the work that will never run.
        _ = shutdownNow()
        wakeupTarget?.native = nil
    }

    // MARK: Threads

    /// The loop of the process main thread.
    ///
    /// While it runs (`run`, `spin`, `runOnce` on the main thread) it also drains the Dispatch
    /// main queue, so `DispatchQueue.main.async`, `asyncAfter`, `MainActor.run`,
    /// `Task { @MainActor in … }` run inside it, on the main thread, between its other callbacks
    /// (see `MainThread/MainQueueBridge.swift` for the rules). Only the main thread can own it:
    /// `run()` from another thread throws `EventLoopError.wrongThread`. Posting to it
    /// (`execute`, `submit`, `Queue.main`) works from any thread. Do not mix it with
    /// `RunLoop.main.run()` or `dispatchMain()`, which drain the same main queue their own way.
    public static let main: EventLoop = {
        do {
            return try EventLoop(configuration: .init(), isMainLoop: true)
        } catch {
            fatalError("Mainspring: cannot create the main loop: \(error)")
        }
    }()

    private static let threadLoop = ThreadLocalReference<EventLoop>()

    /// The calling thread's loop, created (and bound to the thread) on first use; on the main
    /// thread it is `EventLoop.main`. The thread keeps its loop until it exits — the
    /// `RunLoop.current` analogue. When the thread exits, the loop is shut down: its sources are
    /// closed, and work still queued (or posted later) is dropped and counted in
    /// `LoopMetrics.droppedAtShutdown`.
    ///
    /// On a thread of Swift concurrency's cooperative pool (inside a `Task`) this is a loop that
    /// nobody runs; use `EventLoop.main`, a loop you run on a thread of your own, or an
    /// `EventLoopGroup`.
    public static var current: EventLoop {
        if let loop = threadLoop.value { return loop }
        let loop: EventLoop
        if isProcessMainThread() {
            loop = main
        } else {
            do {
                loop = try EventLoop(configuration: .init(), isMainLoop: false)
            } catch {
                fatalError("Mainspring: cannot create a loop for this thread: \(error)")
            }
        }
        _ = loop.claimThread()
        threadLoop.set(loop)
        return loop
    }

    /// The loop whose `run`/`spin`/`runOnce` is innermost on the calling thread's stack.
    private static let runningLoop = ThreadLocalUnretained<EventLoop>()

    /// The loop a blocking wait on the calling thread should keep running (nested) instead of
    /// freezing: the loop this thread is running right now, else its `EventLoop.current` if it
    /// has one, else `EventLoop.main` on the main thread. `nil` on a plain thread (never creates
    /// a loop).
    static var loopToSpinWhileWaiting: EventLoop? {
        if let loop = runningLoop.value { return loop }
        if let loop = threadLoop.value { return loop }
        if isProcessMainThread() && main.claimThread() { return main }
        return nil
    }

    /// Whether the caller is on this loop's thread. Never a false positive; `false` for a loop
    /// no thread has claimed yet (except `EventLoop.main` on the main thread).
    public var isCurrent: Bool {
        let owner = ownerThread.load(ordering: .relaxed)
        if owner == currentThreadID() { return true }
        return owner == 0 && isMainLoop && claimThread()
    }

    /// Binds an unbound loop to the calling thread, or tells whether the caller owns it.
    func claimThread() -> Bool {
        let me = currentThreadID()
        let owner = ownerThread.load(ordering: .acquiring)
        if owner == me { return true }
        guard owner == 0 else { return false }
        if isMainLoop && !isProcessMainThread() { return false }
        let (exchanged, actual) = ownerThread.compareExchange(
            expected: 0, desired: me, ordering: .acquiringAndReleasing)
        if exchanged && !isMainLoop { ThreadBinding.current.bind(self) }
        return exchanged || actual == me
    }

    /// Marks the loop as orphaned: its thread has finished with it for good (when the thread of
    /// `EventLoop.current` exits, or an `EventLoopGroup` thread ends), so a recycled `pthread_t`
    /// never looks like the owner. Later posts are kept, and counted as dropped if the loop is
    /// freed.
    func releaseThread() {
        ownerThread.store(Self.deadOwner, ordering: .releasing)
    }

    /// Whether the loop's thread has finished with it for good (see `releaseThread`).
    var isOrphaned: Bool { ownerThread.load(ordering: .acquiring) == Self.deadOwner }

    func preconditionOnLoop(_ function: StaticString, file: StaticString = #fileID, line: UInt = #line) {
        precondition(
            claimThread(),
            "Mainspring: \(function) must be called on the loop's own thread; use execute(_:) to get there",
            file: file, line: line)
    }

    // MARK: Running

    /// Runs the loop until `stop()` is called: polls, dispatches, sleeps in epoll when idle.
    ///
    /// A `stop()` that arrives while the loop is not running makes the next `run()` return at
    /// once, so a `stop()` racing a `run()` starting on another thread is never lost. Work still
    /// queued when `run()` returns stays queued and runs the next time the loop runs.
    ///
    /// - Throws: `EventLoopError.wrongThread` when the loop belongs to another thread (or, for
    ///   `EventLoop.main`, the caller is not the main thread); `.libevent` if polling fails.
    public func run() throws(EventLoopError) {
        guard claimThread() else {
            throw .wrongThread(function: isMainLoop ? "EventLoop.main.run() (main thread only)" : "EventLoop.run()")
        }
        if isMainLoop && mainQueueSource == nil { try installMainQueueBridgeIfNeeded() }
        let previousRunning = Self.runningLoop.value
        Self.runningLoop.set(self)
        defer { Self.runningLoop.set(previousRunning) }
        runDepth += 1
        defer { runDepth -= 1 }
        while !stopRequested.exchange(false, ordering: .acquiring) {
            _ = try iterate(blocking: true, deadline: nil, condition: { false })
        }
    }

    /// Runs one iteration: one poll (waiting for an event when `blocking` and nothing is ready),
    /// then ready work for at most `Configuration.pollInterval`.
    ///
    /// Must be called on the loop's thread (precondition).
    /// - Returns: how many callbacks ran (0 when nothing was ready, or polling failed).
    @discardableResult
    public func runOnce(blocking: Bool = true) -> Int {
        preconditionOnLoop("EventLoop.runOnce(blocking:)")
        if isMainLoop && mainQueueSource == nil { installMainQueueBridgeOrDie() }
        let previousRunning = Self.runningLoop.value
        Self.runningLoop.set(self)
        defer { Self.runningLoop.set(previousRunning) }
        return (try? iterate(blocking: blocking, deadline: nil, condition: { false })) ?? 0
    }

    /// Runs the loop until `condition` holds, the timeout passes, or `stop()` is called — the
    /// `RunLoop.run(mode:before:)` pattern done right: the thread sleeps in epoll while waiting.
    ///
    /// Works from inside any handler, nested to any depth: the handler that spins is held back
    /// (never re-entered), everything else keeps running. `condition` is checked before
    /// starting and after every callback, on this thread. A condition changed by another thread
    /// is only noticed when the loop wakes up, so change it inside `execute { … }`.
    ///
    /// Must be called on the loop's thread (precondition).
    /// - Parameter timeout: the longest to spin; `nil` for no limit, negative counts as zero.
    /// - Returns: whether `condition` holds on return (`false` after a timeout or a `stop()`).
    ///   A `stop()` ends every nested spin; the outermost `run` or `spin` consumes it.
    @discardableResult
    public func spin(until condition: () -> Bool, timeout: Duration? = nil) -> Bool {
        preconditionOnLoop("EventLoop.spin(until:timeout:)")
        if isMainLoop && mainQueueSource == nil { installMainQueueBridgeOrDie() }
        if condition() { return true }
        let deadline = timeout.map { monotonicNanoseconds() &+ $0.clampedNanoseconds }
        let previousRunning = Self.runningLoop.value
        Self.runningLoop.set(self)
        defer { Self.runningLoop.set(previousRunning) }
        runDepth += 1
        defer { runDepth -= 1 }
        while true {
            if stopRequested.load(ordering: .acquiring) {
                if runDepth == 1 { stopRequested.store(false, ordering: .relaxed) }
                return condition()
            }
            if let deadline, monotonicNanoseconds() >= deadline { return condition() }
            do {
                _ = try iterate(blocking: true, deadline: deadline, condition: condition)
            } catch {
                return condition()
            }
            if condition() { return true }
        }
    }

    /// Asks the loop to stop: `run()` returns (and nested `spin`s return `false`) after the
    /// callback in progress. Any thread; never blocks.
    public func stop() {
        stopRequested.store(true, ordering: .releasing)
        wakeup.signal()
    }

    // MARK: Posting work

    /// Runs `work` on the loop's thread, exactly once, in FIFO order with the other work the
    /// same thread posts at the same priority. Any thread.
    ///
    /// From the loop's own thread this is a lock-free append; from another thread it takes one
    /// mutex and wakes the loop (an eventfd write) only when the loop is asleep.
    /// Work posted before `stop()` runs on the next `run`, or is counted in
    /// `LoopMetrics.droppedAtShutdown` if the loop is freed first.
    public func execute(priority: Priority = .normal, _ work: @escaping @Sendable () -> Void) {
        if ownerThread.load(ordering: .relaxed) == currentThreadID() {
            if isShutDown {
                counters.droppedAtShutdown += 1
                return
            }
            enqueue(ReadyRecord(work: work, source: nil, stamp: cachedNow), priority)
        } else {
            executeFromOtherThread(priority: priority, work)
        }
    }

    private func executeFromOtherThread(priority: Priority, _ work: @escaping @Sendable () -> Void) {
        let stamp = counters.collectsQueueWait ? clock.now() : 0
        let mustWake = remote.withLock { queue -> Bool in
            if queue.isClosed {
                queue.droppedWhileClosed += 1
                return false
            }
            queue.append(RemoteItem(work: work, stamp: stamp), priority)
            if queue.isSleeping {
                queue.isSleeping = false
                return true
            }
            return false
        }
        if mustWake { wakeup.signal() }
    }

    /// Queues `work` for the next turn: it becomes ready only after the loop has polled again.
    /// Loop thread only. This is how fed work yields to input.
    func executeNextTurn(priority: Priority, _ work: @escaping () -> Void) {
        nextTurn.append(ReadyRecord(work: work, source: nil, stamp: 0, priority: priority))
        if priority == .background { nextTurnBackground &+= 1 }
    }

    /// Runs `action` once on this loop just before it next polls — including a poll of a nested
    /// spin. Loop thread only. For work that must be done before libevent next looks at the
    /// sockets, such as handing it coalesced output.
    func beforeNextPoll(_ action: @escaping () -> Void) {
        prePollActions.append(action)
    }

    /// Queues a fired source (at most once: `Source.fire` guards it).
    @inline(__always)
    func enqueue(source: Source) {
        if pollStamp == 0 { pollStamp = clock.now() }
        enqueue(ReadyRecord(work: nil, source: source, stamp: pollStamp), source.priority)
    }

    /// Queues a source for the next turn (fd sources that epoll cannot watch: always ready).
    func enqueueNextTurn(source: Source) {
        nextTurn.append(ReadyRecord(work: nil, source: source, stamp: 0, priority: source.priority))
        if source.priority == .background { nextTurnBackground &+= 1 }
    }

    @inline(__always)
    private func enqueue(_ record: ReadyRecord, _ priority: Priority) {
        switch priority {
        case .input: inputQueue.append(record)
        case .normal: normalQueue.append(record)
        case .background: backgroundQueue.append(record)
        }
    }

    // MARK: Sources

    func register(_ source: Source) {
        sources[ObjectIdentifier(source)] = source
        if source.keepsLoopBusy { busySources += 1 }
    }

    func unregister(_ source: Source) {
        if sources.removeValue(forKey: ObjectIdentifier(source)) != nil, source.keepsLoopBusy { busySources -= 1 }
    }

    /// Whether the loop has nothing left to do: no ready work, no cross-thread posts waiting, no
    /// in-flight sources (connections, one-shot timers). Standing sources (fd watchers,
    /// repeating timers, listeners) do not count. Loop thread only.
    var isQuiescent: Bool {
        busySources == 0 && !hasReadyWork && remote.withLock { $0.isEmpty }
    }

    /// Ends the loop for good, on its thread: closes every source (handlers are dropped, not
    /// called), drops the queued work, and from now on counts posts as dropped instead of
    /// queueing them. Returns (work dropped, sources closed). `run()` returns afterwards.
    func shutdownNow() -> (droppedWork: Int, closedSources: Int) {
        let waiting = remote.withLock { queue -> Int in
            queue.isClosed = true
            let count = queue.count
            queue = RemoteQueue(isClosed: true)
            return count
        }
        let open = Array(sources.values)
        for source in open { source.close() }
        let taken = inputRemote.remaining + normalRemote.remaining + backgroundRemote.remaining
        inputRemote = RemoteBatch()
        normalRemote = RemoteBatch()
        backgroundRemote = RemoteBatch()
        let dropped = inputQueue.removeAll() + normalQueue.removeAll() + backgroundQueue.removeAll()
            + nextTurn.count + taken + waiting
        nextTurn.removeAll()
        nextTurnBackground = 0
        counters.droppedAtShutdown += dropped
        isShutDown = true
        stop()
        return (dropped, open.count)
    }

    /// The number of open sources (timers, watchers, readers) on this loop.
    var sourceCount: Int { sources.count }

    /// The open sources (a copy). Loop thread only.
    var openSources: [Source] { Array(sources.values) }

    // MARK: The iteration

    private var hasReadyWork: Bool {
        !inputQueue.isEmpty || !normalQueue.isEmpty || !backgroundQueue.isEmpty || !nextTurn.isEmpty
            || !inputRemote.isEmpty || !normalRemote.isEmpty || !backgroundRemote.isEmpty
    }

    /// Polls once, then dispatches. `deadline` (monotonic ns) bounds a blocking poll.
    private func iterate(blocking: Bool, deadline: UInt64?, condition: () -> Bool) throws(EventLoopError) -> Int {
        // One lock per pass: either take the cross-thread posts, or (nothing to do at all)
        // declare the loop asleep so that the next producer writes the eventfd.
        var mayBlock = blocking && !hasReadyWork
        var tookRemote = false
        pollStamp = 0
        if mayBlock {
            mayBlock = remote.withLock { queue -> Bool in
                if queue.isEmpty {
                    queue.isSleeping = true
                    return true
                }
                counters.remoteItems &+= takeRemote(from: &queue)
                return false
            }
            tookRemote = !mayBlock
        }
        var timeoutEvent: NativeEvent?
        if mayBlock, let deadline {
            let now = monotonicNanoseconds()
            let event = try NativeEvent(timerOn: base, target: timeoutTarget)
            try event.add(timeoutNanoseconds: deadline > now ? deadline - now : 0)
            timeoutEvent = event
        }
        if !prePollActions.isEmpty {
            let actions = prePollActions
            prePollActions.removeAll(keepingCapacity: true)
            for action in actions { action() }
        }
        let pollStart = mayBlock ? clock.now() : 0
        counters.polls += 1
        defer { timeoutEvent?.delete() }
        try base.poll(blocking: mayBlock)
        if mayBlock {
            accountedNanoseconds &+= clock.now() &- pollStart
        }
        if let target = wakeupTarget, target.didFire {
            target.didFire = false
            counters.wakeups += 1
        }
        if !tookRemote { refillRemote() }
        if !nextTurn.isEmpty { promoteNextTurn() }
        return dispatch(condition: condition)
    }

    /// Takes cross-thread posts for every priority whose previous batch is used up, and tells
    /// the producers the loop is awake.
    private func refillRemote() {
        let taken = remote.withLock { queue -> Int in
            queue.isSleeping = false
            return takeRemote(from: &queue)
        }
        counters.remoteItems &+= taken
    }

    /// Swaps the queue's arrays into the used-up batches (called with the lock held).
    @inline(__always)
    private func takeRemote(from queue: inout RemoteQueue) -> Int {
        if queue.isEmpty { return 0 }
        let now = pollStamp == 0 ? clock.now() : pollStamp
        return inputRemote.refill(from: &queue.input, at: now)
            + normalRemote.refill(from: &queue.normal, at: now)
            + backgroundRemote.refill(from: &queue.background, at: now)
    }

    private func promoteNextTurn() {
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

    /// Runs ready records for at most one poll interval (plus the callback in progress).
    private func dispatch(condition: () -> Bool) -> Int {
        var now = clock.now()
        cachedNow = now
        counters.iterations += 1
        let phaseDeadline = now &+ pollIntervalNanoseconds
        var ran = 0
        while let (record, priority) = nextRecord(now: now) {
            let start = now
            let accountedBefore = accountedNanoseconds
            // Background work waits while this runs if it is ready, or queued for the next turn
            // (fed work between two turns): either way this callback's time earns it credit.
            let backgroundWaited = priority != .background
                && (!backgroundQueue.isEmpty || !backgroundRemote.isEmpty || nextTurnBackground > 0)
            if let source = record.source {
                source.run()
            } else if let work = record.work {
                // (Not `unsafelyUnwrapped`: going through generic Optional API would reabstract
                // the closure, allocating a thunk per call.)
                work()
            }
            now = clock.now()
            cachedNow = now
            let elapsed = now &- start
            let nested = accountedNanoseconds &- accountedBefore
            let own = elapsed > nested ? elapsed &- nested : 0
            accountedNanoseconds &+= own
            account(priority: priority, own: own, waited: start > record.stamp ? start &- record.stamp : 0,
                    backgroundWaited: backgroundWaited)
            ran &+= 1
            if now >= phaseDeadline || stopRequested.load(ordering: .relaxed) || condition() { break }
            // Fed work queues its next turn for after the next poll (`executeNextTurn`), so at
            // most one background turn is ready per pass. While background work still has credit
            // and higher-priority work waits, poll now: the next turn becomes ready and can use the
            // credit. Otherwise one long input callback per pass would cap background work at one
            // turn per such callback, far below its guaranteed share.
            if priority == .background, nextTurnBackground > 0, backgroundCredit >= backgroundQuantum,
                higherPriorityWaiting
            {
                break
            }
        }
        return ran
    }

    /// The next record by priority, tempered by fairness: a waiting `.background` record runs
    /// before higher-priority work once it has earned a quantum of credit (the guaranteed share:
    /// higher-priority time while it waits earns `share / (1 - share)` of itself) or has waited
    /// `maxStarvation`.
    @inline(__always)
    private func nextRecord(now: UInt64) -> (ReadyRecord, Priority)? {
        if !(backgroundQueue.isEmpty && backgroundRemote.isEmpty),
            !(inputQueue.isEmpty && normalQueue.isEmpty && inputRemote.isEmpty && normalRemote.isEmpty),
            let stamp = oldestBackgroundStamp,
            backgroundCredit >= backgroundQuantum || now &- min(stamp, now) >= maxStarvationNanoseconds,
            let record = Self.take(&backgroundQueue, &backgroundRemote, &preferRemote.2)
        {
            return (record, .background)
        }
        if let record = Self.take(&inputQueue, &inputRemote, &preferRemote.0) { return (record, .input) }
        if let record = Self.take(&normalQueue, &normalRemote, &preferRemote.1) { return (record, .normal) }
        if let record = Self.take(&backgroundQueue, &backgroundRemote, &preferRemote.2) { return (record, .background) }
        return nil
    }

    private var higherPriorityWaiting: Bool {
        !inputQueue.isEmpty || !normalQueue.isEmpty || !inputRemote.isEmpty || !normalRemote.isEmpty
    }

    /// The stamp of the oldest ready background record, local or remote.
    private var oldestBackgroundStamp: UInt64? {
        switch (backgroundQueue.firstStamp, backgroundRemote.firstStamp) {
        case let (local?, remote?): return min(local, remote)
        case let (local?, nil): return local
        case let (nil, remote?): return remote
        case (nil, nil): return nil
        }
    }

    /// One record of a priority: local and cross-thread work take turns when both are ready.
    @inline(__always)
    private static func take(_ local: inout RingBuffer<ReadyRecord>, _ remote: inout RemoteBatch,
                             _ preferRemote: inout Bool) -> ReadyRecord?
    {
        if !local.isEmpty && (remote.isEmpty || !preferRemote) {
            preferRemote = true
            return local.popFirst()
        }
        if !remote.isEmpty {
            preferRemote = false
            return remote.popFirst()
        }
        return nil
    }

    @inline(__always)
    private func account(priority: Priority, own: UInt64, waited: UInt64, backgroundWaited: Bool) {
        counters.record(priority: priority, own: own, waited: waited)
        if own > stallThresholdNanoseconds { counters.recordStall(own) }
        // Guaranteed share: time that higher-priority work used while background work was
        // waiting earns background credit; background time used while others wait spends it
        // (down to a small debt); background time on an otherwise idle loop clears the account.
        switch priority {
        case .background:
            if higherPriorityWaiting {
                backgroundCredit = max(backgroundCredit &- Int64(clamping: own), -maxBackgroundDebt)
            } else {
                backgroundCredit = 0
            }
        case .input, .normal:
            if backgroundWaited {
                let earned = Int64(Double(own) * backgroundCreditRate)
                backgroundCredit = min(backgroundCredit &+ earned, Int64(clamping: maxStarvationNanoseconds))
            }
        }
    }

    // MARK: Metrics

    /// A snapshot of what the loop has done so far. Read it on the loop's thread (or after
    /// `run()` returned on it); it is a copy, cheap until the loop records again.
    public var metrics: LoopMetrics {
        var snapshot = counters.snapshot()
        snapshot.droppedAtShutdown += remote.withLock { $0.droppedWhileClosed }
        return snapshot
    }
}

/// The loops bound to one thread (weakly). When the thread exits, no thread can ever run them
/// again, so each is shut down: its sources closed, its queued work dropped and counted — which
/// also breaks the cycles of queued closures and handlers that capture their loop — and it is
/// orphaned, so a later thread that happens to get the same `pthread_t` never looks like its
/// owner. (The main thread's loop is never bound here: the process ends with that thread.)
final class ThreadBinding: ThreadExitObserver {
    private struct WeakLoop { weak var loop: EventLoop? }
    private var loops: [WeakLoop] = []
    private static let key = ThreadLocalReference<ThreadBinding>()

    /// The calling thread's binding, made on first use.
    static var current: ThreadBinding {
        if let binding = key.value { return binding }
        let binding = ThreadBinding()
        key.set(binding)
        return binding
    }

    func bind(_ loop: EventLoop) {
        loops.removeAll { $0.loop == nil }
        loops.append(WeakLoop(loop: loop))
    }

    func threadDidExit() {
        for entry in loops {
            guard let loop = entry.loop, !loop.isOrphaned else { continue }
            _ = loop.shutdownNow()
            loop.releaseThread()
        }
        loops.removeAll()
    }
}

/// One queued unit of work: a posted closure or a fired source.
struct ReadyRecord {
    var work: (() -> Void)?
    var source: Source?
    var stamp: UInt64
    var priority: Priority = .normal
}

/// Work posted from another thread, waiting for the loop to take it.
struct RemoteItem {
    /// Set to nil when the loop takes it, so a closure (and what it captures) is released as
    /// soon as it has run, not when the batch is refilled.
    var work: (@Sendable () -> Void)?
    /// When it was posted (the loop's `FastClock`), or 0 when metrics are off.
    let stamp: UInt64
}

/// The multi-producer side of a loop, one array per priority. Guarded by the loop's mutex.
struct RemoteQueue {
    var input: [RemoteItem] = []
    var normal: [RemoteItem] = []
    var background: [RemoteItem] = []
    /// Set by the loop just before it sleeps with an empty queue; the producer that clears it
    /// writes the eventfd. So the fd is written at most once per sleep.
    var isSleeping = false
    /// Set at shutdown: posts are counted here instead of queued.
    var isClosed = false
    var droppedWhileClosed = 0

    var isEmpty: Bool { input.isEmpty && normal.isEmpty && background.isEmpty }
    var count: Int { input.count + normal.count + background.count }

    @inline(__always)
    mutating func append(_ item: RemoteItem, _ priority: Priority) {
        switch priority {
        case .input: input.append(item)
        case .normal: normal.append(item)
        case .background: background.append(item)
        }
    }
}

/// The loop's side of one priority's cross-thread posts: the batch last taken from the queue,
/// consumed in place (no copy into the ring). Its array and the queue's are swapped on refill,
/// so both keep their capacity: no allocation in the steady state.
struct RemoteBatch {
    private var items: [RemoteItem] = []
    private var next = 0
    /// When the batch was taken: the stamp of items posted without one.
    private var takenAt: UInt64 = 0

    var isEmpty: Bool { next == items.count }
    var remaining: Int { items.count - next }

    var firstStamp: UInt64? {
        guard next < items.count else { return nil }
        let stamp = items[next].stamp
        return stamp == 0 ? takenAt : stamp
    }

    @inline(__always)
    mutating func popFirst() -> ReadyRecord {
        let work = items[next].work
        let stamp = items[next].stamp
        items[next].work = nil
        next &+= 1
        return ReadyRecord(work: work, source: nil, stamp: stamp == 0 ? takenAt : stamp)
    }

    /// Takes the queue's items if this batch is used up. Returns how many it took.
    mutating func refill(from queue: inout [RemoteItem], at now: UInt64) -> Int {
        guard next == items.count, !queue.isEmpty else { return 0 }
        items.removeAll(keepingCapacity: true)
        next = 0
        takenAt = now
        swap(&items, &queue)
        return items.count
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
