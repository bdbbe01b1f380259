import Foundation
import Synchronization

/// N loops on N threads of their own: spread connections and work over the cores.
///
/// The loops run from creation until `shutdown(gracePeriod:)`. Reach them with `next()` (round
/// robin) or `loops`, and post to them with `execute`; loop-thread-only calls (timers, sources)
/// must be made from inside such posts.
public final class EventLoopGroup: Sendable {
    /// The group's loops, in creation order.
    public let loops: [EventLoop]
    private let cursor = Atomic<Int>(0)
    private let finished: [DispatchSemaphore]
    private let outcome = Protected<ShutdownReport?>(nil)

    /// What a shutdown had to abandon.
    public struct ShutdownReport: Sendable, Equatable, CustomStringConvertible {
        /// Posted work that never ran (also counted in each loop's `droppedAtShutdown`).
        public var droppedWork: Int
        /// Sources still open when the grace period ended (connections, timers, watchers),
        /// closed without their handlers running.
        public var closedSources: Int
        /// Whether some loop was still busy when the grace period ended.
        public var timedOut: Bool
        /// Loops whose thread did not finish (a handler never returned); normally 0.
        public var stuckLoops: Int

        public var description: String {
            "dropped \(droppedWork) work item(s), closed \(closedSources) source(s)"
                + (timedOut ? ", grace period ran out" : "") + (stuckLoops > 0 ? ", \(stuckLoops) loop(s) stuck" : "")
        }
    }

    /// Starts `loopCount` loops (default: the number of active cores), each on its own thread.
    /// - Throws: `EventLoopError` when a loop cannot be created (out of file descriptors).
    public init(loopCount: Int = ProcessInfo.processInfo.activeProcessorCount,
                configuration: EventLoop.Configuration = .init()) throws(EventLoopError)
    {
        let count = max(1, loopCount)
        var loops: [EventLoop] = []
        var finished: [DispatchSemaphore] = []
        for _ in 0..<count {
            loops.append(try EventLoop(configuration: configuration))
            finished.append(DispatchSemaphore(value: 0))
        }
        self.loops = loops
        self.finished = finished
        for (index, loop) in loops.enumerated() {
            let done = finished[index]
            let thread = Thread {
                do {
                    try loop.run()
                } catch {
                    FileHandle.standardError.write(Data("Mainspring: group loop \(index) failed: \(error)\n".utf8))
                }
                loop.releaseThread()
                done.signal()
            }
            thread.name = "mainspring.group.\(index)"
            thread.start()
        }
    }

    /// The next loop, round robin. Any thread.
    public func next() -> EventLoop {
        let index = cursor.wrappingAdd(1, ordering: .relaxed).oldValue
        return loops[index % loops.count]
    }

    /// Shuts the group down gracefully and waits for its threads.
    ///
    /// Every loop keeps running until it is quiescent — no ready work, no cross-thread posts
    /// waiting, no open connections or pending one-shot timers (standing sources such as
    /// listeners, fd watchers and repeating timers do not count) — or until `gracePeriod` has
    /// passed. Then it closes what is left, counts the work it drops, and its thread ends.
    /// Stop accepting first (close your `Listener`s), and close idle connections, or the full
    /// grace period is spent waiting for them.
    ///
    /// Call it from a thread outside the group (precondition). Calling it again returns the
    /// first report.
    /// - Returns: what had to be abandoned.
    @discardableResult
    public func shutdown(gracePeriod: Duration = .seconds(5)) -> ShutdownReport {
        precondition(!loops.contains { $0.isCurrent }, "Mainspring: EventLoopGroup.shutdown must not be called from one of its own loops")
        if let report = outcome.withLock({ $0 }) { return report }
        let deadline = monotonicNanoseconds() &+ gracePeriod.clampedNanoseconds
        let partial = Protected(ShutdownReport(droppedWork: 0, closedSources: 0, timedOut: false, stuckLoops: 0))
        for loop in loops {
            loop.execute {
                let now = monotonicNanoseconds()
                let quiet = loop.spin(until: { loop.isQuiescent },
                                      timeout: .nanoseconds(Int64(clamping: deadline > now ? deadline - now : 0)))
                let (dropped, closed) = loop.shutdownNow()
                partial.withLock {
                    $0.droppedWork += dropped
                    $0.closedSources += closed
                    $0.timedOut = $0.timedOut || !quiet
                }
            }
        }
        // A loop that never gets to the posted closure (a handler that never returns) is stuck.
        var stuck = 0
        for done in finished {
            let limit = DispatchTime.now() + .nanoseconds(Int(clamping: gracePeriod.clampedNanoseconds)) + .seconds(5)
            if done.wait(timeout: limit) == .timedOut { stuck += 1 }
        }
        var report = partial.withLock { $0 }
        report.stuckLoops = stuck
        outcome.withLock { $0 = report }
        return report
    }

    deinit {
        if outcome.withLock({ $0 }) == nil {
            shutdown(gracePeriod: .zero)
        }
    }
}
