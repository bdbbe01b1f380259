import Foundation
import Synchronization

/// N loops on N threads of their own: spread connections and work over the cores.
///
/// The loops run from creation until `shutdown(gracePeriod:)`. Reach them with `next()` (round
/// robin) or `loops`, post to them with `execute`, or run tasks on them
/// (`Task(executorPreference: group.next()) { … }`); loop-thread-only calls (timers, sources)
/// must be made from there.
///
/// ## Ending a group
/// `await group.shutdown(gracePeriod:)` (or `shutdownBlocking(gracePeriod:)` from a plain
/// thread) ends it gracefully and reports what it abandoned. A group that is released without
/// a shutdown does not wait for anything: its `deinit` asks every loop to shut down at once
/// (sources closed without their handlers, queued work dropped and counted, as after a zero
/// grace period) and returns; each loop's thread then ends on its own.
public final class EventLoopGroup: Sendable {
    /// The group's loops, in creation order.
    public let loops: [EventLoop]
    private let cursor = Atomic<Int>(0)
    /// The group's own threads, one per loop; nil for loops driven by another's thread (a
    /// simulation's, `MainspringTesting`), which the group does not run.
    private let threads: ThreadsEnded?
    private let phase = Protected<Phase>(.running)
    private let result = ReportSlot()

    private enum Phase {
        case running
        case shuttingDown
        case done
    }

    /// What a shutdown had to abandon.
    public struct ShutdownReport: Sendable, Equatable, CustomStringConvertible {
        /// Posted work that never ran (also counted in each loop's `droppedAtShutdown`).
        public var droppedWork: Int
        /// Sources still open when the grace period ended (connections, timers, watchers,
        /// listeners, readers), closed without their handlers running.
        public var closedSources: Int
        /// Whether some loop was still busy when the grace period ended.
        public var timedOut: Bool
        /// Loops whose thread did not finish (a handler never returned); normally 0.
        public var stuckLoops: Int
        /// Async tasks that were still suspended on one of the loops' connections, listeners,
        /// readers or signals when the grace period ended: each was resumed with an error
        /// (`Connection.CloseReason.cancelled`, or the end of its sequence) and given up to
        /// 100 ms to unwind on its loop.
        public var cancelledTasks: Int

        public init(droppedWork: Int, closedSources: Int, timedOut: Bool, stuckLoops: Int, cancelledTasks: Int = 0) {
            self.droppedWork = droppedWork
            self.closedSources = closedSources
            self.timedOut = timedOut
            self.stuckLoops = stuckLoops
            self.cancelledTasks = cancelledTasks
        }

        public var description: String {
            "dropped \(droppedWork) work item(s), closed \(closedSources) source(s)"
                + (cancelledTasks > 0 ? ", cancelled \(cancelledTasks) task(s)" : "")
                + (timedOut ? ", grace period ran out" : "") + (stuckLoops > 0 ? ", \(stuckLoops) loop(s) stuck" : "")
        }
    }

    /// Starts `loopCount` loops (default: the number of active cores), each on its own thread,
    /// and returns once every loop is bound to its thread and polling: from then on a
    /// loop-thread-only call made elsewhere fails loudly (`wrongThread`, or a precondition),
    /// whatever the timing. Blocks the caller while the threads start (well under a
    /// millisecond each).
    /// - Throws: `EventLoopError` when a loop cannot be created (out of file descriptors).
    public init(loopCount: Int = ProcessInfo.processInfo.activeProcessorCount,
                configuration: EventLoop.Configuration = .init()) throws(EventLoopError)
    {
        let count = max(1, loopCount)
        var loops: [EventLoop] = []
        for _ in 0..<count {
            loops.append(try EventLoop(configuration: configuration))
        }
        self.loops = loops
        let threads = ThreadsEnded(count: count)
        self.threads = threads
        // Each thread binds its loop before anything else, then the loop's first callback says
        // it polls; `init` returns only after every loop did both. Until a loop is bound, a
        // loop-only call from another thread would bind the loop to *that* thread, and the
        // group's thread would then fail to run it: so no caller can ever see a group loop
        // that is not yet its thread's.
        let started = DispatchSemaphore(value: 0)
        for (index, loop) in loops.enumerated() {
            loop.execute { started.signal() }
            let thread = Thread {
                let bound = loop.claimThread()
                precondition(bound, "Mainspring: group loop \(index) was bound to another thread before its own")
                do {
                    try loop.run()
                } catch {
                    FileHandle.standardError.write(Data("Mainspring: group loop \(index) failed: \(error)\n".utf8))
                }
                loop.releaseThread()
                threads.threadEnded()
            }
            thread.name = "mainspring.group.\(index)"
            thread.start()
        }
        for _ in loops { started.wait() }
    }

    /// A group of simulated loops (`MainspringTesting`): they run on the thread that drives
    /// their simulation, so the group starts no threads; `shutdown` has the simulation run each
    /// loop's shutdown, on virtual time, before it returns its report. Released without a
    /// shutdown, it leaves each loop to shut itself down once released too (see `deinit`).
    @_spi(Simulation)
    public init(simulatedLoops loops: [EventLoop]) {
        precondition(!loops.isEmpty && loops.allSatisfy(\.isSimulated), "a simulated group needs simulated loops")
        self.loops = loops
        self.threads = nil
    }

