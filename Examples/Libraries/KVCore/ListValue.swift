/// A Redis list: a ring buffer of byte strings with O(1) pushes and pops at both ends and
/// O(1) access by index.
///
/// Copy-on-write: copying is O(1) (a snapshot), and the first change to a shared list copies
/// it, O(n). A struct of an array and two indexes, so the hot path has no class accesses.
struct ListValue {
    /// Shared by the copies of one list: unique exactly when no snapshot exists.
    final class Owner {}

    private var items: ContiguousArray<[UInt8]>  // a power of two long
    private var head = 0
    private(set) var count = 0
    private var owner = Owner()

    init() {
        items = ContiguousArray(repeating: [], count: 8)
    }

    var isEmpty: Bool { count == 0 }

    /// The element at `index` (0 is the head), which must be in range.
    @inline(__always)
    subscript(index: Int) -> [UInt8] {
        items[(head + index) & (items.count - 1)]
    }

    /// Moves the elements into a new buffer of `capacity` (a power of two) slots.
    private mutating func relayout(capacity: Int) {
        var fresh = ContiguousArray<[UInt8]>(repeating: [], count: capacity)
        let mask = items.count - 1
        for index in 0..<count {
            swap(&fresh[index], &items[(head + index) & mask])
        }
        items = fresh
        head = 0
    }

    @inline(__always)
    private mutating func prepareForWrite(adding extra: Int) {
        if !isKnownUniquelyReferenced(&owner) { owner = Owner() }
        if count + extra > items.count {
            var capacity = items.count * 2
            while capacity < count + extra { capacity *= 2 }
            relayout(capacity: capacity)
        }
    }

    mutating func pushFront(_ element: [UInt8]) {
        prepareForWrite(adding: 1)
        head = (head - 1) & (items.count - 1)
        items[head] = element
        count += 1
    }

    mutating func pushBack(_ element: [UInt8]) {
        prepareForWrite(adding: 1)
        items[(head + count) & (items.count - 1)] = element
        count += 1
    }

    mutating func popFront() -> [UInt8]? {
        guard count > 0 else { return nil }
        prepareForWrite(adding: 0)
        var element: [UInt8] = []
        swap(&element, &items[head])
        head = (head + 1) & (items.count - 1)
        count -= 1
        shrinkIfSparse()
        return element
    }

    mutating func popBack() -> [UInt8]? {
        guard count > 0 else { return nil }
        prepareForWrite(adding: 0)
        var element: [UInt8] = []
        swap(&element, &items[(head + count - 1) & (items.count - 1)])
        count -= 1
        shrinkIfSparse()
        return element
    }

    private mutating func shrinkIfSparse() {
        if items.count > 1024 && count * 8 < items.count {
            var capacity = 8
            while capacity < count * 2 { capacity *= 2 }
            relayout(capacity: capacity)
        }
    }

    /// Whether this list is shared with a copy (a snapshot).
    mutating func isShared() -> Bool {
        !isKnownUniquelyReferenced(&owner)
    }

    /// For freeing in slices a list nobody else shares (it is not used as a list again):
    /// removes up to `limit` slots from the end of the buffer, elements and empty slots alike,
    /// and returns how many. The buffer's length shrinks with them, so its release at the end
    /// destroys nothing: dropping elements in place left a million empty slots, released one
    /// by one when the buffer went (a PING waited ~2.5 ms more at the end of a `DEL` of a
    /// million-element list).
    mutating func releaseSlots(upTo limit: Int) -> Int {
        let dropping = min(limit, items.count)
        items.removeLast(dropping)
        head = 0
        count = items.count  // slots still to release; the order is gone
        return dropping
    }
}
