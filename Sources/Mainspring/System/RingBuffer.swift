/// A growable FIFO ring of elements in raw memory: amortised O(1) `append` and `popFirst`, no
/// allocation once warm.
///
/// Why raw memory (and so a class in System/): elements are *moved* in and out — `append`
/// initialises a slot from the consumed element, `popFirst` moves it out — so a queued closure
/// costs no reference-count operation on its way through, and there is no copy-on-write
/// uniqueness check per append (the ring is never shared). A `ContiguousArray<Element?>` version
/// cost one retain/release pair and a uniqueness check per element.
///
/// Not thread-safe: each loop's ready queues are touched only on the loop's thread.
final class RingBuffer<Element> {
    private var slots: UnsafeMutablePointer<Element>
    /// A power of two.
    private var capacity: Int
    private var head = 0
    private(set) var count = 0

    init(capacity: Int = 16) {
        var size = 1
        while size < capacity { size <<= 1 }
        self.capacity = size
        slots = .allocate(capacity: size)
    }

    deinit {
        removeAll()
        slots.deallocate()
    }

    var isEmpty: Bool { count == 0 }

    /// Appends `element` (moved into its slot).
    @inline(__always)
    func append(_ element: consuming Element) {
        if count == capacity { grow() }
        (slots + ((head &+ count) & (capacity &- 1))).initialize(to: element)
        count &+= 1
    }

    /// Removes and returns the first element (moved out of its slot).
    @inline(__always)
    func popFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = (slots + head).move()
        head = (head &+ 1) & (capacity &- 1)
        count &-= 1
        return element
    }

    /// A value read from the first element in place (no copy of the element), or nil when empty.
    @inline(__always)
    func peekFirst<Value>(_ read: (borrowing Element) -> Value) -> Value? {
        count == 0 ? nil : read(slots[head])
    }

    /// Removes every element, keeping the capacity, and returns how many there were.
    @discardableResult
    func removeAll() -> Int {
        let removed = count
        while count > 0 {
            (slots + head).deinitialize(count: 1)
            head = (head &+ 1) & (capacity &- 1)
            count &-= 1
        }
        head = 0
        return removed
    }

    private func grow() {
        let bigger = UnsafeMutablePointer<Element>.allocate(capacity: capacity * 2)
        for i in 0..<count {
            (bigger + i).moveInitialize(from: slots + ((head + i) & (capacity - 1)), count: 1)
        }
        slots.deallocate()
        slots = bigger
        capacity *= 2
        head = 0
    }
}