    /// The next loop, round robin. Any thread.
    public func next() -> EventLoop {
        let index = cursor.wrappingAdd(1, ordering: .relaxed).oldValue
        return loops[index % loops.count]
    }

    /// Shuts the group down gracefully; returns once every loop's thread has ended (or was
    /// found stuck).
    ///
    /// Every loop keeps running until it is quiescent — no ready work, no cross-thread posts
    /// waiting, no open connections or pending one-shot timers (standing sources such as
    /// listeners, fd watchers and repeating timers do not count) — or until `gracePeriod` has
    /// passed: **one deadline for all the loops**. A loop still busy then closes what is left
    /// (handlers do not run); tasks suspended on its connections, listeners, readers or signals
    /// are resumed with an error and get up to 100 ms to unwind (they are counted in
    /// `cancelledTasks`); then it drops and counts the work still queued, and its thread ends.
    /// Stop accepting first (close your `Listener`s), and close idle connections, or the full
    /// grace period is spent waiting for them.
    ///
    /// Quiet is judged loop by loop: a task suspended on one loop while it waits for work on
    /// another (a task group whose children run on the other loops, say) does not keep its own
    /// loop running. If its resumption arrives after that loop has ended, the task still
    /// finishes — on a fallback queue — and the job counts in `droppedWork`.
    ///
    /// Any task, but not one that runs on one of the group's loops (it could never be resumed:
    /// precondition). Concurrent and later calls return the first shutdown's report. A loop
    /// whose thread does not end within 5 s after the deadline (a handler that never returns)
    /// is reported in `stuckLoops`.
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(5)) async -> ShutdownReport {
        requireUsage(!isCallerOnOwnLoop,
                     "Mainspring: EventLoopGroup.shutdown must not be awaited on one of the group's own loops")
        guard let deadline = begin(gracePeriod: gracePeriod) else { return await result.value() }
        guard let threads else { return finishDriven() }
        let ended = await threads.waitAsync(untilMonotonic: deadline &+ Self.stuckAfter)
        return finish(ended: ended)
    }

    /// `shutdown(gracePeriod:)` for a plain thread: blocks the caller until it is done (the
    /// `async` form suspends instead). Call it from a thread outside the group (precondition),
    /// never from a task: it holds a thread of the cooperative pool for up to the grace period.
    @discardableResult
    public func shutdownBlocking(gracePeriod: Duration = .seconds(5)) -> ShutdownReport {
        requireUsage(!isCallerOnOwnLoop,
                     "Mainspring: EventLoopGroup.shutdownBlocking must not be called from one of its own loops")
        guard let deadline = begin(gracePeriod: gracePeriod) else { return result.waitValue() }
        guard let threads else { return finishDriven() }
        let ended = threads.wait(untilMonotonic: deadline &+ Self.stuckAfter)
        return finish(ended: ended)
    }

    /// The old name of ``shutdownBlocking(gracePeriod:)``; in `async` code this spelling is the
    /// suspending ``shutdown(gracePeriod:)``.
    @available(*, deprecated, renamed: "shutdownBlocking(gracePeriod:)")
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(5)) -> ShutdownReport {
        shutdownBlocking(gracePeriod: gracePeriod)
    }

    /// Whether the caller runs on one of the group's loops (for a simulated group, whose loops
    /// all belong to the driving thread: inside one of their dispatches).
    private var isCallerOnOwnLoop: Bool {
        if threads == nil { return loops.contains { $0 === EventLoop.runningLoop.value } }
        return loops.contains { $0.isCurrent }
    }

    /// How long after the deadline (and the unwinding) a loop's thread may take to end before
    /// it counts as stuck.
    private static let stuckAfter: UInt64 = 5_000_000_000 + EventLoop.unwindLimit.clampedNanoseconds

    /// What the loops have reported so far.
    private let partial = Protected(ShutdownReport(droppedWork: 0, closedSources: 0, timedOut: false, stuckLoops: 0))

    /// Starts the shutdown of every loop, with one deadline; nil when another call started it.
    private func begin(gracePeriod: Duration) -> UInt64? {
        let first = phase.withLock { phase -> Bool in
            guard case .running = phase else { return false }
            phase = .shuttingDown
            return true
        }
        guard first else { return nil }
        // On the loops' own clock: virtual for a simulated group (the same as
        // `monotonicNanoseconds()` for a real one).
        let deadline = loops[0].monotonicNow() &+ gracePeriod.clampedNanoseconds
        let partial = self.partial
        for loop in loops {
            loop.execute {
                let outcome = loop.shutDown(deadline: deadline)
                partial.withLock {
                    $0.droppedWork += outcome.droppedWork
                    $0.closedSources += outcome.closedSources
                    $0.cancelledTasks += outcome.cancelledTasks
                    $0.timedOut = $0.timedOut || outcome.timedOut
                }
            }
        }
        return deadline
    }

    /// A simulated group: the simulation runs the loops' shutdowns now, on virtual time (each
    /// loop's grace period jumps ahead as its waits do), then the report is complete.
    /// The shutdown of loops the group does not run: their driver (a simulation) runs each
    /// loop's shutdown now, before the report.
    private func finishDriven() -> ShutdownReport {
        loops[0].simulation?.driveUntilIdle()
        return finish(ended: loops.count)
    }

    private func finish(ended: Int) -> ShutdownReport {
        var report = partial.withLock { $0 }
        report.stuckLoops = loops.count - ended
        phase.withLock { $0 = .done }
        result.publish(report)
        return report
    }

    deinit {
        // Never blocks: a group released without a shutdown ends its loops at once, and their
        // threads end on their own.
        guard phase.withLock({ if case .running = $0 { return true } else { return false } }) else { return }
        // A group of loops it does not run (a simulation's, `MainspringTesting`) posts nothing:
        // its simulation releases it only as it ends itself, so nothing would ever run the
        // posted shutdown, whose closure holds its loop — loop, queue, closure, loop: a cycle
        // that kept each such loop, and through it its whole simulation (clock, network,
        // trace), for ever. Released, each loop shuts itself down in its `deinit`.
        guard threads != nil else { return }
        for loop in loops {
            loop.execute { _ = loop.shutdownNow() }
        }
    }
}

