/// A Redis list: a ring buffer of byte strings with O(1) pushes and pops at both ends and
/// O(1) access by index.
///
/// Copy-on-write through an explicitly checked box: copying is O(1) (a snapshot), and the
/// first change to a shared list copies it, O(n).
struct ListValue {
    final class Box {
        var items: ContiguousArray<[UInt8]>  // capacity slots; a power of two (or empty)
        var head = 0
        var count = 0

        init(capacity: Int) {
            items = ContiguousArray(repeating: [], count: capacity)
        }

        func copy(minimumCapacity: Int) -> Box {
            var capacity = 8
            while capacity < minimumCapacity { capacity *= 2 }
            let other = Box(capacity: capacity)
            for index in 0..<count {
                other.items[index] = items[(head + index) & (items.count - 1)]
            }
            other.count = count
            return other
        }
    }

    private(set) var box: Box

    init() {
        box = Box(capacity: 8)
    }

    var count: Int { box.count }
    var isEmpty: Bool { box.count == 0 }

    /// The element at `index` (0 is the head), which must be in range.
    @inline(__always)
    subscript(index: Int) -> [UInt8] {
        box.items[(box.head + index) & (box.items.count - 1)]
    }

    @inline(__always)
    private mutating func prepareForWrite(adding extra: Int) {
        if !isKnownUniquelyReferenced(&box) {
            box = box.copy(minimumCapacity: box.count + extra)
        } else if box.count + extra > box.items.count {
            box = box.copy(minimumCapacity: max(box.items.count * 2, box.count + extra))
        }
    }

    mutating func pushFront(_ element: [UInt8]) {
        prepareForWrite(adding: 1)
        let box = self.box
        box.head = (box.head - 1) & (box.items.count - 1)
        box.items[box.head] = element
        box.count += 1
    }

    mutating func pushBack(_ element: [UInt8]) {
        prepareForWrite(adding: 1)
        let box = self.box
        box.items[(box.head + box.count) & (box.items.count - 1)] = element
        box.count += 1
    }

    mutating func popFront() -> [UInt8]? {
        guard box.count > 0 else { return nil }
        prepareForWrite(adding: 0)
        let box = self.box
        var element: [UInt8] = []
        swap(&element, &box.items[box.head])
        box.head = (box.head + 1) & (box.items.count - 1)
        box.count -= 1
        shrinkIfSparse()
        return element
    }

    mutating func popBack() -> [UInt8]? {
        guard box.count > 0 else { return nil }
        prepareForWrite(adding: 0)
        let box = self.box
        var element: [UInt8] = []
        swap(&element, &box.items[(box.head + box.count - 1) & (box.items.count - 1)])
        box.count -= 1
        shrinkIfSparse()
        return element
    }

    private mutating func shrinkIfSparse() {
        if box.items.count > 1024 && box.count * 8 < box.items.count {
            box = box.copy(minimumCapacity: box.count * 2)
        }
    }

    /// Whether this list's storage is shared with a copy (a snapshot).
    mutating func isShared() -> Bool {
        !isKnownUniquelyReferenced(&box)
    }

    /// For freeing in slices a list nobody else shares: drops up to `limit` elements from the
    /// back; returns how many it dropped.
    mutating func dropBack(upTo limit: Int) -> Int {
        let box = self.box
        let dropping = min(limit, box.count)
        for _ in 0..<dropping {
            box.items[(box.head + box.count - 1) & (box.items.count - 1)] = []
            box.count -= 1
        }
        return dropping
    }
}
