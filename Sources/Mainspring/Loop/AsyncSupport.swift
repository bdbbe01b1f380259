/// `async` entry points: run a closure on a loop and await its result, sleep on a loop's timer,
/// let ready input go first.
extension EventLoop {
    /// Runs `work` on this loop's thread and returns its result (or rethrows its error) to the
    /// awaiting task. Any thread, any task.
    ///
    /// The work is posted with `execute` at `.normal` priority and runs when the loop runs.
    /// Cancelling the awaiting task does not cancel the work: once posted it runs. Should the
    /// work be dropped without running (its loop freed), the call throws
    /// `EventLoopError.loopClosed` rather than hanging.
    /// Costs one post plus one continuation resume (a task hop back to the caller's executor).
    public func submit<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
            let once = ResumeOnce(continuation, orphaned: .failure(EventLoopError.loopClosed))
            execute {
                once.resume(with: Result { try work() })
            }
        }
    }

    /// Suspends the calling task for at least `duration`, timed by one of this loop's timers
    /// (never early; as late as the loop's other work makes it). A negative duration counts as
    /// zero. Any thread, any task; the task resumes on its own executor.
    ///
    /// The timer only fires while the loop runs. Cancelling the task ends the sleep at once with
    /// `CancellationError` (and cancels the timer); should the timer be dropped unfired (its loop
    /// freed), it throws `EventLoopError.loopClosed`.
    public func sleep(for duration: Duration) async throws {
        let deadline = monotonicNow() &+ duration.clampedNanoseconds
        let wait = CancellableWait<Void, Error>(cancelled: .failure(CancellationError()))
        let timer = SleepTimer()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, Error>) in
                let once = wait.begin(continuation, orphaned: .failure(EventLoopError.loopClosed))
                guard !once.isResumed else { return }  // cancelled already
                execute {
                    guard !once.isResumed else { return }
                    timer.handle = self.schedule(atMonotonicNanoseconds: deadline) {
                        once.resume(with: .success(()))
                    }
                }
            }
        } onCancel: {
            wait.cancel()
            execute { timer.cancel() }
        }
    }

    /// Suspends the calling task until this loop has polled again and run the input that was
    /// ready by then: `.input` work goes first, then this task continues. Use it to break long
    /// work running on the loop (an actor pinned to it) into slices that keep input responsive.
    ///
    /// This is the way out for a task that runs long on the loop without suspending (see the
    /// poll-interval rule in `Executor.swift`): `await loop.yield()` every few milliseconds of
    /// work keeps input responsive.
    ///
    /// Any thread, any task; it returns once the loop has run its next turn (or is freed). From
    /// a task running on this loop it costs one record queued for the next turn.
    public func yield() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let once = ResumeOnce(continuation, orphaned: .success(()))
            if isCurrent && !lifecycle.isShutDown {
                executeNextTurn(priority: .normal) { once.resume(with: .success(())) }
            } else {
                execute {
                    self.executeNextTurn(priority: .normal) { once.resume(with: .success(())) }
                }
            }
        }
    }
}

/// Resumes a continuation exactly once; if it is released without having resumed it (the
/// closure holding it was dropped: the loop was freed before running it), it resumes with
/// `orphaned`, so no task ever hangs on a dead loop.
final class ResumeOnce<T: Sendable, E: Error>: Sendable {
    private let state: Protected<CheckedContinuation<T, E>?>
    private let orphaned: Result<T, E>

    init(_ continuation: CheckedContinuation<T, E>, orphaned: Result<T, E>) {
        self.state = Protected(continuation)
        self.orphaned = orphaned
    }

    /// Whether it has been resumed already.
    var isResumed: Bool { state.withLock { $0 == nil } }

    /// Takes the continuation, to resume it later (nil if it was resumed already): from then on
    /// a `resume(with:)` — a cancellation's, say — finds nothing to resume. For a step that must
    /// not happen once the waiter has been told otherwise (a datagram sent after its sender got
    /// `.cancelled`): take first, then act, then resume what was taken.
    func take() -> CheckedContinuation<T, E>? {
        state.withLock { slot -> CheckedContinuation<T, E>? in
            defer { slot = nil }
            return slot
        }
    }

    func resume(with result: Result<T, E>) {
        let continuation = state.withLock { slot -> CheckedContinuation<T, E>? in
            defer { slot = nil }
            return slot
        }
        continuation?.resume(with: result)
    }

    deinit {
        let continuation = state.withLock { slot -> CheckedContinuation<T, E>? in
            defer { slot = nil }
            return slot
        }
        continuation?.resume(with: orphaned)
    }
}