/// Counts the group's threads that have ended; waits for all of them, blocking or async, with
/// a deadline.
private final class ThreadsEnded: Sendable {
    private struct State {
        var ended = 0
        var waiters: [Int: UnsafeContinuation<Int, Never>] = [:]
        var nextWaiter = 0
    }

    private let count: Int
    private let state = Protected(State())
    private let semaphore = DispatchSemaphore(value: 0)

    init(count: Int) { self.count = count }

    func threadEnded() {
        let (ended, waiters) = state.withLock { state -> (Int, [UnsafeContinuation<Int, Never>]) in
            state.ended += 1
            guard state.ended == count else { return (state.ended, []) }
            defer { state.waiters = [:] }
            return (state.ended, Array(state.waiters.values))
        }
        semaphore.signal()
        for waiter in waiters { waiter.resume(returning: ended) }
    }

    /// Blocks until every thread ended or `deadline` (monotonic ns); returns how many ended.
    func wait(untilMonotonic deadline: UInt64) -> Int {
        var waited = 0
        while waited < count {
            // Real time: real threads ending (a simulated group has none: `finishDriven`).
            let now = monotonicNanoseconds()
            let limit = DispatchTime.now() + .nanoseconds(Int(clamping: deadline > now ? deadline - now : 0))
            if semaphore.wait(timeout: limit) == .timedOut { break }
            waited += 1
        }
        return state.withLock { $0.ended }
    }

    /// Suspends until every thread ended or `deadline` (monotonic ns); returns how many ended.
    func waitAsync(untilMonotonic deadline: UInt64) async -> Int {
        await withUnsafeContinuation { continuation in
            let id = state.withLock { state -> Int? in
                if state.ended == count { return nil }
                state.nextWaiter += 1
                state.waiters[state.nextWaiter] = continuation
                return state.nextWaiter
            }
            guard let id else {
                continuation.resume(returning: count)
                return
            }
            let now = monotonicNanoseconds()  // real threads, as in `wait(untilMonotonic:)`
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: deadline > now ? deadline - now : 0))) {
                let (waiter, ended) = self.state.withLock { state in (state.waiters.removeValue(forKey: id), state.ended) }
                waiter?.resume(returning: ended)
            }
        }
    }
}

/// The report of the first shutdown, for the calls that did not start it.
private final class ReportSlot: Sendable {
    private struct State {
        var report: EventLoopGroup.ShutdownReport?
        var waiters: [UnsafeContinuation<EventLoopGroup.ShutdownReport, Never>] = []
        var blocked = 0
    }

    private let state = Protected(State())
    private let semaphore = DispatchSemaphore(value: 0)

    func publish(_ report: EventLoopGroup.ShutdownReport) {
        let (waiters, blocked) = state.withLock { state -> ([UnsafeContinuation<EventLoopGroup.ShutdownReport, Never>], Int) in
            state.report = report
            defer {
                state.waiters = []
                state.blocked = 0
            }
            return (state.waiters, state.blocked)
        }
        for waiter in waiters { waiter.resume(returning: report) }
        for _ in 0..<blocked { semaphore.signal() }
    }

    func value() async -> EventLoopGroup.ShutdownReport {
        await withUnsafeContinuation { continuation in
            let report = state.withLock { state -> EventLoopGroup.ShutdownReport? in
                if state.report == nil { state.waiters.append(continuation) }
                return state.report
            }
            if let report { continuation.resume(returning: report) }
        }
    }

    func waitValue() -> EventLoopGroup.ShutdownReport {
        while true {
            let report = state.withLock { state -> EventLoopGroup.ShutdownReport? in
                if state.report == nil { state.blocked += 1 }
                return state.report
            }
            if let report { return report }
            semaphore.wait()
        }
    }
}
