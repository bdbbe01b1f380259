import Foundation
import Synchronization
import MainspringCore

/// The count behind `TrackedOperationQueue.onDrained(on:_:)` and `QueueActivity`: how many of one
/// queue's operations and barrier blocks are unfinished, and who wants to hear when that changes.
///
/// ## Why a count of our own
/// Observing `operationCount` with KVO is how Darwin code learns that a queue drained.
/// swift-corelibs-foundation has no KVO and no hook at all when an operation is added or removed
/// (`operationCount` is computed by walking the queue's list under its lock). So
/// `TrackedOperationQueue` counts the work as it goes in — each of its add methods adds the
/// number *before* handing the work to Foundation — and as it comes out: a finish observer on each
/// operation (see `observeFinish`; for an `AsyncOperation` a callback from the thread that
/// finishes it, after Foundation has taken it off the queue; for any other operation a dependent
/// hook operation), and the end of each barrier block.
///
/// ## Why a drain is reported exactly once
/// The count lives under one mutex. Every finish decrements it once (each observer runs once:
/// the operation's state word, or Foundation's dependency release, guarantees it; and an
/// operation is counted at most once while it is unfinished, however Foundation's add methods
/// call each other), and the one decrement that takes it from 1 to 0 — there is exactly one per
/// drain, whatever the threads — collects the hooks while still holding the lock and posts them
/// after releasing it. Adding the count before the work can run means a batch cannot drain before
/// it was all added, and an operation that adds more work from its `main()` keeps the queue from
/// draining until that work is done too. No user code runs under the lock.
final class QueueTracker: Sendable {
    struct Snapshot: Sendable, Equatable {
        /// Operations and barrier blocks added and not finished yet.
        var pending = 0
        /// Operations and barrier blocks finished so far.
        var finished = 0
        /// How many times `pending` fell to 0.
        var drains = 0
    }

    private struct Hook {
        let id: UInt64
        let loop: EventLoop
        /// The handle's flag, not the handle: the handle holds the tracker, so holding the handle
        /// here would make a cycle that keeps both alive once the queue and the handle are gone.
        let cancelled: SharedFlag
        let body: @Sendable () -> Void
    }

    private struct Listener {
        let loop: EventLoop
        let refresh: @Sendable () -> Void
        /// Whether a refresh is posted and has not read the snapshot yet (updates coalesce).
        var isPosted = false
    }

    private struct State {
        var counts = Snapshot()
        /// The operations counted and not finished yet. An identifier cannot be reused while it
        /// is here: the operation is alive until its finish observer has run (`observeFinish`).
        var unfinished: Set<ObjectIdentifier> = []
        var nextID: UInt64 = 0
        var hooks: [Hook] = []
        var listeners: [UInt64: Listener] = [:]

        mutating func makeID() -> UInt64 {
            nextID &+= 1
            return nextID
        }

        /// Marks every listener without a pending refresh as posted; returns those to post.
        mutating func listenersToNotify() -> [(EventLoop, @Sendable () -> Void)] {
            var toPost: [(EventLoop, @Sendable () -> Void)] = []
            for (id, listener) in listeners where !listener.isPosted {
                listeners[id]?.isPosted = true
                toPost.append((listener.loop, listener.refresh))
            }
            return toPost
        }
    }

    private let state = Protected(State())

    // MARK: Counting

    /// Counts those of `operations` that are not counted yet (an operation already counted and
    /// unfinished is not counted again) and returns them: the caller observes their finishing.
    func willAdd(_ operations: [Operation]) -> [Operation] {
        let (added, toNotify) = state.withLock { state -> ([Operation], [(EventLoop, @Sendable () -> Void)]) in
            let added = operations.filter { state.unfinished.insert(ObjectIdentifier($0)).inserted }
            guard !added.isEmpty else { return ([], []) }
            state.counts.pending += added.count
            return (added, state.listenersToNotify())
        }
        for (loop, refresh) in toNotify { loop.execute(refresh) }
        return added
    }

    /// Counts one barrier block that is about to be added.
    func willAddBarrier() {
        let toNotify = state.withLock { state -> [(EventLoop, @Sendable () -> Void)] in
            state.counts.pending += 1
            return state.listenersToNotify()
        }
        for (loop, refresh) in toNotify { loop.execute(refresh) }
    }

    /// Counts one counted operation (`operation`, from `willAdd`) or barrier block (`nil`) as
    /// finished; on the last one, posts every drained hook.
    func didFinish(_ operation: ObjectIdentifier?) {
        let (hooks, toNotify) = state.withLock { state -> ([Hook], [(EventLoop, @Sendable () -> Void)]) in
            if let operation {
                let wasCounted = state.unfinished.remove(operation) != nil
                requireUsage(wasCounted, "Mainspring: a tracked operation finished twice")
            }
            state.counts.pending -= 1
            state.counts.finished += 1
            requireUsage(state.counts.pending >= 0, "Mainspring: a tracked operation finished twice")
            var hooks: [Hook] = []
            if state.counts.pending == 0 {
                state.counts.drains += 1
                hooks = state.hooks
            }
            return (hooks, state.listenersToNotify())
        }
        for hook in hooks {
            let cancelled = hook.cancelled
            let body = hook.body
            hook.loop.execute {
                if !cancelled.isSet { body() }
            }
        }
        for (loop, refresh) in toNotify { loop.execute(refresh) }
    }

