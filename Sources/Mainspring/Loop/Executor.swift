import Dispatch

/// Swift concurrency on loops: every `EventLoop` is a `SerialExecutor` (actors pinned to it) and
/// a `TaskExecutor` (tasks that prefer it).
///
/// **Actors on a loop.** Pin an actor to a loop and all its code runs on that loop's thread,
/// between the loop's other callbacks:
///
/// ```swift
/// actor Session {
///     let loop: EventLoop
///     nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
/// }
/// ```
///
/// **Tasks on a loop.** `Task(executorPreference: loop) { … }`,
/// `group.addTask(executorPreference: loop) { … }` and `withTaskExecutorPreference(loop) { … }`
/// run nonisolated async code on the loop's thread: the task's code between two suspension
/// points is one loop callback, and a task waiting for the loop's input is resumed with one
/// post. Such a task calls an actor pinned to the same loop without a thread switch: one post
/// there and one back, both lock-free appends on the loop's own thread.
///
/// **What a job is.** Every job (a slice of a task or of an actor) is posted with `execute` at
/// `.normal` priority: FIFO with the other work posted from the same thread, behind ready input,
/// never re-entered, counted in `LoopMetrics` like any callback. From the loop's own thread that
/// is a lock-free append; from another thread one mutex and (if the loop sleeps) one eventfd
/// write. Task priorities do not reorder jobs. One exception keeps input first: when input
/// arrives for a task suspended on this loop's connections, readers or signals (a line, a
/// chunk, room to send), the job that resumes it is `.input` work, as the callback that would
/// otherwise handle that input — and so are the jobs that job posts on this loop (the task
/// hopping into an actor of the loop to handle it).
///
/// **The poll-interval rule applies to tasks too.** The loop polls for input between callbacks,
/// at least every `Configuration.pollInterval`; a job cannot be interrupted. A task that runs
/// for a long time without suspending holds input back exactly like a long callback. Await
/// something (the loop's input, `send`, a timer) or call `await loop.yield()` in long loops:
/// that lets the loop poll and run the input that is ready before the task goes on.
///
/// **Shutdown.** `EventLoopGroup.shutdown(gracePeriod:)` gives the tasks on its loops the grace
/// period, then ends every wait they have on the loops (connections, listeners, readers,
/// signals) and lets them unwind before the loops stop. A job that reaches a loop after it
/// has shut down (its group shut down, its thread gone) — the rest of a task that prefers it,
/// an actor pinned to it — is not lost: it is counted in `LoopMetrics.droppedAtShutdown` and
/// runs on a fallback thread instead, one job at a time (so actors stay isolated), so that no
/// task waits forever. There, Mainspring's async calls on the dead loop fail (they throw, or
/// their sequences end) and its loop-thread-only calls stop the program: a task should be done
/// with its loop when the loop ends.
///
/// **`EventLoop.main` and the main actor are one serial context.** The main actor's jobs run
/// inside `EventLoop.main` (through the Dispatch main queue, see `MainQueueSource`), on the main
/// thread, and so does everything pinned to `EventLoop.main`. An actor pinned to
/// `EventLoop.main` therefore uses the main actor's executor: `@MainActor` code calls it without
/// any hop, and its jobs from other threads arrive through the main queue (drained at `.normal`
/// priority). Tasks that prefer `EventLoop.main` still run as loop callbacks.
extension EventLoop: SerialExecutor, TaskExecutor {
    /// Runs `job` on this loop's thread, as a task executor: the job of a task that prefers this
    /// loop. Any thread.
    public func enqueue(_ job: consuming ExecutorJob) {
        post(UnownedJob(job), asTask: true)
    }

    /// Posts a job: at `.normal` priority, or at `.input` when an input source of this loop is
    /// resuming the task that waited for it (`resumingInput`), or when a job running at `.input`
    /// posts it (the task hopping on, into an actor of this loop, say: still handling its input).
    ///
    /// From the loop's own thread the job goes into a ready record as it is (no allocation);
    /// from another thread, or once the loop has shut down, it travels in a `JobPost`.
    @inline(__always)
    func post(_ job: UnownedJob, asTask: Bool) {
        if ownerThread.load(ordering: .relaxed) == currentThreadID() && !lifecycle.isShutDown {
            let priority = jobPriority
            let record = ReadyRecord(job: job, asTask: asTask, on: Unmanaged.passUnretained(self),
                                     stamp: scheduler.cachedNow, priority: priority)
            scheduler.enqueue(record, priority)
        } else {
            let post = JobPost(job, loop: self, asTask: asTask)
            execute(priority: .normal) { post.run() }
        }
    }

    /// Runs `resume` (which resumes a task waiting for input on this loop) so that the task's
    /// next job runs at `.input` priority, like the callback it replaces: input handled by a task
    /// keeps its place ahead of posted work and fed work. Loop thread only.
    @inline(__always)
    func resumingInput(_ resume: () -> Void) {
        let outer = jobPriority
        jobPriority = .input
        resume()
        jobPriority = outer
    }

    /// The executor of actors pinned to this loop (identity equality: one loop, one executor).
    /// For `EventLoop.main`, the main actor's executor (see above).
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        if isMainLoop { return MainActor.sharedUnownedExecutor }
        return actorExecutor.asUnownedSerialExecutor()
    }

    /// This loop as a task executor.
    public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
        UnownedTaskExecutor(ordinary: self)
    }

    /// Stops the program with a clear message unless the caller is on this loop's thread
    /// (which, for a serial executor running one job at a time on one thread, is isolation).
    public func checkIsolated() {
        requireUsage(isCurrent, "Mainspring: expected to run on the loop's thread (an actor pinned to this loop), but this is another thread")
    }

    /// Whether the caller is on this loop's thread: never a false positive.
    public func isIsolatingCurrentContext() -> Bool? {
        isCurrent
    }
}

