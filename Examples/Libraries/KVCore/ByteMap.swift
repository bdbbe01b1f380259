/// A hash map from byte strings to `Value`, built for a keyspace that is scanned while it
/// changes and freed in slices.
///
/// Entries live in a slot array; an open-addressing index (linear probing, one `UInt64` per
/// bucket: the slot number and 32 bits of the key's hash) finds them. So:
/// - **A live entry never moves.** A slot number is a stable cursor: a scan by increasing slot
///   number sees every entry that stays in the map for the whole scan exactly once. Freed
///   slots are reused lowest first (a min-heap), and free slots at the end of the array are
///   dropped, so the array stays about as long as the highest live slot.
/// - The index holds no references, so dropping it is O(1); only the slots own keys and
///   values, and `popLastSlot()` releases them one at a time.
/// - Copy-on-write: copying the map is O(1); the first change to a shared map copies it, O(n).
///
/// Lookup, insertion and removal are O(1) on average (the index doubles, O(n) once in a while,
/// at 3/4 full, and shrinks at 1/8).
///
/// ## Memory
/// A map of n entries holds the slot array (`MemoryLayout<Slot>.stride` bytes a slot, up to
/// twice n slots after the array doubled) and the index (8 bytes a bucket, 4/3 to 8/3 buckets
/// an entry), and nothing per entry on the heap unless a key is longer than 15 bytes or the
/// value holds a heap object. For the keyspace (`Value` = `KeyEntry`) a slot is 40 bytes:
///
/// | bytes | field | why that size |
/// |---:|---|---|
/// | 16 | `key` | `SmallBytes`: up to 15 bytes inline, else a heap array |
/// | 20 | `value` | `KeyEntry?`: a `KVValue` (16: a `SmallBytes` string inline, or one reference to a list, hash or set) and the key's place among the keys with a TTL (4); "free" is a bit pattern `KVValue` never uses, so the optional costs nothing |
/// | 4 | `hash` | the low 32 bits of the key's hash: all the index ever uses (it has at most 2^32 buckets), kept so that growing the index needs no key rehashed |
///
/// The key's expiry time and the epoch a sliced `KEYS` used to tell new keys from old are not
/// in the slot: most keys have no TTL (the time lives in `KVCore.expiring`, 16 bytes per key
/// with one), and a `KEYS` in progress is told of the keys created ahead of its cursor
/// instead (`KVCore.noteInsertion`). Each was 8 bytes in every slot. The fields are in that
/// order because Swift lays out a struct's fields in declaration order: the 4-byte hash after
/// the 20-byte entry fills its tail, where before the entry it would leave a 4-byte hole.
struct ByteMap<Value> {
    struct Slot {
        var key: SmallBytes
        var value: Value?
        var hash: UInt32
    }

    /// Shared by the copies of one map: unique exactly when no copy (snapshot) exists, so the
    /// arrays below can be changed in place without a hidden O(n) copy.
    final class Owner {}

    // A struct of arrays rather than a class: no dynamic exclusivity checks or generic class
    // metadata on the hot path; the arrays are copy-on-write themselves.
    private(set) var slots: ContiguousArray<Slot> = []
    private var table: ContiguousArray<UInt64> = ContiguousArray(repeating: 0, count: 8)
    private var freeSlots: [Int32] = []  // a min-heap; may hold stale entries (checked when popped)
    private(set) var count = 0
    private var owner = Owner()

    init() {}

    var isEmpty: Bool { count == 0 }
    /// One more than the highest slot number in use (or about it): the end of a slot scan.
    var slotCount: Int { slots.count }

    @inline(__always)
    private mutating func makeUnique() {
        if !isKnownUniquelyReferenced(&owner) { owner = Owner() }
    }

    /// Whether this map is shared with a copy (a snapshot).
    mutating func isShared() -> Bool {
        !isKnownUniquelyReferenced(&owner)
    }

    // MARK: Lookup

    /// The slot of `key`, or nil.
    @inline(__always)
    func find(_ key: [UInt8]) -> Int? {
        find(key, hash: ByteHash.hash(key))
    }

