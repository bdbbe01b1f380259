/// Work posted from another thread, waiting for the loop to take it.
struct RemoteItem {
    /// Moved out (leaving nil) when the loop takes it, so a closure (and what it captures) is
    /// released as soon as it has run, not when the batch is refilled.
    var work: (@Sendable () -> Void)?
    /// When it was posted (the loop's `FastClock`), or 0 when metrics are off.
    let stamp: UInt64
}

/// The multi-producer side of a loop, one array per priority. Guarded by the loop's mutex.
struct RemoteQueue {
    var items = PerPriority<[RemoteItem]>(repeating: [])
    /// Set by the loop just before it sleeps with an empty queue; the producer that clears it
    /// writes the eventfd. So the fd is written at most once per sleep.
    var isSleeping = false
    /// Set at shutdown: posts are counted here instead of queued.
    var isClosed = false
    var droppedWhileClosed = 0

    var isEmpty: Bool { items.input.isEmpty && items.normal.isEmpty && items.background.isEmpty }
    var count: Int { items.input.count + items.normal.count + items.background.count }

    @inline(__always)
    mutating func append(_ item: consuming RemoteItem, _ priority: Priority) {
        // (A switch, not `items[priority]`: the subscript's modify accessor is a call per post.)
        switch priority {
        case .input: items.input.append(item)
        case .normal: items.normal.append(item)
        case .background: items.background.append(item)
        }
    }
}

/// The loop's side of one priority's cross-thread posts: the batch last taken from the queue,
/// consumed in place (no copy into the ring). Its array and the queue's are swapped on refill,
/// so both keep their capacity: no allocation in the steady state.
struct RemoteBatch {
    private var items: [RemoteItem] = []
    private var next = 0
    /// When the batch was taken: the stamp of items posted without one.
    private var takenAt: UInt64 = 0

    var isEmpty: Bool { next == items.count }
    var remaining: Int { items.count - next }

    var firstStamp: UInt64? {
        guard next < items.count else { return nil }
        let stamp = items[next].stamp
        return stamp == 0 ? takenAt : stamp
    }

    @inline(__always)
    mutating func popFirst() -> ReadyRecord {
        let stamp = items[next].stamp
        // Moved out: no retain here, and no release when the batch is refilled.
        guard let work = items[next].work.take() else { preconditionFailure("Mainspring: a remote item taken twice") }
        next &+= 1
        return ReadyRecord(work: work, stamp: stamp == 0 ? takenAt : stamp)
    }

    /// Takes the queue's items if this batch is used up. Returns how many it took.
    mutating func refill(from queue: inout [RemoteItem], at now: UInt64) -> Int {
        guard next == items.count, !queue.isEmpty else { return 0 }
        items.removeAll(keepingCapacity: true)
        next = 0
        takenAt = now
        swap(&items, &queue)
        return items.count
    }
}