/// The serial executor of the actors pinned to one loop. It is not the loop object itself
/// because an executor has one `enqueue` for both of its roles, and the two roles need their
/// jobs run differently:
///
/// - a task's job (the loop as its task executor) runs as nonisolated code with the loop as its
///   task executor: a continuation it suspends on then resumes straight into that code, and its
///   calls to other nonisolated async functions need no executor switch;
/// - an actor's job runs isolated to the loop *and* with the loop as its task executor: the
///   actor's code, run for a task that prefers the loop (the usual case: a connection's task and
///   an actor on the connection's loop), then awaits and calls without switching executors.
///
/// Measured on the daemon's two shapes (requests per job posted, 16 pipelined per batch): a
/// nonisolated handler and an actor handler both take about one job per batch this way; running
/// either role's jobs the other's way costs 4.5 jobs per *request* for one of the shapes. The
/// price: a task *without* an executor preference, in an actor pinned to a loop, calling another
/// actor of the same loop makes two posts (on the same thread) instead of none.
final class LoopActorExecutor: SerialExecutor, @unchecked Sendable {
    /// Set once, right after the loop is initialised; the loop owns this object.
    unowned(unsafe) var loop: EventLoop?

    func enqueue(_ job: consuming ExecutorJob) {
        guard let loop else { return }
        loop.post(UnownedJob(job), asTask: false)
    }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    func checkIsolated() {
        requireUsage(loop?.isCurrent == true, "Mainspring: expected to run on the loop's thread (an actor pinned to this loop), but this is another thread")
    }

    func isIsolatingCurrentContext() -> Bool? {
        loop?.isCurrent ?? false
    }
}

/// The loop runs the jobs its ready records carry.
extension EventLoop {
    /// Runs `job` as posted at `priority`: jobs it posts meanwhile get the same priority.
    /// Loop thread only.
    @inline(__always)
    func run(_ job: UnownedJob, asTask: Bool, priority: Priority) {
        let outer = jobPriority
        jobPriority = priority
        Self.run(job, on: self, asTask: asTask)
        jobPriority = outer
    }

    /// A job this loop dropped (it shut down): it runs on the orphan queue instead, with this
    /// loop (shut down: what the job posts to it is orphaned in turn) as its executor. While the
    /// loop is being freed it cannot be that — a task that prefers a loop keeps it alive, so only
    /// an actor that did not hold its loop gets here — and the job runs on `OrphanExecutor`.
    func orphan(_ job: UnownedJob, asTask: Bool) {
        if lifecycle.isBeingFreed {
            OrphanExecutor.shared.run(job, asTask: asTask)
        } else {
            Self.orphans.async { Self.run(job, on: self, asTask: asTask) }
        }
    }

    fileprivate static func run(_ job: UnownedJob, on loop: EventLoop, asTask: Bool) {
        job.run(asTask: asTask, serialExecutor: loop.asUnownedSerialExecutor(), taskExecutor: loop.asUnownedTaskExecutor())
    }

    /// Where the jobs of shut-down loops run: one at a time, in the order they were dropped, so
    /// that a task never stays suspended because its loop is gone.
    static let orphans = DispatchQueue(label: "mainspring.orphaned-jobs")
}

/// Where the jobs of a loop freed with jobs still queued run: one at a time on the orphan queue,
/// as their own executor, so that no task stays suspended forever.
final class OrphanExecutor: TaskExecutor, SerialExecutor, @unchecked Sendable {
    static let shared = OrphanExecutor()

    func enqueue(_ job: consuming ExecutorJob) {
        run(UnownedJob(job), asTask: true)
    }

    func run(_ job: UnownedJob, asTask: Bool) {
        EventLoop.orphans.async {
            job.run(asTask: asTask, serialExecutor: self.asUnownedSerialExecutor(), taskExecutor: self.asUnownedTaskExecutor())
        }
    }
}

extension UnownedJob {
    /// Runs the job: a task's job with `taskExecutor` as its task executor, or an actor's job
    /// isolated to `serialExecutor` and with `taskExecutor` as well (see `LoopActorExecutor`).
    @inline(__always)
    fileprivate func run(asTask: Bool, serialExecutor: UnownedSerialExecutor, taskExecutor: UnownedTaskExecutor) {
        if asTask {
            runSynchronously(on: taskExecutor)
        } else {
            runSynchronously(isolatedTo: serialExecutor, taskExecutor: taskExecutor)
        }
    }
}

/// A job on its way to a loop from another thread: one allocation (the closure posted captures
/// only this object). If the loop drops it instead of running it — it has shut down — the job
/// runs on the orphan queue.
final class JobPost: @unchecked Sendable {
    // Touched by the loop that runs it, or by the thread that releases it unrun: never both.
    private let job: UnownedJob
    private let loop: EventLoop
    private let asTask: Bool
    private var didRun = false

    init(_ job: UnownedJob, loop: EventLoop, asTask: Bool) {
        self.job = job
        self.loop = loop
        self.asTask = asTask
    }

    /// Runs the job at `.normal` (how it was posted).
    func run() {
        didRun = true
        loop.run(job, asTask: asTask, priority: .normal)
    }

    deinit {
        guard !didRun else { return }
        loop.orphan(job, asTask: asTask)
    }
}