    func find(_ key: [UInt8], hash: UInt64) -> Int? {
        let tag = UInt64(UInt32(truncatingIfNeeded: hash))
        return table.withUnsafeBufferPointer { table -> Int? in
            let mask = table.count - 1
            var bucket = Int(tag) & mask  // the low 32 bits, as every other use of the index
            while true {
                let entry = table[bucket]
                if entry == 0 { return nil }
                if entry & 0xffff_ffff == tag {
                    let slot = Int(entry >> 32) - 1
                    if slots[slot].key.equals(key) { return slot }
                }
                bucket = (bucket + 1) & mask
            }
        }
    }

    /// Whether `slot` holds an entry.
    @inline(__always)
    func isOccupied(_ slot: Int) -> Bool {
        slot < slots.count && slots[slot].value != nil
    }

    /// The key in `slot` (which must be occupied).
    @inline(__always)
    func key(at slot: Int) -> SmallBytes { slots[slot].key }

    /// The value in `slot`, or nil when it is free or past the end.
    @inline(__always)
    func value(at slot: Int) -> Value? {
        slot < slots.count ? slots[slot].value : nil
    }

    /// The value of `key`, or nil.
    func value(for key: [UInt8]) -> Value? {
        find(key).flatMap { slots[$0].value }
    }

    /// Changes the value in occupied `slot` in place.
    @inline(__always)
    mutating func modifyValue<R>(at slot: Int, _ body: (inout Value) throws -> R) rethrows -> R {
        makeUnique()
        return try body(&slots[slot].value!)
    }

    /// Replaces the value in occupied `slot`, returning the old one.
    @discardableResult
    mutating func replaceValue(at slot: Int, with value: Value) -> Value {
        makeUnique()
        let old = slots[slot].value!
        slots[slot].value = value
        return old
    }

    // MARK: Changes

    /// Inserts `key`, which must not be in the map; returns its slot.
    @discardableResult
    mutating func insertNew(_ key: [UInt8], hash: UInt64, value: Value) -> Int {
        makeUnique()
        if (count + 1) * 4 > table.count * 3 {
            rebuildIndex(capacity: table.count * 2)
        }
        let slot = takeFreeSlot()
        slots[slot] = Slot(key: SmallBytes(key), value: value, hash: UInt32(truncatingIfNeeded: hash))
        count += 1
        let tag = UInt64(UInt32(truncatingIfNeeded: hash))
        let entry = (UInt64(slot + 1) << 32) | tag
        table.withUnsafeMutableBufferPointer { table in
            let mask = table.count - 1
            var bucket = Int(tag) & mask
            while table[bucket] != 0 { bucket = (bucket + 1) & mask }
            table[bucket] = entry
        }
        return slot
    }

    /// Sets `key` to `value`; returns whether it is new.
    @discardableResult
    mutating func set(_ key: [UInt8], to value: Value) -> Bool {
        let hash = ByteHash.hash(key)
        if let slot = find(key, hash: hash) {
            replaceValue(at: slot, with: value)
            return false
        }
        insertNew(key, hash: hash, value: value)
        return true
    }

    /// Removes `key`; returns its value, or nil when it was not there.
    @discardableResult
    mutating func remove(_ key: [UInt8]) -> Value? {
        guard let slot = find(key) else { return nil }
        return remove(slot: slot).value
    }

