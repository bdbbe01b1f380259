import Synchronization

/// Feeds long work to a loop in small chunks, so that input is handled between them — the
/// "feeding the main queue" pattern, without a thread hop per chunk.
///
/// Submitting hundreds of small blocks to a loop at once queues input behind all of them. A
/// feeder instead runs its chunks in *turns*: each turn runs one chunk (`.oneChunkPerTurn`) or
/// chunks while a time budget lasts (`.budget`), then ends, and the next turn becomes ready
/// only after the loop has polled again. So an input event waits at most one turn, and tiny
/// chunks still run back to back at nearly the speed of a plain `for` loop.
///
/// ```swift
/// let feeder = Feeder(loop: loop)                        // .background, .budget(1 ms)
/// let job = feeder.feed(rows) { row in index(row) }      // on the loop's thread
/// job.onCompletion { outcome in print("indexing \(outcome)") }
/// feeder.enqueue { print("after the job") }              // any thread, FIFO
/// ```
///
/// ## Order
/// A feeder is serial: chunks enqueued and jobs fed run one after the other in the order they
/// were submitted (FIFO across threads, by the order of the calls), each job to its end, except
/// that a paused job steps aside (keeping its place) and the work behind it goes on.
///
/// ## Threads and priority
/// Chunks run on `loop`'s thread, at `priority` (`.background` by default: after ready input
/// and `.normal` work, with the share the loop guarantees background work under a flood; see
/// `EventLoop.Configuration`). `enqueue`, `pause`, `resume`, `cancelAll` work from any thread;
/// `feed` takes non-`Sendable` bodies and must be called on the loop's thread.
///
/// ## Cost
/// Per chunk: a closure call, two atomic loads and one clock read (about 10 ns). Per turn: one
/// uncontended lock and, in the loop, one non-blocking poll. `enqueue` takes a lock and
/// allocates the closure's context, as `execute` does.
///
/// Not promised: a chunk is never interrupted, so input may wait for the chunk in progress;
/// keep chunks short (well under `Configuration.pollInterval`). A feeder whose loop is freed
/// with work queued drops that work (the loop counts its turn in
/// `LoopMetrics.droppedAtShutdown`); unfinished jobs then never finish.
public final class Feeder: Sendable {
    /// How much a feeder runs per loop turn.
    public enum Pacing: Sendable, Hashable {
        /// One chunk, then a poll: the classic feeding pattern (one block per trip through the
        /// main queue). Lowest latency for long chunks; a poll per chunk makes tiny chunks slow.
        case oneChunkPerTurn
        /// Chunks until this much time is used, then a poll: amortises tiny chunks without
        /// hurting input. After each chunk the feeder starts another only if what is left of the
        /// budget is at least as long as that chunk took, so a turn rarely runs past the budget
        /// (only when a chunk is slower than the one before it, or longer than the budget: a
        /// turn always runs at least one chunk). Zero or negative runs one chunk a turn.
        case budget(Duration)
    }

    /// The loop the chunks run on.
    public let loop: EventLoop
    /// The priority the chunks run at.
    public let priority: Priority
    /// How much runs per turn.
    public let pacing: Pacing
    /// The turn's budget in ns; 0 means one chunk per turn.
    private let budgetNanoseconds: UInt64

    /// `epoch << 1 | paused`: `pause`, `resume` and `cancelAll` change it; the running turn reads
    /// it before every chunk and re-evaluates when it changed.
    private let control = Atomic<Int>(0)
    private static let pausedFlag = 1
    /// How many times `pause()` was called (see `FeedJob.pauses`).
    private let pauses = Atomic<Int>(0)
    /// Set by `FeedJob.cancel`: the next turn finishes cancelled jobs.
    private let sweepRequested = Atomic<Bool>(false)
    private let shared = Protected<Shared>(Shared())
    private let local = LoopBound(FeederQueue())

