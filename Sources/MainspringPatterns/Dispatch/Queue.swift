import Dispatch
import MainspringCore

/// Where to run a closure: a small facade over event loops and Dispatch queues, for the
/// "do this on the main thread / in the background, maybe wait for it" code that every program
/// writes by hand.
///
/// - `.main` is `EventLoop.main`: work runs on the main thread inside `EventLoop.main.run()`
///   (posted with `execute`, not through `DispatchQueue.main`; the two are drained by the same
///   loop but their relative order is not promised).
/// - `.global(qos)` is `DispatchQueue.global(qos:)`.
/// - `.serial(label)` and `.concurrent(label)` are Dispatch queues **created once per label** and
///   reused for the life of the process: `.serial("db")` is the same queue every time, so work
///   sent to it runs in order. A serial and a concurrent queue may share a label and are then two
///   different queues.
/// - `.loop(someLoop)` is any event loop.
///
/// Durations are `Duration`s; a negative one counts as zero.
public enum Queue: Sendable {
    /// `EventLoop.main`, on the process main thread.
    case main
    /// A Dispatch global concurrent queue.
    case global(DispatchQoS.QoSClass)
    /// The process-wide serial Dispatch queue with this label (created on first use).
    case serial(String)
    /// The process-wide concurrent Dispatch queue with this label (created on first use).
    case concurrent(String)
    /// An event loop: work runs on its thread.
    case loop(EventLoop)

    /// Runs `work` on this queue, asynchronously. Any thread; never blocks.
    public func async(_ work: @escaping @Sendable () -> Void) {
        switch target {
        case .loop(let loop): loop.execute(work)
        case .dispatch(let queue, _): queue.async(execute: work)
        }
    }

    /// Runs `work` on this queue and waits until it has *started* (not finished), for at most
    /// `timeout` (`nil`: as long as it takes).
    ///
    /// The work is queued either way; `false` means it had not started by the deadline and will
    /// start later. The wait is a `Semaphore.wait`: on a loop's thread that loop keeps running
    /// meanwhile, so waiting on the main thread for `.main` (or on a loop for itself) does not
    /// deadlock — the work starts, and runs, inside the wait. From inside a serial queue for
    /// that same queue the work cannot start before the caller returns: it is queued and `false`
    /// is returned at once.
    ///
    /// - Returns: whether `work` had started before the timeout.
    @discardableResult
    public func async(waitingForStart timeout: Duration?, _ work: @escaping @Sendable () -> Void) -> Bool {
        let started = Semaphore()
        let target = target
        let wrapped: @Sendable () -> Void = {
            started.signal()
            work()
        }
        switch target {
        case .loop(let loop):
            loop.execute(wrapped)
        case .dispatch(let queue, let token):
            queue.async(execute: wrapped)
            if let token, DispatchQueue.getSpecific(key: queueTokenKey) === token, !isConcurrent {
                return false
            }
        }
        return started.wait(timeout: timeout)
    }

    /// Runs `work` on this queue and returns its result (or rethrows its error) once it has
    /// finished. Runs it inline, on the caller's thread, when the caller is already on this queue
    /// or loop — so the main thread can `Queue.main.sync { … }` without deadlocking.
    ///
    /// Otherwise the caller waits: on a thread that runs an event loop the wait keeps that loop
    /// running (a `Semaphore.wait`), so two loops (or the main thread and a queue) that `sync`
    /// onto each other do not deadlock; on a plain thread a Dispatch target is entered with
    /// `DispatchQueue.sync` and a loop target is waited for by blocking the thread. A loop that
    /// is not running does not run the work until it runs again.
    public func sync<T>(_ work: () throws -> T) rethrows -> T {
        let target = target
        switch target {
        case .loop(let loop):
            if loop.isCurrent { return try work() }
        case .dispatch(let queue, let token):
            if let token, DispatchQueue.getSpecific(key: queueTokenKey) === token { return try work() }
            if EventLoop.loopToSpinWhileWaiting == nil { return try queue.sync(execute: work) }
        }
        return try withoutActuallyEscaping(work) { work throws -> T in
            let box = ResultBox<T>()
            let done = Semaphore()
            let job = SyncJob { box.result = Result { try work() } }
            switch target {
            case .loop(let loop): loop.execute { job.run(); done.signal() }
            case .dispatch(let queue, _): queue.async { job.run(); done.signal() }
            }
            done.wait()
            return try box.result!.get()
        }
    }

    /// Runs `work` on this queue after `delay` (never earlier; measured from this call). Any
    /// thread; never blocks. On a loop the delay is one of its timers; on a Dispatch queue it is
    /// `asyncAfter`.
    public func after(_ delay: Duration, _ work: @escaping @Sendable () -> Void) {
        let nanoseconds = delay.clampedNanoseconds
        switch target {
        case .loop(let loop):
            let deadline = loop.monotonicNow() &+ nanoseconds
            loop.execute { loop.schedule(atMonotonicNanoseconds: deadline, work) }
        case .dispatch(let queue, _):
            queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: nanoseconds)), execute: work)
        }
    }

    // MARK: Resolution

    private var isConcurrent: Bool {
        if case .concurrent = self { return true }
        return false
    }

    /// What the case stands for: a loop, or a Dispatch queue (with its token when it is a named
    /// queue, to recognise it as the current queue).
    private var target: Target {
        switch self {
        case .main: return .loop(EventLoop.main)
        case .loop(let loop): return .loop(loop)
        case .global(let qos): return .dispatch(DispatchQueue.global(qos: qos), nil)
        case .serial(let label): return NamedQueues.shared.queue(label, concurrent: false)
        case .concurrent(let label): return NamedQueues.shared.queue(label, concurrent: true)
        }
    }
}

private enum Target {
    case loop(EventLoop)
    case dispatch(DispatchQueue, QueueToken?)
}

/// Identifies a named queue from inside it (`DispatchQueue.getSpecific`).
private final class QueueToken: Sendable {}

private let queueTokenKey = DispatchSpecificKey<QueueToken>()

/// The named queues, created once per (label, kind) and kept for the life of the process.
private final class NamedQueues: Sendable {
    static let shared = NamedQueues()

    private struct Key: Hashable {
        let label: String
        let concurrent: Bool
    }

    private let queues = Protected<[Key: (DispatchQueue, QueueToken)]>([:])

    /// - Complexity: one dictionary lookup under a mutex.
    func queue(_ label: String, concurrent: Bool) -> Target {
        let (queue, token) = queues.withLock { queues in
            let key = Key(label: label, concurrent: concurrent)
            if let existing = queues[key] { return existing }
            let queue = DispatchQueue(label: label, attributes: concurrent ? .concurrent : [])
            let token = QueueToken()
            queue.setSpecific(key: queueTokenKey, value: token)
            queues[key] = (queue, token)
            return (queue, token)
        }
        return .dispatch(queue, token)
    }
}

/// The result of a `sync` call, written by the target and read by the waiting caller after the
/// semaphore hand-off (which orders the two).
private final class ResultBox<T>: @unchecked Sendable {
    var result: Result<T, Error>?
}

/// Carries the non-`Sendable`, non-escaping closure of `sync` to its target. The caller blocks
/// until it has run, so it is never used concurrently; `run` drops it before the caller is
/// released, so it does not outlive the call (`withoutActuallyEscaping` checks that).
private final class SyncJob: @unchecked Sendable {
    private var body: (() -> Void)?
    init(_ body: @escaping () -> Void) { self.body = body }

    func run() {
        body?()
        body = nil
    }
}