    /// Removes the entry in occupied `slot`.
    @discardableResult
    mutating func remove(slot: Int) -> (key: SmallBytes, value: Value) {
        makeUnique()
        let hash = slots[slot].hash
        let target = UInt64(slot + 1) << 32 | UInt64(hash)
        table.withUnsafeMutableBufferPointer { table in
            let mask = table.count - 1
            var hole = Int(hash) & mask
            while table[hole] != target { hole = (hole + 1) & mask }
            // Backward-shift deletion: move later members of the run into the hole.
            var next = hole
            while true {
                next = (next + 1) & mask
                let entry = table[next]
                if entry == 0 { break }
                let home = Int(truncatingIfNeeded: entry & 0xffff_ffff) & mask
                let between = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next)
                if !between {
                    table[hole] = entry
                    hole = next
                }
            }
            table[hole] = 0
        }
        let removed = slots[slot]
        slots[slot] = Slot(key: .empty, value: nil, hash: 0)
        count -= 1
        releaseSlot(slot)
        if count == 0 {
            if table.count > 8 { table = ContiguousArray(repeating: 0, count: 8) }
        } else if table.count > 64 && count * 8 < table.count {
            rebuildIndex(capacity: table.count / 4)
        }
        return (removed.key, removed.value!)
    }

    /// Removes every entry at once (the caller drops the old map; see `popLastSlot`).
    mutating func removeAll() {
        self = ByteMap()
    }

    /// For freeing in slices a map nobody else shares: removes the last slot (occupied or
    /// not) without touching the index, returning its value. The map is unusable for lookups
    /// afterwards; only `slotCount` and `popLastSlot` remain meaningful.
    mutating func popLastSlot() -> Value? {
        slots.popLast()?.value
    }

    /// A random occupied slot (the system's generator), or nil when empty. O(1) expected while
    /// the slot array is mostly full; at worst O(slots).
    ///
    /// It takes no generator: ThreadSanitizer's access check on an `inout`
    /// `SystemRandomNumberGenerator` (a type of size zero) reached through a closure's capture
    /// dereferences a pointer that is not one, and the process dies of SIGSEGV (`make tsan`,
    /// SPOP).
    func randomSlot() -> Int? {
        let slots = slots
        guard count > 0 else { return nil }
        for _ in 0..<16 {
            let slot = Int.random(in: 0..<slots.count)
            if slots[slot].value != nil { return slot }
        }
        let start = Int.random(in: 0..<slots.count)
        for offset in 0..<slots.count {
            let slot = (start + offset) % slots.count
            if slots[slot].value != nil { return slot }
        }
        return nil
    }

    /// The next occupied slot at or after `slot`, or nil.
    func nextOccupied(from slot: Int) -> Int? {
        let slots = slots
        var index = max(slot, 0)
        while index < slots.count {
            if slots[index].value != nil { return index }
            index += 1
        }
        return nil
    }

    // MARK: Slots and index

    private mutating func takeFreeSlot() -> Int {
        while let candidate = heapPopMin() {
            let slot = Int(candidate)
            if slot < slots.count && slots[slot].value == nil { return slot }
        }
        slots.append(Slot(key: .empty, value: nil, hash: 0))
        return slots.count - 1
    }

    private mutating func releaseSlot(_ slot: Int) {
        if slot == slots.count - 1 {
            // Drop the free tail (its heap entries become stale).
            while let last = slots.last, last.value == nil { slots.removeLast() }
        } else {
            heapPush(Int32(slot))
        }
        if freeSlots.count > 2 * slots.count + 64 {
            freeSlots = []
            for index in slots.indices where slots[index].value == nil {
                heapPush(Int32(index))
            }
        }
    }

    private mutating func rebuildIndex(capacity requested: Int) {
        var capacity = 8
        while capacity < requested { capacity *= 2 }
        while (count + 1) * 4 > capacity * 3 { capacity *= 2 }
        var newTable = ContiguousArray<UInt64>(repeating: 0, count: capacity)
        let mask = capacity - 1
        newTable.withUnsafeMutableBufferPointer { table in
            for (slot, entry) in slots.enumerated() where entry.value != nil {
                var bucket = Int(entry.hash) & mask
                while table[bucket] != 0 { bucket = (bucket + 1) & mask }
                table[bucket] = (UInt64(slot + 1) << 32) | UInt64(entry.hash)
            }
        }
        table = newTable
    }

    private mutating func heapPush(_ value: Int32) {
        freeSlots.append(value)
        var child = freeSlots.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            if freeSlots[parent] <= freeSlots[child] { break }
            freeSlots.swapAt(parent, child)
            child = parent
        }
    }

    private mutating func heapPopMin() -> Int32? {
        guard let last = freeSlots.popLast() else { return nil }
        guard !freeSlots.isEmpty else { return last }
        let minimum = freeSlots[0]
        freeSlots[0] = last
        var parent = 0
        let count = freeSlots.count
        while true {
            let left = 2 * parent + 1
            if left >= count { break }
            var smallest = left
            if left + 1 < count && freeSlots[left + 1] < freeSlots[left] { smallest = left + 1 }
            if freeSlots[parent] <= freeSlots[smallest] { break }
            freeSlots.swapAt(parent, smallest)
            parent = smallest
        }
        return minimum
    }
}