/// The cancellation side of a wait whose continuation the loop's closures hold (through a
/// `ResumeOnce`, so a freed loop still resumes it): held weakly here, to resume the wait early
/// with `cancelled` when the waiting task is cancelled — even before the wait began. Used by
/// `sleep(for:)` and `waitCancellably`.
final class CancellableWait<T: Sendable, E: Error>: Sendable {
    private struct State {
        weak var once: ResumeOnce<T, E>?
        var isCancelled = false
    }

    private let state = Protected(State())
    private let cancelled: Result<T, E>

    init(cancelled: Result<T, E>) { self.cancelled = cancelled }

    /// Makes the wait's `ResumeOnce` (orphaned: `orphaned`) and remembers it; if the task was
    /// cancelled already, resumes it at once.
    func begin(_ continuation: CheckedContinuation<T, E>, orphaned: Result<T, E>) -> ResumeOnce<T, E> {
        let once = ResumeOnce(continuation, orphaned: orphaned)
        let wasCancelled = state.withLock { state -> Bool in
            state.once = once
            return state.isCancelled
        }
        if wasCancelled { once.resume(with: cancelled) }
        return once
    }

    /// Any thread: the task was cancelled.
    func cancel() {
        let once = state.withLock { state -> ResumeOnce<T, E>? in
            state.isCancelled = true
            return state.once
        }
        once?.resume(with: cancelled)
    }
}

/// The timer of one `sleep(for:)`, cancelled with the sleep. Loop thread only (`@unchecked
/// Sendable` only so that the loop's own posts can carry it).
private final class SleepTimer: @unchecked Sendable {
    var handle: TimerHandle?

    func cancel() {
        handle?.cancel()
        handle = nil
    }
}

extension EventLoop {
    /// A call that starts something on this loop and waits for its outcome, the library's
    /// cancellation rule built in: `start` runs on the loop (at once when the caller is there)
    /// with the `ResumeOnce` its outcome resumes. Cancelling the task resumes it at once with
    /// `.cancelled`, then runs `onCancel` (on the cancelling thread) to undo what was started; a
    /// task cancelled before `start` ran never runs it. A loop that drops the post, or is freed
    /// while the wait is held, resumes it with `.loopClosed`.
    nonisolated(nonsending) func waitCancellably<T: Sendable>(
        _ start: @escaping @Sendable (ResumeOnce<Result<T, EventLoopError>, Never>) -> Void,
        onCancel: @escaping @Sendable () -> Void = {}
    ) async -> Result<T, EventLoopError> {
        let wait = CancellableWait<Result<T, EventLoopError>, Never>(cancelled: .success(.failure(.cancelled)))
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let once = wait.begin(continuation, orphaned: .success(.failure(.loopClosed)))
                executeNowOrPost({
                    guard !once.isResumed else { return }  // cancelled before it began
                    start(once)
                }, orElse: { once.resume(with: .success(.failure(.loopClosed))) })
            }
        } onCancel: {
            wait.cancel()
            onCancel()
        }
    }
}

extension EventLoop {
    /// Posts `work` like `execute`; if the loop drops it instead of running it (the loop is shut
    /// down, or freed first), `fallback` runs, on the thread that drops it. For posts that
    /// resume a suspended task: it must be resumed either way.
    package func execute(priority: Priority = .normal, _ work: @escaping @Sendable () -> Void,
                         orElse fallback: @escaping @Sendable () -> Void)
    {
        let post = RunOrElse(work, fallback)
        execute(priority: priority) { post.run() }
    }
}

extension EventLoop {
    /// Runs `work` at once when the caller is on the loop's thread; otherwise posts it like
    /// `execute(_:orElse:)`, so `fallback` runs instead if the loop drops it. For the first step of
    /// an async call that must happen on the loop and resume its caller either way.
    func executeNowOrPost(_ work: @escaping @Sendable () -> Void, orElse fallback: @escaping @Sendable () -> Void) {
        if isCurrent {
            work()
        } else {
            execute(work, orElse: fallback)
        }
    }
}

/// One of two closures, run once: `work` when the loop runs the post, `fallback` when the post
/// is released without having run.
private final class RunOrElse: @unchecked Sendable {
    // Only the loop's thread (run) or the thread releasing the last reference (deinit) touch these,
    // never both: deinit cannot start while the post that holds the object is running.
    private var work: (@Sendable () -> Void)?
    private var fallback: (@Sendable () -> Void)?

    init(_ work: @escaping @Sendable () -> Void, _ fallback: @escaping @Sendable () -> Void) {
        self.work = work
        self.fallback = fallback
    }

    func run() {
        let work = self.work
        self.work = nil
        fallback = nil
        work?()
    }

    deinit { fallback?() }
}
