import Foundation
import Observation

/// The progress of a queue's tracked operations as an `@Observable` model bound to a loop: how
/// Swift on Linux observes what the article observed with KVO (`operationCount`).
///
/// ```swift
/// let activity = QueueActivity(of: queue, on: loop)
/// withObservationTracking { _ = activity.drainCount } onChange: { print("drained") }
/// ```
///
/// It counts the operations added with `addTrackedOperations(_:)` (see there). Its properties
/// change only on `loop`'s thread, inside a posted refresh, so observers (`withObservationTracking`,
/// `Observations`, UI bindings) hear about changes on that thread. Refreshes coalesce: after a
/// burst of finishes one refresh reads the latest counts, so `operationCount` may skip values —
/// and may even skip a 0 when new work arrives at once — but `drainCount` counts every drain, so
/// watch it to miss none (or use `OperationQueue.onDrained(on:_:)`).
///
/// Loop-bound: create it and read it on `loop`'s thread. It stops updating when released.
/// Cost: at most one posted refresh per loop turn while the queue is busy.
@Observable
public final class QueueActivity {
    /// Tracked operations added and not finished yet.
    public private(set) var operationCount: Int
    /// Tracked operations finished so far (completed or cancelled).
    public private(set) var finishedCount: Int
    /// How many times the tracked operations all finished (the count fell to 0 after work was
    /// added).
    public private(set) var drainCount: Int

    /// Whether no tracked operation is in flight.
    public var isDrained: Bool { operationCount == 0 }

    /// The loop whose thread updates the model.
    @ObservationIgnored public let loop: EventLoop
    @ObservationIgnored private let tracker: QueueTracker
    @ObservationIgnored private var listener: UInt64 = 0

    /// Starts watching `queue`'s tracked operations (counting from whenever its first tracked
    /// operation was added). Loop thread only (precondition).
    public init(of queue: OperationQueue, on loop: EventLoop = .main) {
        loop.preconditionOnLoop("QueueActivity.init(of:on:)")
        self.loop = loop
        let tracker = QueueTracker.of(queue)
        self.tracker = tracker
        let counts = tracker.snapshot
        operationCount = counts.pending
        finishedCount = counts.finished
        drainCount = counts.drains
        let reference = ActivityReference(self)
        listener = tracker.addListener(on: loop) { [tracker] in
            guard let activity = reference.activity else { return }
            activity.apply(tracker.snapshot(forListener: activity.listener))
        }
        // A change between the snapshot above and the registration would be lost: read again.
        apply(tracker.snapshot(forListener: listener))
    }

    deinit {
        tracker.removeListener(listener)
    }

    private func apply(_ counts: QueueTracker.Snapshot) {
        if operationCount != counts.pending { operationCount = counts.pending }
        if finishedCount != counts.finished { finishedCount = counts.finished }
        if drainCount != counts.drains { drainCount = counts.drains }
    }
}

@available(*, unavailable)
extension QueueActivity: Sendable {}

/// Lets a refresh posted to the loop find its model without keeping it alive. Only read on the
/// model's loop thread.
private final class ActivityReference: @unchecked Sendable {
    weak var activity: QueueActivity?
    init(_ activity: QueueActivity) { self.activity = activity }
}
