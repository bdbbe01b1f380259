/// A growable FIFO ring buffer: amortised O(1) append and removeFirst, no allocation once warm.
/// Not thread-safe: each loop's ready queues are touched only on the loop's thread.
struct RingBuffer<Element> {
    private var storage: ContiguousArray<Element?>
    private var head = 0
    private(set) var count = 0

    init(capacity: Int = 16) {
        var size = 1
        while size < capacity { size <<= 1 }
        storage = ContiguousArray(repeating: nil, count: size)
    }

    var isEmpty: Bool { count == 0 }

    @inline(__always)
    mutating func append(_ element: consuming Element) {
        if count == storage.count { grow() }
        storage[(head &+ count) & (storage.count &- 1)] = element
        count &+= 1
    }

    @inline(__always)
    mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = storage[head].take()
        head = (head &+ 1) & (storage.count &- 1)
        count &-= 1
        return element
    }

    /// Removes every element, keeping the capacity, and returns how many there were.
    @discardableResult
    mutating func removeAll() -> Int {
        let removed = count
        while popFirst() != nil {}
        head = 0
        return removed
    }

    private mutating func grow() {
        var bigger = ContiguousArray<Element?>(repeating: nil, count: storage.count * 2)
        for i in 0..<count { bigger[i] = storage[(head + i) & (storage.count - 1)].take() }
        storage = bigger
        head = 0
    }
}

extension RingBuffer where Element == ReadyRecord {
    /// The stamp of the first record, read in place (no copy, so no retain/release).
    @inline(__always)
    var firstStamp: UInt64? { count == 0 ? nil : storage[head]?.stamp }
}