    /// Submissions not yet taken by the loop, and whether a turn is scheduled.
    private struct Shared {
        var inbox: [Item] = []
        /// A turn is queued on the loop (or running).
        var isScheduled = false
        /// Something changed after the running turn looked (resume, cancel): it looks again
        /// before it goes idle.
        var isPoked = false
        /// Incremented by `cancelAll`: what the loop took before belongs to the old epoch.
        var epoch = 0
    }

    private typealias Item = FeederItem

    /// Creates a feeder for `loop`. Any thread; it does not bind the loop.
    ///
    /// - Parameters:
    ///   - loop: where the chunks run; `EventLoop.main` by default.
    ///   - priority: the loop priority of the chunks; `.background` by default.
    ///   - pacing: how much runs per turn; `.budget(.milliseconds(1))` by default, which keeps an
    ///     input event's wait under about 1 ms plus one chunk.
    public init(loop: EventLoop = .main, priority: Priority = .background,
                pacing: Pacing = .budget(.milliseconds(1)))
    {
        self.loop = loop
        self.priority = priority
        self.pacing = pacing
        switch pacing {
        case .oneChunkPerTurn: budgetNanoseconds = 0
        case .budget(let budget): budgetNanoseconds = budget.clampedNanoseconds
        }
    }

    // MARK: Submitting work

    /// Queues `chunk` to run once on the loop, after everything submitted before it (FIFO).
    /// Any thread.
    ///
    /// A chunk that `cancelAll()` drops never runs.
    public func enqueue(_ chunk: @escaping @Sendable () -> Void) {
        submit(.chunk(chunk))
    }

    /// Runs `body(0)`, `body(1)`, … `body(chunks - 1)` on the loop, a few per turn, after the work
    /// submitted before. A count of zero (or less) finishes at once as `.completed`.
    ///
    /// Must be called on the loop's thread (precondition): `body` need not be `Sendable`. From
    /// another thread, ``enqueue(chunks:_:)`` takes a `Sendable` body.
    /// - Returns: the job: progress, pause, resume, cancel, outcome.
    @available(*, noasync, message: "loop thread only; in async code use `enqueue(chunks:_:)` (any thread; at once on the loop's own)")
    @discardableResult
    public func feed(chunks: Int, _ body: @escaping (Int) -> Void) -> FeedJob {
        loop.preconditionOnLoop("Feeder.feed(chunks:_:)", elsewhereUse: "enqueue(chunks:_:)")
        return submitJob(chunks: chunks, body)
    }

    /// Runs `body` once per element of `items`, in order, on the loop, a few per turn, after the
    /// work submitted before. The sequence is iterated on the loop's thread, one element ahead
    /// of `body`; `progress.total` is known when `items` is a `Collection`.
    ///
    /// Must be called on the loop's thread (precondition; from another thread,
    /// ``enqueue(_:_:)``).
    @available(*, noasync, message: "loop thread only; in async code use `enqueue(_:_:)` (any thread; at once on the loop's own)")
    @discardableResult
    public func feed<S: Sequence>(_ items: S, _ body: @escaping (S.Element) -> Void) -> FeedJob {
        loop.preconditionOnLoop("Feeder.feed(_:_:)", elsewhereUse: "enqueue(_:_:)")
        return submitJob(items, body)
    }

    /// Runs `body(0)`, `body(1)`, … `body(chunks - 1)` on the loop, a few per turn, after the
    /// work submitted before: ``feed(chunks:_:)`` from any thread, with a `Sendable` body. A
    /// count of zero (or less) finishes at once as `.completed`.
    ///
    /// Any thread; from the loop's thread it is `feed(chunks:_:)`. Costs what `feed` costs (one
    /// job, queued under the feeder's lock) and does not bind the loop to the caller's thread.
    /// As with `feed`, a job given to a loop that has shut down never runs and never finishes
    /// (`await job.outcome` would wait for ever): enqueue while the loop runs.
    /// - Returns: the job: progress, pause, resume, cancel, and `await job.outcome`.
    @discardableResult
    public func enqueue(chunks: Int, _ body: @escaping @Sendable (Int) -> Void) -> FeedJob {
        submitJob(chunks: chunks, body)
    }

