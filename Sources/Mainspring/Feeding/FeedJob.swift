import Synchronization

/// How a `FeedJob` ended.
public enum FeedOutcome: Sendable, Hashable, CustomStringConvertible {
    /// Every chunk ran.
    case completed
    /// The job (or its feeder) was cancelled first; `FeedJob.progress` tells how many chunks ran.
    /// The others never run.
    case cancelled

    /// `"completed"` or `"cancelled"`.
    public var description: String {
        switch self {
        case .completed: return "completed"
        case .cancelled: return "cancelled"
        }
    }
}

/// A job made by `Feeder.feed(chunks:_:)` or `Feeder.feed(_:_:)` (or their any-thread forms,
/// `Feeder.enqueue(chunks:_:)` and `enqueue(_:_:)`): a body run once per chunk on
/// the feeder's loop, a few chunks per loop turn, so input keeps flowing between them.
///
/// ## Lifecycle
/// Queued behind the feeder's earlier work (FIFO) → running (a chunk at a time) → finished with
/// a `FeedOutcome`, exactly once. `pause()` holds the job back (the feeder goes on with the
/// work behind it; the job keeps its place in line) until `resume()`. `cancel()` finishes it as
/// `.cancelled`: at most the chunk in progress completes, the remaining chunks never run.
///
/// ## Threads
/// `progress`, `statistics`, `isFinished`, `pause()`, `resume()`, `cancel()` and `outcome` work
/// from any thread. `onCompletion(_:)` is for the feeder's loop thread, where the handlers run.
/// The job keeps its body (and what it captures) until it finishes.
public final class FeedJob: Sendable {
    /// How far a job has got.
    public struct Progress: Sendable, Hashable, CustomStringConvertible {
        /// Chunks that have run to the end.
        public let completed: Int
        /// All chunks of the job, when known (`nil` for a sequence that is not a `Collection`).
        public let total: Int?

        /// `completed / total` in 0...1, or `nil` when the total is unknown (1 for an empty job).
        public var fractionCompleted: Double? {
            guard let total else { return nil }
            return total == 0 ? 1 : Double(completed) / Double(total)
        }

        /// `"completed/total"`, with `?` for an unknown total.
        public var description: String { "\(completed)/\(total.map(String.init) ?? "?")" }
    }

    /// How the job's chunks were spread over time, measured with the loop's dispatcher clock.
    /// The input of `FairnessReport`.
    public struct Statistics: Sendable, Hashable {
        /// Chunks that have run to the end.
        public let chunks: Int
        /// From the start of the first chunk to the end of the last one so far.
        public let elapsed: Duration
        /// The chunks' own running time, summed: what running them straight would have taken.
        public let chunkTime: Duration
        /// The longest time between the end of one chunk and the start of the next, while the
        /// job was ready (pauses are not counted): how long the work was starved at worst.
        public let longestGap: Duration
        /// Feeder turns in which the job ran at least one chunk (each turn ends with a poll).
        public let turns: Int

        /// Creates statistics; `FeedJob.statistics` is the usual source.
        public init(chunks: Int, elapsed: Duration, chunkTime: Duration, longestGap: Duration, turns: Int) {
            self.chunks = chunks
            self.elapsed = elapsed
            self.chunkTime = chunkTime
            self.longestGap = longestGap
            self.turns = turns
        }
    }

    /// The feeder that runs the job.
    public let feeder: Feeder
    private let total: Int?

    // Written only on the loop thread (single writer); read from anywhere.
    let completedChunks = Atomic<Int>(0)
    private let firstStart = Atomic<UInt64>(0)
    private let lastEnd = Atomic<UInt64>(0)
    private let chunkNanoseconds = Atomic<UInt64>(0)
    private let longestGapNanoseconds = Atomic<UInt64>(0)
    private let turnCount = Atomic<Int>(0)

    /// `pausedFlag | cancelledFlag`; any thread sets them, the feeder reads them before each chunk.
    let control = Atomic<Int>(0)
    /// How many times `pause()` was called: a gap between two chunks that spans a pause is not
    /// starvation (the feeder compares it with `Local.pausesSeen`).
    let pauses = Atomic<Int>(0)
    static let pausedFlag = 1
    static let cancelledFlag = 2

    private let finished = Protected<Finished>(Finished())
    /// The body and the completion handlers: the feeder's loop thread only.
    let local: LoopBound<Local>

    struct Finished {
        var outcome: FeedOutcome?
        var waiters: [CheckedContinuation<FeedOutcome, Never>] = []
    }

