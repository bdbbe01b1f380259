/// An element of a ``MinHeap``: how two compare, and — for a heap whose elements must be found
/// again (a timer that is re-armed or cancelled) — where each one moved.
package protocol MinHeapElement {
    /// Whether this element comes out of the heap before `other`. A strict order: equal keys
    /// must be told apart (by a sequence number) for a stable order.
    func precedes(_ other: Self) -> Bool
    /// Called with the element's new place whenever it moves, and with -1 when it leaves the
    /// heap. A heap that is never searched leaves it empty (inlined away).
    func movedTo(index: Int)
}

extension MinHeapElement {
    @inlinable @inline(__always)
    package func movedTo(index: Int) {}
}

/// The library's one binary min-heap: a loop's timers (`TimerQueue`) and a simulated
/// network's events (`MainspringTesting`) are kept in it. Insert, remove the first and remove
/// or re-key any element by its place are O(log n), with no allocation once the storage has
/// grown; each move is reported to the element (``MinHeapElement/movedTo(index:)``), so an
/// element can keep its place for removal without a search.
package struct MinHeap<Element: MinHeapElement> {
    @usableFromInline var items: [Element] = []

    @inlinable package init() {}

    /// The element that comes out first, if any.
    @inlinable package var first: Element? { items.first }
    /// The number of elements.
    @inlinable package var count: Int { items.count }
    @inlinable package var isEmpty: Bool { items.isEmpty }

    /// The element at `index` (a place reported by `movedTo`).
    @inlinable package subscript(index: Int) -> Element { items[index] }

    @inlinable
    package mutating func insert(_ element: Element) {
        items.append(element)
        siftUp(items.count - 1)
    }

    /// Removes and returns the first element. The heap must not be empty.
    @inlinable @discardableResult
    package mutating func removeFirst() -> Element { remove(at: 0) }

    /// Removes and returns the element at `index`.
    @inlinable @discardableResult
    package mutating func remove(at index: Int) -> Element {
        let removed = items[index]
        removed.movedTo(index: -1)
        let last = items.removeLast()
        if index < items.count {
            items[index] = last
            if index > 0 && last.precedes(items[(index - 1) / 2]) { siftUp(index) } else { siftDown(index) }
        }
        return removed
    }

    /// Changes the element at `index` (its key, most likely) and moves it to its new place.
    @inlinable
    package mutating func update(at index: Int, _ change: (inout Element) -> Void) {
        change(&items[index])
        if index > 0 && items[index].precedes(items[(index - 1) / 2]) { siftUp(index) } else { siftDown(index) }
    }

    @inlinable
    mutating func siftUp(_ start: Int) {
        items.withUnsafeMutableBufferPointer { items in
            var index = start
            let element = items[index]
            while index > 0 {
                let parent = (index - 1) / 2
                guard element.precedes(items[parent]) else { break }
                items[index] = items[parent]
                items[index].movedTo(index: index)
                index = parent
            }
            items[index] = element
            element.movedTo(index: index)
        }
    }

    @inlinable
    mutating func siftDown(_ start: Int) {
        items.withUnsafeMutableBufferPointer { items in
            var index = start
            let element = items[index]
            let count = items.count
            while true {
                let left = 2 * index + 1
                guard left < count else { break }
                let right = left + 1
                let child = right < count && items[right].precedes(items[left]) ? right : left
                guard items[child].precedes(element) else { break }
                items[index] = items[child]
                items[index].movedTo(index: index)
                index = child
            }
            items[index] = element
            element.movedTo(index: index)
        }
    }
}