    /// Runs `body` once per element of `items`, in order, on the loop, a few per turn, after the
    /// work submitted before: ``feed(_:_:)`` from any thread. Its iterator is made in this call
    /// and advanced on the loop's thread only, one element ahead of `body`; `progress.total` is
    /// known when `items` is a `Collection`.
    ///
    /// Any thread, as ``enqueue(chunks:_:)``.
    @discardableResult
    public func enqueue<S: Sequence & Sendable>(_ items: S, _ body: @escaping @Sendable (S.Element) -> Void)
        -> FeedJob
    {
        submitJob(items, body)
    }

    /// The job of `feed(chunks:_:)` and `enqueue(chunks:_:)`, queued (any thread).
    private func submitJob(chunks: Int, _ body: @escaping (Int) -> Void) -> FeedJob {
        let job = FeedJob(feeder: self, runner: CountedRunner(count: chunks, body: body), total: max(0, chunks))
        submit(.job(job))
        return job
    }

    /// The job of `feed(_:_:)` and `enqueue(_:_:)`, queued (any thread; the iterator is made
    /// here and advanced on the loop's thread).
    private func submitJob<S: Sequence>(_ items: S, _ body: @escaping (S.Element) -> Void) -> FeedJob {
        let job = FeedJob(feeder: self, runner: SequenceRunner(items, body: body), total: (items as? any Collection)?.count)
        submit(.job(job))
        return job
    }

    private func submit(_ item: Item) {
        let mustSchedule = shared.withLock { state -> Bool in
            state.inbox.append(item)
            if state.isScheduled { return false }
            state.isScheduled = true
            return true
        }
        if mustSchedule { scheduleFirstTurn() }
    }

    // MARK: Backlog

    /// How long the job that has waited longest for its first chunk has been waiting: the
    /// feeder's backlog as a time, zero when every job fed so far has started (or none was).
    ///
    /// A feeder is serial, so under more work than it can run its jobs queue — out of sight of
    /// the loop's input queue wait, which input-first scheduling keeps short. This is the figure
    /// that grows instead: an HTTP server sheds load on it (`HTTPServer.LoadShedding`'s
    /// `watchedFeeders`), and a health check can report it. Chunks queued with `enqueue` are
    /// not jobs and do not count.
    ///
    /// Loop thread only (precondition). Costs a look at the jobs up to the first waiting one
    /// (usually the one running, then it) and, when the loop holds none, a lock.
    @available(*, noasync, message: "loop thread only; in async code read it on the loop (`await loop.submit { … }`, or a synchronous function when already there)")
    public var oldestPendingJobWait: Duration {
        loop.preconditionOnLoop("Feeder.oldestPendingJobWait")
        var oldest: UInt64?
        let line = local.value
        for case .job(let job)? in line.items[line.head...] where !job.hasStarted {
            oldest = job.submittedAt
            break
        }
        if oldest == nil {
            oldest = shared.withLock { state in
                for case .job(let job) in state.inbox where !job.hasStarted { return job.submittedAt }
                return nil
            }
        }
        guard let oldest else { return .zero }
        let now = loop.timeSource.now()
        return now > oldest ? .nanoseconds(Int64(clamping: now - oldest)) : .zero
    }

    // MARK: Control

    /// Stops running chunks after the chunk in progress, until `resume()`. Submissions are kept.
    /// Any thread.
    public func pause() {
        pauses.wrappingAdd(1, ordering: .relaxed)
        control.bitwiseOr(Self.pausedFlag, ordering: .releasing)
    }

    /// Lets a paused feeder run again. Any thread.
    public func resume() {
        let old = control.bitwiseAnd(~Self.pausedFlag, ordering: .releasing).oldValue
        if old & Self.pausedFlag != 0 { wake() }
    }