    final class Local {
        var runner: FeedRunner?
        var handlers: [(FeedOutcome) -> Void] = []
        /// The end of the previous chunk while the job runs uninterrupted; 0 after a pause.
        var previousEnd: UInt64 = 0
        /// The job's and its feeder's pause counts when the job last ran (see `Feeder.run`).
        var pausesSeen = 0
        init(runner: FeedRunner) { self.runner = runner }
    }

    /// When the job was submitted, on its loop's clock (ns): what `Feeder.oldestPendingJobWait`
    /// measures from.
    let submittedAt: UInt64

    init(feeder: Feeder, runner: FeedRunner, total: Int?) {
        self.feeder = feeder
        self.total = total
        self.local = LoopBound(Local(runner: runner))
        submittedAt = feeder.loop.timeSource.now()
    }

    // MARK: Public

    /// How many chunks have run, out of how many. Exact once the job has finished; from the
    /// loop's thread (inside a chunk, say) it counts every chunk that has returned.
    public var progress: Progress {
        Progress(completed: completedChunks.load(ordering: .acquiring), total: total)
    }

    /// Timing of the chunks so far (see `Statistics`). Any thread; fields are read one by one,
    /// so read it after the job finished for a consistent set.
    public var statistics: Statistics {
        let first = firstStart.load(ordering: .acquiring)
        let last = lastEnd.load(ordering: .acquiring)
        return Statistics(
            chunks: completedChunks.load(ordering: .relaxed),
            elapsed: Duration(nanoseconds: first == 0 || last < first ? 0 : last - first),
            chunkTime: Duration(nanoseconds: chunkNanoseconds.load(ordering: .relaxed)),
            longestGap: Duration(nanoseconds: longestGapNanoseconds.load(ordering: .relaxed)),
            turns: turnCount.load(ordering: .relaxed))
    }

    /// Whether the job has finished (completed or cancelled). Any thread.
    public var isFinished: Bool { finished.withLock { $0.outcome != nil } }

    /// Whether `pause()` is in effect (and the job has not finished).
    public var isPaused: Bool { control.load(ordering: .relaxed) & Self.pausedFlag != 0 && !isFinished }

    /// Holds the job back after the chunk in progress, until `resume()`. The feeder goes on with
    /// the work queued behind it. Any thread; no effect on a finished job.
    public func pause() {
        pauses.wrappingAdd(1, ordering: .relaxed)
        control.bitwiseOr(Self.pausedFlag, ordering: .releasing)
    }

    /// Lets a paused job run again, in its old place in the feeder's line. Any thread.
    public func resume() {
        let old = control.bitwiseAnd(~Self.pausedFlag, ordering: .releasing).oldValue
        if old & Self.pausedFlag != 0 { feeder.wake() }
    }

    /// Cancels the job: at most the chunk in progress completes, no other chunk runs, and the job
    /// finishes as `.cancelled` on the loop (promptly, even while it or the feeder is paused).
    /// Any thread; idempotent; no effect on a job that already completed.
    public func cancel() {
        let old = control.bitwiseOr(Self.cancelledFlag, ordering: .releasing).oldValue
        if old & Self.cancelledFlag == 0 { feeder.requestSweep() }
    }

    /// Calls `handler` with the outcome on the feeder's loop thread when the job finishes, after
    /// its last chunk (in the same loop turn). Handlers run in the order they were added. If the
    /// job has already finished, `handler` runs in a later loop turn, never inside this call.
    ///
    /// Must be called on the feeder's loop thread (precondition); elsewhere, `await outcome`.
    @available(*, noasync, message: "loop thread only; in async code `await job.outcome`")
    public func onCompletion(_ handler: @escaping (FeedOutcome) -> Void) {
        feeder.loop.preconditionOnLoop("FeedJob.onCompletion(_:)", elsewhereUse: "await job.outcome")
        if let outcome = finished.withLock({ $0.outcome }) {
            feeder.loop.executeNextTurn(priority: feeder.priority) { handler(outcome) }
        } else {
            local.value.handlers.append(handler)
        }
    }

    /// The outcome, once the job has finished: suspends until then. Any task; the job does not
    /// notice the awaiting task being cancelled (cancel the job instead).
    public var outcome: FeedOutcome {
        get async {
            await withCheckedContinuation { continuation in
                let outcome = finished.withLock { state -> FeedOutcome? in
                    if let outcome = state.outcome { return outcome }
                    state.waiters.append(continuation)
                    return nil
                }
                if let outcome { continuation.resume(returning: outcome) }
            }
        }
    }

