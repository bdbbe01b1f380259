/// Which thread a loop belongs to, and the per-thread loops.
extension EventLoop {
    /// The loop of the process main thread.
    ///
    /// While it runs (`run`, `spin`, `runOnce` on the main thread) it also drains the Dispatch
    /// main queue, so `DispatchQueue.main.async`, `asyncAfter`, `MainActor.run`,
    /// `Task { @MainActor in … }` run inside it, on the main thread, between its other callbacks
    /// (see `MainQueueSource` for the rules). Only the main thread can own it: `run()` from
    /// another thread throws `EventLoopError.wrongThread`. Posting to it (`execute`, `submit`,
    /// `Queue.main`) works from any thread. Do not mix it with `RunLoop.main.run()` or
    /// `dispatchMain()`, which drain the same main queue their own way.
    public static let main: EventLoop = {
        do {
            return try EventLoop(configuration: .init(), isMainLoop: true)
        } catch {
            fatalError("Mainspring: cannot create the main loop: \(error)")
        }
    }()

    private static let threadLoop = ThreadLocalReference<EventLoop>()

    /// The calling thread's loop: on the main thread `EventLoop.main`; on a thread that runs a
    /// loop — a group's thread, a thread inside `run()`, a task or callback on a loop, a
    /// simulation's body (`MainspringTesting`) — that loop; on a plain thread of your own, a loop
    /// created and bound to it by the first call (a documented binding: run it there). The thread
    /// keeps its loop until it exits — the `RunLoop.current` analogue. When the thread exits, the
    /// loop is shut down: its sources are closed, and work still queued (or posted later) is
    /// dropped and counted in `LoopMetrics.droppedAtShutdown`.
    ///
    /// In a task that runs on no loop (a thread of Swift concurrency's cooperative pool) there is
    /// no loop to give, and none is made — one made for a pool thread would never run, and every
    /// timer and post on it would silently wait forever. That holds even where the thread was
    /// given a loop before, outside any task (the pool shares Dispatch's worker threads, where a
    /// `SpinningOperation` on an `OperationQueue` binds one): it does not run while the thread
    /// runs tasks. This stops the program with a message saying so (``forCurrentThread()``
    /// throws `EventLoopError.wrongThread` instead). Use `EventLoop.main`, a loop you hold, an
    /// `EventLoopGroup`, or `Task(executorPreference: loop)`.
    ///
    /// A loop needs five descriptors (epoll, a timerfd, libevent's signal pipe, its eventfd). A
    /// getter cannot throw: where the thread may have no loop yet while the process is out of
    /// descriptors (a thread started under an `EMFILE` storm), call ``forCurrentThread()``,
    /// which reports the failure as an error; here it stops the program with that error.
    public static var current: EventLoop {
        do {
            return try forCurrentThread()
        } catch .wrongThread(let function) {
            fatalError("Mainspring: \(function)")
        } catch {
            fatalError("Mainspring: cannot create a loop for this thread (\(error)); EventLoop.forCurrentThread() reports this as an error")
        }
    }

    /// The calling thread's loop, as ``current`` — the loop the thread runs, or one created and
    /// bound to a plain thread on first use — but a loop that cannot be created (out of file
    /// descriptors, `EMFILE`), or a task that runs on no loop, is an error instead of the end of
    /// the program. Any thread; once the thread has its loop, this is a thread-local read.
    ///
    /// - Throws: `EventLoopError.system` or `.libevent` when the thread has no loop yet and
    ///   none can be made (the next call tries again); `.wrongThread` in a task that runs on no
    ///   loop (a thread of the cooperative pool: no loop is made for it).
    public static func forCurrentThread() throws(EventLoopError) -> EventLoop {
        // A group's thread, a loop run by hand, a simulation's driver: the loop it runs.
        if let loop = runningLoop.value { return loop }
        // Swift concurrency's pool shares its threads with Dispatch's workers, so a pool thread
        // may hold a loop bound there earlier, outside any task (a `SpinningOperation` on an
        // `OperationQueue`, `EventLoop.current` in a `DispatchQueue.global()` block). That loop
        // does not run while the thread runs tasks: only the main thread's (`main`) is given to
        // a task. (Whether a task runs here is a thread-local read, as the loop is.)
        let inTask = withUnsafeCurrentTask { $0 != nil }
        if let loop = threadLoop.value, !inTask || loop.isMainLoop { return loop }
        let isMain = isProcessMainThread()
        if inTask && !isMain {
            throw .wrongThread(function: "EventLoop.current (called in a task that runs on no loop: a loop made for a thread "
                + "of the cooperative pool would never run, its timers and posts would wait forever; use EventLoop.main, a "
                + "loop you hold, or Task(executorPreference: loop))")
        }
        let loop = isMain ? main : try EventLoop(configuration: .init(), isMainLoop: false)
        _ = loop.claimThread()
        threadLoop.set(loop)
        return loop
    }

