import Foundation
import Observation
import Synchronization
import MainspringCore

/// The progress of a `TrackedOperationQueue` as an `Observable` model: how Swift on Linux
/// observes what Darwin code observes with KVO (`operationCount`).
///
/// ```swift
/// let queue = TrackedOperationQueue()
/// let activity = QueueActivity(of: queue, on: loop)
/// withObservationTracking { _ = activity.drainCount } onChange: { print("drained") }
/// ```
///
/// It counts every operation and barrier block added to the queue, with any of its add methods
/// (see `TrackedOperationQueue` for what counts). Its values change
/// only on `loop`'s thread, inside a posted refresh, so observers (`withObservationTracking`'s
/// `onChange`, `Observations`) are told on that thread. Refreshes coalesce: after a burst of
/// finishes one refresh reads the latest counts, so `operationCount` may skip values — and may
/// even skip a 0 when new work arrives at once — but `drainCount` counts every drain, so watch
/// it to miss none (or use `TrackedOperationQueue.onDrained(on:_:)`).
///
/// The model is `Sendable`: its properties can be read on any thread (each read takes a mutex).
/// That is why it conforms to `Observable` by hand (an `ObservationRegistrar` and
/// `access`/`withMutation` calls, as the `@Observable` macro would write) instead of using the
/// macro, whose stored properties could not be shared between threads. It stops updating when
/// released. Cost: at most one posted refresh per loop turn while the queue is busy.
public final class QueueActivity: Observable, Sendable {
    /// Operations and barrier blocks added and not finished yet. Unlike Foundation's
    /// `operationCount` it includes barrier blocks.
    public var operationCount: Int {
        registrar.access(self, keyPath: \.operationCount)
        return counts.withLock { $0.pending }
    }

    /// Operations and barrier blocks finished so far (operations completed or cancelled).
    public var finishedCount: Int {
        registrar.access(self, keyPath: \.finishedCount)
        return counts.withLock { $0.finished }
    }

    /// How many times the queue drained (`operationCount` fell to 0 after work was added).
    public var drainCount: Int {
        registrar.access(self, keyPath: \.drainCount)
        return counts.withLock { $0.drains }
    }

    /// Whether no operation or barrier block is in flight (`operationCount == 0`).
    public var isDrained: Bool { operationCount == 0 }

    /// The loop whose thread updates the model.
    public let loop: EventLoop
    private let tracker: QueueTracker
    private let registrar = ObservationRegistrar()
    private let counts: Protected<QueueTracker.Snapshot>
    private let listener = Atomic<UInt64>(0)

    /// Starts watching `queue` (its counts cover all the work added since the queue was
    /// created). Any thread; updates then arrive on `loop`.
    public convenience init(of queue: TrackedOperationQueue, on loop: EventLoop = .main) {
        self.init(tracker: queue.tracker, on: loop)
    }

    private init(tracker: QueueTracker, on loop: EventLoop) {
        self.loop = loop
        self.tracker = tracker
        counts = Protected(tracker.snapshot)
        let id = tracker.addListener(on: loop) { [weak self] in
            guard let self else { return }
            apply(tracker.snapshot(forListener: listener.load(ordering: .acquiring)))
        }
        listener.store(id, ordering: .releasing)
        // A change between the snapshot above and the registration was not posted: post once.
        loop.execute { [weak self] in
            guard let self else { return }
            apply(tracker.snapshot(forListener: id))
        }
    }

    /// Watches any queue's counted work. Deprecated for a plain `OperationQueue`: only work
    /// added there with `addTrackedOperation(s)` is counted, so the model could stay at 0 while
    /// Foundation's own adds run. Make the queue a `TrackedOperationQueue`.
    @available(*, deprecated, message: "a plain OperationQueue cannot see the operations added with its own addOperation(_:); make the queue a TrackedOperationQueue, which counts every add")
    public convenience init(of queue: OperationQueue, on loop: EventLoop = .main) {
        self.init(tracker: queue.drainTracker, on: loop)
    }

    deinit {
        tracker.removeListener(listener.load(ordering: .acquiring))
    }

    /// Publishes new counts, property by property, on the loop's thread.
    private func apply(_ new: QueueTracker.Snapshot) {
        let old = counts.withLock { $0 }
        if old.pending != new.pending {
            registrar.withMutation(of: self, keyPath: \.operationCount) { counts.withLock { $0.pending = new.pending } }
        }
        if old.finished != new.finished {
            registrar.withMutation(of: self, keyPath: \.finishedCount) { counts.withLock { $0.finished = new.finished } }
        }
        if old.drains != new.drains {
            registrar.withMutation(of: self, keyPath: \.drainCount) { counts.withLock { $0.drains = new.drains } }
        }
    }
}