    var snapshot: Snapshot { state.withLock { $0.counts } }

    // MARK: Hooks and listeners

    func addHook(on loop: EventLoop, _ body: @escaping @Sendable () -> Void) -> DrainHook {
        state.withLock { state in
            let id = state.makeID()
            let handle = DrainHook(tracker: self, id: id)
            state.hooks.append(Hook(id: id, loop: loop, cancelled: handle.cancelled, body: body))
            return handle
        }
    }

    func removeHook(_ id: UInt64) {
        // The removed hook (and its closure) is released after the lock.
        let removed = state.withLock { state -> [Hook] in
            let removed = state.hooks.filter { $0.id == id }
            state.hooks.removeAll { $0.id == id }
            return removed
        }
        _ = removed
    }

    /// Registers `refresh`, posted to `loop` (coalesced) whenever the counts change.
    func addListener(on loop: EventLoop, _ refresh: @escaping @Sendable () -> Void) -> UInt64 {
        state.withLock { state in
            let id = state.makeID()
            state.listeners[id] = Listener(loop: loop, refresh: refresh)
            return id
        }
    }

    func removeListener(_ id: UInt64) {
        let removed = state.withLock { $0.listeners.removeValue(forKey: id) }
        _ = removed
    }

    /// The counts, for a listener's refresh: later changes will post it again.
    func snapshot(forListener id: UInt64) -> Snapshot {
        state.withLock { state in
            state.listeners[id]?.isPosted = false
            return state.counts
        }
    }
}

extension QueueTracker {
    /// Counts those of `operations` not counted yet and observes their finishing. Call before
    /// handing them to Foundation, so that none can finish uncounted.
    func track(_ operations: [Operation]) {
        for operation in willAdd(operations) {
            let id = ObjectIdentifier(operation)
            observeFinish(of: operation, .afterAnnouncement) { [self] in didFinish(id) }
        }
    }

    private struct Entry {
        weak var queue: OperationQueue?
        let tracker: QueueTracker
    }

    private struct Registry {
        var entries: [ObjectIdentifier: Entry] = [:]
        /// Dead queues' entries are swept when the table reaches this size (then it doubles).
        var sweepAt = 64
    }

    private static let registry = Protected(Registry())

    /// The tracker of a plain `OperationQueue` (the deprecated hooks on one), made on first use:
    /// a global table keyed by the queue's identity with a weak reference to it (Foundation on
    /// Linux has no associated objects); an entry whose queue died is replaced, and dead entries
    /// are swept as the table grows.
    static func ofPlainQueue(_ queue: OperationQueue) -> QueueTracker {
        registry.withLock { registry in
            let key = ObjectIdentifier(queue)
            if let entry = registry.entries[key], entry.queue === queue { return entry.tracker }
            if registry.entries.count >= registry.sweepAt {
                registry.entries = registry.entries.filter { $0.value.queue != nil }
                registry.sweepAt = max(64, registry.entries.count * 2)
            }
            let tracker = QueueTracker()
            registry.entries[key] = Entry(queue: queue, tracker: tracker)
            return tracker
        }
    }
}

/// The handle `TrackedOperationQueue.onDrained(on:_:)` returns: `cancel()` removes the hook.
/// Dropping the handle does not remove it.
public final class DrainHook: Cancellable, Sendable {
    private let tracker: QueueTracker
    private let id: UInt64
    let cancelled = SharedFlag()

    init(tracker: QueueTracker, id: UInt64) {
        self.tracker = tracker
        self.id = id
    }

    /// Removes the hook. Any thread; idempotent. Once it returns, the hook is not started again
    /// (a run already posted to the loop checks this first); a run already in progress on the
    /// loop's thread finishes.
    public func cancel() {
        if cancelled.set() {
            tracker.removeHook(id)
        }
    }

    /// Whether `cancel()` was called.
    public var isCancelled: Bool { cancelled.isSet }
}

/// A flag one thread sets and others read (a drain hook's cancelled flag, shared by its handle
/// and the tracker's record of it; a spin's condition).
final class SharedFlag: Sendable {
    private let value = Atomic<Bool>(false)

    /// Whether the flag is set.
    var isSet: Bool { value.load(ordering: .acquiring) }

    /// Sets the flag; returns whether this call set it (false when it was set already).
    @discardableResult
    func set() -> Bool { !value.exchange(true, ordering: .acquiringAndReleasing) }
}