    /// Whether `pause()` is in effect.
    public var isPaused: Bool { control.load(ordering: .relaxed) & Self.pausedFlag != 0 }

    /// Cancels everything submitted so far: queued chunks are dropped (they never run), jobs
    /// finish as `.cancelled` (at most the chunk in progress completes). Work submitted after
    /// this call returns is not affected; a paused feeder stays paused. Any thread.
    public func cancelAll() {
        let dropped = shared.withLock { state -> [Item] in
            state.epoch &+= 1
            let dropped = state.inbox
            state.inbox = []
            return dropped
        }
        control.wrappingAdd(2, ordering: .releasing)  // a new epoch: the running turn stops
        for case .job(let job) in dropped { job.control.bitwiseOr(FeedJob.cancelledFlag, ordering: .relaxed) }
        // Jobs the loop already holds are cancelled (and every dropped one finished) on the loop.
        let jobs = dropped.compactMap { item -> FeedJob? in if case .job(let job) = item { return job } else { return nil } }
        if !jobs.isEmpty {
            loop.execute(priority: priority) { for job in jobs { job.finish(.cancelled) } }
        }
        wake()
    }

    /// Asks the loop to finish cancelled jobs (`FeedJob.cancel`). Any thread.
    func requestSweep() {
        sweepRequested.store(true, ordering: .releasing)
        wake()
    }

    /// Makes sure a turn will look at the feeder's state again. Any thread.
    func wake() {
        let mustSchedule = shared.withLock { state -> Bool in
            if state.isScheduled {
                state.isPoked = true
                return false
            }
            state.isScheduled = true
            return true
        }
        if mustSchedule { scheduleFirstTurn() }
    }

    private func scheduleFirstTurn() {
        loop.execute(priority: priority) { [self] in turn() }
    }

    // MARK: The turn (loop thread)

    /// One turn: takes new submissions, finishes cancelled jobs, runs chunks per the pacing, then
    /// either queues the next turn (after the next poll) or goes idle.
    private func turn() {
        let line = local.value
        let clock = loop.timeSource
        var now = clock.now()
        let deadline = now &+ budgetNanoseconds
        var ranAny = false
        /// How long the last chunk took: the next one starts only if that much budget is left.
        var lastChunk: UInt64 = 0
        while true {
            let control = self.control.load(ordering: .acquiring)
            takeSubmissions(line)
            if sweepRequested.exchange(false, ordering: .acquiring) { finishCancelledJobs(line) }
            if control & Self.pausedFlag != 0 { break }
            guard let index = line.firstRunnable() else { break }
            switch line.items[index] {
            case .chunk(let chunk)?:
                line.remove(at: index)
                let start = now
                chunk()
                now = clock.now()
                lastChunk = now &- start
                ranAny = true
            case .job(let job)?:
                switch run(job, control: control, now: &now, lastChunk: &lastChunk, deadline: deadline) {
                case .finished(let ran):
                    line.remove(at: index)
                    ranAny = ranAny || ran
                case .interrupted(let ran):
                    ranAny = ranAny || ran
                    continue  // look at the feeder's and the job's state again
                case .turnOver:
                    ranAny = true
                }
            case nil:
                preconditionFailure("Feeder: a removed item is still in line")
            }
            if ranAny && isTurnOver(now: now, lastChunk: lastChunk, deadline: deadline) {
                loop.executeNextTurn(priority: priority) { [self] in turn() }
                return
            }
        }
        goIdleOrContinue()
    }

    private enum JobStop {
        /// The job finished (completed or cancelled); whether a chunk ran in this call.
        case finished(ranAny: Bool)
        /// The job or the feeder was paused, cancelled or changed epoch.
        case interrupted(ranAny: Bool)
        /// The turn's pacing is used up; the job has more.
        case turnOver
    }