    // MARK: Feeder side (loop thread)

    var isCancelled: Bool { control.load(ordering: .acquiring) & Self.cancelledFlag != 0 }

    /// Whether a chunk of the job has run, or it has finished (it is not waiting to start).
    var hasStarted: Bool { completedChunks.load(ordering: .relaxed) > 0 || isFinished }

    /// Whether the feeder may run a chunk of this job now.
    var isRunnable: Bool { control.load(ordering: .relaxed) == 0 }

    /// Accounts one chunk that ran from `start` to `end` (clock ns). `previousEnd` is the end of
    /// the chunk before it in this stretch (0 when none or after a pause); it becomes `end`.
    /// The caller keeps it in a local across a stretch (a register, not the `Local` object the
    /// opaque chunk call would make it reload) and hands it back to `endStretch`.
    @inline(__always)
    func didRunChunk(start: UInt64, end: UInt64, previousEnd: inout UInt64) {
        if previousEnd != 0 {
            let gap = start &- previousEnd
            if gap > longestGapNanoseconds.load(ordering: .relaxed) {
                longestGapNanoseconds.store(gap, ordering: .relaxed)
            }
        } else if firstStart.load(ordering: .relaxed) == 0 {
            firstStart.store(start, ordering: .relaxed)
        }
        previousEnd = end
        completedChunks.store(completedChunks.load(ordering: .relaxed) &+ 1, ordering: .releasing)
    }

    /// Ends a stretch of chunks run in one turn: publishes their time, and keeps the end of its
    /// last chunk (`previousEnd`) for the next stretch — unless it was interrupted: a pause (of
    /// the job or the feeder) is not starvation, so the next gap starts afresh.
    func endStretch(chunkTime: UInt64, ranAny: Bool, interrupted: Bool, previousEnd: UInt64, local: Local) {
        if ranAny {
            chunkNanoseconds.store(chunkNanoseconds.load(ordering: .relaxed) &+ chunkTime, ordering: .relaxed)
            turnCount.store(turnCount.load(ordering: .relaxed) &+ 1, ordering: .relaxed)
            lastEnd.store(previousEnd, ordering: .releasing)
        }
        local.previousEnd = interrupted ? 0 : previousEnd
    }

    /// Finishes the job, exactly once: wakes the awaiting tasks, then runs the handlers.
    func finish(_ outcome: FeedOutcome) {
        let waiters = finished.withLock { state -> [CheckedContinuation<FeedOutcome, Never>]? in
            guard state.outcome == nil else { return nil }
            state.outcome = outcome
            let waiters = state.waiters
            state.waiters = []
            return waiters
        }
        guard let waiters else { return }
        let local = self.local.value
        local.runner = nil  // releases the body and what it captured
        let handlers = local.handlers
        local.handlers = []
        for waiter in waiters { waiter.resume(returning: outcome) }
        for handler in handlers { handler(outcome) }
    }
}

/// What a job does per chunk. Loop thread only.
class FeedRunner {
    enum Step { case none, ran, ranLast }
    /// Runs the next chunk: `.none` when there was none left, `.ranLast` after the final one.
    func step() -> Step { .none }
}

/// `feed(chunks:_:)`: body(0), body(1), … body(count - 1).
final class CountedRunner: FeedRunner {
    private let count: Int
    private var next = 0
    private let body: (Int) -> Void

    init(count: Int, body: @escaping (Int) -> Void) {
        self.count = max(0, count)
        self.body = body
    }

    override func step() -> Step {
        guard next < count else { return .none }
        let index = next
        next = index &+ 1
        body(index)
        return next == count ? .ranLast : .ran
    }
}

/// `feed(_:_:)` over a sequence, iterated one element ahead so that the last chunk is known.
final class SequenceRunner<S: Sequence>: FeedRunner {
    private var iterator: S.Iterator
    private var upcoming: S.Element?
    private var started = false
    private let body: (S.Element) -> Void

    init(_ sequence: S, body: @escaping (S.Element) -> Void) {
        iterator = sequence.makeIterator()
        self.body = body
    }

    override func step() -> Step {
        if !started {
            started = true
            upcoming = iterator.next()
        }
        guard let element = upcoming else { return .none }
        body(element)
        upcoming = iterator.next()
        return upcoming == nil ? .ranLast : .ran
    }
}
