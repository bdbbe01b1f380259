/// Values and keyspaces that no key holds any more, released a slice at a time
/// (`KVCore.reclaim(budget:)`), so freeing a million elements never stalls the loop.
///
/// A value still shared with a snapshot (a sliced reply in progress) is only dropped here: the
/// snapshot's owner hands it back when it is done.
struct Reclaimer {
    // Kept in typed stacks and changed in place, so nothing else holds a reference while the
    // uniqueness checks run.
    private var keyspaces: [ByteMap<KeyEntry>] = []
    private var lists: [ListValue] = []
    private var hashes: [ByteMap<[UInt8]>] = []
    private var sets: [ByteMap<Void>] = []

    var isEmpty: Bool { keyspaces.isEmpty && lists.isEmpty && hashes.isEmpty && sets.isEmpty }

    /// Elements waiting (a rough figure: the keyspaces' slots count one each).
    var pendingElements: Int {
        keyspaces.reduce(0) { $0 + $1.slotCount } + lists.reduce(0) { $0 + $1.count }
            + hashes.reduce(0) { $0 + $1.slotCount } + sets.reduce(0) { $0 + $1.slotCount }
    }

    mutating func add(_ value: KVValue) {
        switch value {
        case .string: return
        case .list(let box): lists.append(box.collection)
        case .hash(let box): hashes.append(box.collection)
        case .set(let box): sets.append(box.collection)
        }
    }

    /// A sliced reply's snapshot, handed back when the reply is done.
    mutating func add(list: ListValue) { lists.append(list) }
    mutating func add(hash: ByteMap<[UInt8]>) { hashes.append(hash) }
    mutating func add(set: ByteMap<Void>) { sets.append(set) }

    mutating func add(keyspace: ByteMap<KeyEntry>) {
        keyspaces.append(keyspace)
    }

    /// Releases about `budget` elements; true when nothing is left.
    mutating func step(budget: Int, threshold: Int) -> Bool {
        var remaining = budget
        while remaining > 0 && !isEmpty {
            if !lists.isEmpty {
                let last = lists.count - 1
                if lists[last].isShared() {
                    lists.removeLast()
                } else {
                    remaining -= lists[last].releaseSlots(upTo: remaining)
                    if lists[last].isEmpty { lists.removeLast() }
                }
            } else if !hashes.isEmpty {
                Self.drain(&hashes, &remaining)
            } else if !sets.isEmpty {
                Self.drain(&sets, &remaining)
            } else {
                let last = keyspaces.count - 1
                if keyspaces[last].isShared() {
                    keyspaces.removeLast()
                    continue
                }
                while remaining > 0 && keyspaces[last].slotCount > 0 {
                    remaining -= 1
                    guard let entry = keyspaces[last].popLastSlot() else { continue }
                    let size = entry.value.elementCount
                    if size >= threshold {
                        add(entry.value)  // freed in later slices
                    } else {
                        remaining -= size
                    }
                }
                if keyspaces[last].slotCount == 0 { keyspaces.removeLast() }
                if !lists.isEmpty || !hashes.isEmpty || !sets.isEmpty { continue }
            }
        }
        return isEmpty
    }

    private static func drain<V>(_ stack: inout [ByteMap<V>], _ remaining: inout Int) {
        let last = stack.count - 1
        if stack[last].isShared() {
            stack.removeLast()
            return
        }
        while remaining > 0 && stack[last].slotCount > 0 {
            _ = stack[last].popLastSlot()
            remaining -= 1
        }
        if stack[last].slotCount == 0 { stack.removeLast() }
    }
}