    /// Whether the pacing lets no further chunk start in this turn.
    @inline(__always)
    private func isTurnOver(now: UInt64, lastChunk: UInt64, deadline: UInt64) -> Bool {
        budgetNanoseconds == 0 || now &+ lastChunk > deadline
    }

    /// Runs chunks of `job` until it ends, something interrupts it, or the turn is over.
    @inline(__always)
    private func run(_ job: FeedJob, control: Int, now: inout UInt64, lastChunk: inout UInt64,
                     deadline: UInt64) -> JobStop
    {
        let jobLocal = job.local.value
        guard let runner = jobLocal.runner else {
            job.finish(.cancelled)
            return .finished(ranAny: false)
        }
        // Paused (the job or the feeder) since the job's last chunk, even between two turns where
        // no chunk noticed it: the wait was a pause, not starvation.
        let pausesNow = job.pauses.load(ordering: .relaxed) &+ pauses.load(ordering: .relaxed)
        if pausesNow != jobLocal.pausesSeen {
            jobLocal.pausesSeen = pausesNow
            jobLocal.previousEnd = 0
        }
        var previousEnd = jobLocal.previousEnd
        let clock = loop.timeSource
        var chunkTime: UInt64 = 0
        var ranAny = false
        while true {
            if !job.isRunnable || self.control.load(ordering: .relaxed) != control {
                job.endStretch(chunkTime: chunkTime, ranAny: ranAny, interrupted: true, previousEnd: previousEnd, local: jobLocal)
                if job.isCancelled {
                    job.finish(.cancelled)
                    return .finished(ranAny: ranAny)
                }
                return .interrupted(ranAny: ranAny)
            }
            let start = now
            let step = runner.step()
            now = clock.now()
            if step == .none {
                job.endStretch(chunkTime: chunkTime, ranAny: ranAny, interrupted: false, previousEnd: previousEnd, local: jobLocal)
                job.finish(.completed)
                return .finished(ranAny: ranAny)
            }
            ranAny = true
            lastChunk = now &- start
            chunkTime &+= lastChunk
            job.didRunChunk(start: start, end: now, previousEnd: &previousEnd)
            if step == .ranLast {
                job.endStretch(chunkTime: chunkTime, ranAny: true, interrupted: false, previousEnd: previousEnd, local: jobLocal)
                job.finish(.completed)
                return .finished(ranAny: true)
            }
            if isTurnOver(now: now, lastChunk: lastChunk, deadline: deadline) {
                job.endStretch(chunkTime: chunkTime, ranAny: true, interrupted: false, previousEnd: previousEnd, local: jobLocal)
                return .turnOver
            }
        }
    }

    /// Moves the inbox into the line; after a `cancelAll`, first drops what the line held.
    private func takeSubmissions(_ line: FeederQueue) {
        let (items, epoch) = shared.withLock { state -> ([Item], Int) in
            let items = state.inbox
            if !items.isEmpty { state.inbox = [] }
            return (items, state.epoch)
        }
        if epoch != line.epoch {
            line.epoch = epoch
            for case .job(let job) in line.removeAll() { job.finish(.cancelled) }
        }
        if !items.isEmpty { line.append(contentsOf: items) }
    }

    private func finishCancelledJobs(_ line: FeederQueue) {
        var index = line.head
        while index < line.items.count {
            if case .job(let job)? = line.items[index], job.isCancelled {
                line.remove(at: index)
                job.finish(.cancelled)
                index = line.head  // removal may have compacted the line
            } else {
                index += 1
            }
        }
    }

    /// Nothing can run: goes idle, unless something changed meanwhile (then runs another turn).
    private func goIdleOrContinue() {
        let again = shared.withLock { state -> Bool in
            if state.isPoked || !state.inbox.isEmpty {
                state.isPoked = false
                return true
            }
            state.isScheduled = false
            return false
        }
        if again { loop.executeNextTurn(priority: priority) { [self] in turn() } }
    }
}
