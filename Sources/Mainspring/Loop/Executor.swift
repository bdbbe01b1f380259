/// Actors on loops: every `EventLoop` is a `SerialExecutor`.
///
/// Pin an actor to a loop and all its code runs on that loop's thread, between the loop's other
/// callbacks:
///
/// ```swift
/// actor Connection {
///     let loop: EventLoop
///     nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
/// }
/// ```
///
/// A job is posted with `execute` at `.normal` priority: FIFO with the other work posted from the
/// same thread, behind ready input, never re-entered. From the loop's own thread that is a
/// lock-free append; from another thread one mutex and (if the loop sleeps) one eventfd write.
/// Task priorities are not used to reorder jobs. A job enqueued on a loop that is never run again
/// never runs (it is counted in `LoopMetrics.droppedAtShutdown` if the loop is freed).
///
/// `EventLoop.main` is a different executor from `MainActor`'s (which is the Dispatch main queue,
/// drained by the same loop on the same thread): an actor pinned to `EventLoop.main` runs on the
/// main thread, but the compiler does not treat it as `@MainActor`.
extension EventLoop: SerialExecutor {
    /// Runs `job` on this loop's thread. Any thread.
    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        execute { job.runSynchronously(on: executor) }
    }

    /// This loop as an executor reference (identity equality: one loop, one executor).
    public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
        UnownedSerialExecutor(ordinary: self)
    }

    /// Stops the program with a clear message unless the caller is on this loop's thread
    /// (which, for a serial executor running one job at a time on one thread, is isolation).
    /// Backs `assumeIsolated` and `preconditionIsolated` for actors pinned to this loop.
    public func checkIsolated() {
        precondition(isCurrent, "Mainspring: expected to run on the loop's thread (an actor pinned to this loop), but this is another thread")
    }

    /// Whether the caller is on this loop's thread: never a false positive.
    public func isIsolatingCurrentContext() -> Bool? {
        isCurrent
    }
}
