/// Work posted from another thread, waiting for the loop to take it.
struct RemoteItem {
    /// Moved out (leaving nil) when the loop takes it, so a closure (and what it captures) is
    /// released as soon as it has run, not when the batch is refilled.
    var work: (@Sendable () -> Void)?
    /// When it was posted (the loop's `FastClock`), or 0: not read for this item (see
    /// `RemoteQueue.stampInterval`), or metrics are off.
    var stamp: UInt64
}

/// The multi-producer side of a loop, one array per priority. Guarded by the loop's mutex.
///
/// **Stamps.** A post's queue wait is counted from a clock reading taken as it is queued, but
/// the clock is read only for the first post into an empty array and then for every
/// `stampInterval`-th: a reading for every post (10–20 ns on the machines measured) cost a
/// thread posting in a tight loop about a third of its throughput (`mainspring-bench
/// post-remote`). A post in between is counted from the last reading before it: its wait is
/// over-reported by the time between that reading and its own post (microseconds in a flood),
/// and never under-reported.
struct RemoteQueue {
    /// Posts per clock reading (a power of two).
    static let stampInterval = 32

    /// What the loop is to the producers.
    enum Phase: Equatable {
        /// Running, or about to look at the queue: a post needs no wake-up.
        case awake
        /// The loop saw the queue empty and sleeps (or is about to) in epoll: the producer that
        /// posts first writes the eventfd and makes it awake, so the fd is written at most once
        /// per sleep.
        case sleeping
        /// Shut down: posts are counted as dropped instead of queued, for good.
        case closed
    }

    var items = PerPriority<[RemoteItem]>(repeating: [])
    private(set) var phase: Phase = .awake
    private(set) var droppedWhileClosed = 0

    var isEmpty: Bool { items.input.isEmpty && items.normal.isEmpty && items.background.isEmpty }
    var count: Int { items.input.count + items.normal.count + items.background.count }

    /// What a post did.
    enum PostOutcome: Equatable {
        /// Queued; the producer must write the eventfd when `wake` (the loop slept).
        case queued(wake: Bool)
        /// The loop is shut down: counted as dropped (the producer releases the work after
        /// the lock).
        case dropped
    }

    /// A producer posts `item` (moved out of it when queued).
    @inline(__always)
    mutating func post<Clock: SchedulerClock>(_ item: inout RemoteItem?, _ priority: Priority, clock: Clock?) -> PostOutcome {
        switch phase {
        case .closed:
            droppedWhileClosed += 1
            return .dropped
        case .awake:
            if let moved = item.take() { append(moved, priority, clock: clock) }
            return .queued(wake: false)
        case .sleeping:
            if let moved = item.take() { append(moved, priority, clock: clock) }
            phase = .awake
            return .queued(wake: true)
        }
    }

    /// The loop, with nothing else to do, is about to sleep: it does unless posts are waiting
    /// (which it then takes). Returns whether it may sleep.
    mutating func sleepIfEmpty() -> Bool {
        guard phase != .closed else { return true }
        if isEmpty {
            phase = .sleeping
            return true
        }
        phase = .awake
        return false
    }

    /// The loop is awake (it polled, or is about to take the posts).
    mutating func wake() {
        if phase == .sleeping { phase = .awake }
    }

    /// The loop shuts down: what was queued is returned (to be dropped and counted after the
    /// lock), and later posts are counted as dropped.
    mutating func close() -> RemoteQueue {
        let waiting = self
        var closed = RemoteQueue()
        closed.phase = .closed
        closed.droppedWhileClosed = droppedWhileClosed
        self = closed
        return waiting
    }

    /// Queues `item`, stamped with `clock` when it is the first of its array or a multiple of
    /// `stampInterval` after it (`clock` nil: metrics are off, no stamps).
    @inline(__always)
    mutating func append<Clock: SchedulerClock>(_ item: consuming RemoteItem, _ priority: Priority, clock: Clock?) {
        // (A switch, not `items[priority]`: the subscript's modify accessor is a call per post.)
        switch priority {
        case .input:
            item.stamp = Self.stamp(at: items.input.count, clock)
            items.input.append(item)
        case .normal:
            item.stamp = Self.stamp(at: items.normal.count, clock)
            items.normal.append(item)
        case .background:
            item.stamp = Self.stamp(at: items.background.count, clock)
            items.background.append(item)
        }
    }

    @inline(__always)
    private static func stamp<Clock: SchedulerClock>(at index: Int, _ clock: Clock?) -> UInt64 {
        guard let clock, index & (stampInterval - 1) == 0 else { return 0 }
        return clock.now()
    }
}

/// The loop's side of one priority's cross-thread posts: the batch last taken from the queue,
/// consumed in place (no copy into the ring). Its array and the queue's are swapped on refill,
/// so both keep their capacity: no allocation in the steady state.
struct RemoteBatch {
    private var items: [RemoteItem] = []
    private var next = 0
    /// The stamp of items posted without one: that of the last stamped item before them (see
    /// `RemoteQueue`), or when the batch was taken if there is none (metrics off).
    private var lastStamp: UInt64 = 0

    var isEmpty: Bool { next == items.count }
    var remaining: Int { items.count - next }

    var firstStamp: UInt64? {
        guard next < items.count else { return nil }
        let stamp = items[next].stamp
        return stamp == 0 ? lastStamp : stamp
    }

    @inline(__always)
    mutating func popFirst() -> ReadyRecord {
        let stamp = items[next].stamp
        if stamp != 0 { lastStamp = stamp }
        // Moved out: no retain here, and no release when the batch is refilled.
        guard let work = items[next].work.take() else { preconditionFailure("Mainspring: a remote item taken twice") }
        next &+= 1
        return ReadyRecord(work: work, stamp: lastStamp)
    }

    /// Takes the queue's items if this batch is used up. Returns how many it took.
    mutating func refill(from queue: inout [RemoteItem], at now: UInt64) -> Int {
        guard next == items.count, !queue.isEmpty else { return 0 }
        items.removeAll(keepingCapacity: true)
        next = 0
        lastStamp = now
        swap(&items, &queue)
        return items.count
    }
}