    /// The loop whose `run`/`spin`/`runOnce` is innermost on the calling thread's stack.
    static let runningLoop = ThreadLocalUnretained<EventLoop>()

    /// The loop a blocking wait on the calling thread should keep running (nested) instead of
    /// freezing: the loop this thread is running right now, else its `EventLoop.current` if it
    /// has one, else `EventLoop.main` on the main thread. `nil` on a plain thread (never creates
    /// a loop).
    /// `package`: `Semaphore`, `Queue.sync` and the operations' waits (MainspringPatterns) spin it.
    package static var loopToSpinWhileWaiting: EventLoop? {
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

    /// Whether the caller may act on the loop directly, for a member that works from any thread
    /// (posting otherwise): its thread owns the loop, or it is the main thread and this the main
    /// loop, or it drives this simulated loop's simulation. Unlike `claimThread()` it never binds
    /// an unbound loop to the calling thread: a call from a task or a stray thread is posted,
    /// and the loop stays free for the thread that runs it. As cheap as `isCurrent`.
    @inline(__always)
    package var acceptsDirectCalls: Bool {
        let owner = ownerThread.load(ordering: .relaxed)
        if owner == currentThreadID() { return true }
        return (isSimulated || (owner == 0 && isMainLoop)) && claimThread()
    }

    /// Binds an unbound loop to the calling thread, or tells whether the caller owns it.
    func claimThread() -> Bool {
        let me = currentThreadID()
        let owner = ownerThread.load(ordering: .acquiring)
        if owner == me { return true }
        if let simulation {
            // A simulated loop belongs to whichever thread drives its simulation: a test's body
            // may resume on another thread between two steps.
            guard !isOrphaned, simulation.adoptCallingThread(for: self) else { return false }
            return ownerThread.load(ordering: .acquiring) == me
        }
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
        ownerThread.store(LoopOwnership.orphaned.word, ordering: .releasing)
    }

    /// Who owns the loop right now (see `LoopOwnership`).
    var ownership: LoopOwnership { LoopOwnership(word: ownerThread.load(ordering: .acquiring)) }

    /// Whether the loop's thread has finished with it for good (see `releaseThread`).
    var isOrphaned: Bool { ownership == .orphaned }

    /// Whether some thread that has not finished with the loop owns it.
    var isBoundToLiveThread: Bool {
        if case .owned = ownership { return true }
        return false
    }

    /// Stops the program with a message naming `function` unless the caller is on this loop's
    /// thread (binding an unbound loop to it, as running it would). `package`: the loop-only
    /// calls of MainspringPatterns (`Timeline`, `animate`, the drain hooks) check with it.
    package func preconditionOnLoop(_ function: StaticString, file: StaticString = #fileID, line: UInt = #line) {
        requireUsage(
            claimThread(),
            "Mainspring: \(function) must be called on the loop's own thread; use execute(_:) to get there",
            file: file, line: line)
    }

    /// `preconditionOnLoop(_:)` for a loop-only call that has a form for other threads:
    /// the message names `alternative` ("execute(after:_:)", "await timeline.run()").
    package func preconditionOnLoop(_ function: StaticString, elsewhereUse alternative: StaticString,
                                    file: StaticString = #fileID, line: UInt = #line)
    {
        requireUsage(
            claimThread(),
            "Mainspring: \(function) must be called on the loop's own thread; from another thread use \(alternative)",
            file: file, line: line)
    }
}
