extension KVValue {
    /// Runs `body` on the `Kind` collection held here (moved out, so an unshared collection
    /// changes in place); nil when this is not of that kind.
    @inline(__always)
    mutating func withCollection<Kind: CollectionKind, R>(
        _ kind: Kind.Type, _ body: (inout Kind.Collection) -> R
    ) -> R? {
        guard var box = Kind.box(in: self) else { return nil }
        self = .placeholder  // now `box` is the only reference, unless a copy of this value exists
        if !isKnownUniquelyReferenced(&box) { box = CollectionBox(box.collection) }
        defer { self = Kind.value(box) }
        return body(&box.collection)
    }

    /// `withCollection(ListKind.self, body)`.
    @inline(__always)
    mutating func withList<R>(_ body: (inout ListValue) -> R) -> R? {
        withCollection(ListKind.self, body)
    }

    /// `withCollection(HashKind.self, body)`.
    @inline(__always)
    mutating func withHash<R>(_ body: (inout ByteMap<[UInt8]>) -> R) -> R? {
        withCollection(HashKind.self, body)
    }

    /// `withCollection(SetKind.self, body)`.
    @inline(__always)
    mutating func withSet<R>(_ body: (inout ByteMap<Void>) -> R) -> R? {
        withCollection(SetKind.self, body)
    }

    /// Whether the value is an empty list, hash or set (its key must then go).
    var isEmptyCollection: Bool {
        switch self {
        case .string: return false
        case .list(let box): return box.collection.isEmpty
        case .hash(let box): return box.collection.isEmpty
        case .set(let box): return box.collection.isEmpty
        }
    }
}

extension KVCore {
    // MARK: Lists

    func push(_ a: [[UInt8]], front: Bool, _ output: inout [UInt8]) {
        let key = a[1]
        let hash = ByteHash.hash(key)
        let slot: Int
        if let existing = liveSlot(key, hash: hash) {
            slot = existing
        } else {
            slot = insertKey(key, hash: hash, value: .list(CollectionBox(ListValue())))
        }
        let length = modifyValue(at: slot) { value in
            value.withList { list -> Int in
                for element in a.dropFirst(2) {
                    if front { list.pushFront(element) } else { list.pushBack(element) }
                }
                return list.count
            }
        }
        if let length { RESP.appendInteger(length, to: &output) } else { replyWrongType(&output) }
    }

    func pop(_ a: [[UInt8]], front: Bool, _ output: inout [UInt8]) -> KVExecution {
        if a.count > 3 {
            replyArity(front ? "lpop" : "rpop", into: &output)
            return .replied
        }
        return popElements(a, ListKind.self, nullArrayForMissingKey: true, &output) { list, output in
            RESP.appendBulkString((front ? list.popFront() : list.popBack())!, to: &output)
        }
    }

    /// What LPOP, RPOP and SPOP share once the argument count is checked: `KEY [COUNT]`, popping
    /// one element (a bulk reply) or up to COUNT (an array), and deleting the key emptied.
    /// A missing key with a COUNT answers a null array when `nullArrayForMissingKey` (LPOP,
    /// RPOP), else an empty one (SPOP); without, a null bulk. `popOne` takes an element out of
    /// a collection that is not empty and appends it to the reply as a bulk string.
    @inline(__always)
    func popElements<Kind: CollectionKind>(
        _ a: [[UInt8]], _ kind: Kind.Type, nullArrayForMissingKey: Bool, _ output: inout [UInt8],
        popOne: (inout Kind.Collection, inout [UInt8]) -> Void
    ) -> KVExecution {
        var count: Int?
        if a.count == 3 {
            guard let value = positiveCountArgument(a[2], &output) else { return .replied }
            count = value
        }
        guard let slot = liveSlot(a[1]) else {
            if count == nil {
                RESP.appendNullBulk(to: &output)
            } else if nullArrayForMissingKey {
                RESP.appendNullArray(to: &output)
            } else {
                RESP.appendEmptyArray(to: &output)
            }
            return .replied
        }
        guard Kind.box(in: entry(at: slot).value) != nil else {
            replyWrongType(&output)
            return .replied
        }
        if count == 0 {
            RESP.appendEmptyArray(to: &output)
            return .replied
        }
        let empty = modifyValue(at: slot) { value -> Bool in
            value.withCollection(Kind.self) { collection -> Bool in
                if let count {
                    let popping = min(count, collection.count)
                    RESP.appendArrayHeader(popping, to: &output)
                    for _ in 0..<popping { popOne(&collection, &output) }
                } else {
                    popOne(&collection, &output)
                }
                return collection.isEmpty
            } ?? false
        }
        if empty { deleteKey(slot: slot) }
        return .replied
    }

    func llen(_ a: [[UInt8]], _ output: inout [UInt8]) {
        memberCount(a, ListKind.self, &output)
    }

    func lrange(_ a: [[UInt8]], _ output: inout [UInt8]) -> KVExecution {
        guard var start = integerArgument(a[2], &output), var end = integerArgument(a[3], &output) else {
            return .replied
        }
        guard let slot = readSlot(a[1]) else {
            RESP.appendEmptyArray(to: &output)
            return .replied
        }
        guard let list = collection(ListKind.self, at: slot, &output) else {  // a snapshot, if sliced
            return .replied
        }
        let length = Int64(list.count)
        if start < 0 { start += length }
        if end < 0 { end += length }
        if start < 0 { start = 0 }
        if start > end || start >= length {
            RESP.appendEmptyArray(to: &output)
            return .replied
        }
        if end >= length { end = length - 1 }
        let from = Int(start)
        let through = Int(end)
        if through - from + 1 >= configuration.slicingThreshold {
            return .sliced(KVSlicedReply(core: self, kind: .list(list, next: from, end: through + 1)))
        }
        RESP.appendArrayHeader(through - from + 1, to: &output)
        for index in from...through {
            RESP.appendBulkString(list[index], to: &output)
        }
        return .replied
    }

    func lindex(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard let slot = readSlot(a[1]) else {
            RESP.appendNullBulk(to: &output)
            return
        }
        guard let list = collection(ListKind.self, at: slot, &output) else { return }
        guard var index = integerArgument(a[2], &output) else { return }
        if index < 0 { index += Int64(list.count) }
        if index < 0 || index >= Int64(list.count) {
            RESP.appendNullBulk(to: &output)
        } else {
            RESP.appendBulkString(list[Int(index)], to: &output)
        }
    }

    // MARK: Hashes

    func hset(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard a.count % 2 == 0 else {
            replyArity("hset", into: &output)
            return
        }
        let key = a[1]
        let hash = ByteHash.hash(key)
        let slot = liveSlot(key, hash: hash) ?? insertKey(key, hash: hash, value: .hash(CollectionBox(ByteMap())))
        let added = modifyValue(at: slot) { value in
            value.withHash { map -> Int in
                var added = 0
                var index = 2
                while index < a.count {
                    if map.set(a[index], to: a[index + 1]) { added += 1 }
                    index += 2
                }
                return added
            }
        }
        if let added { RESP.appendInteger(added, to: &output) } else { replyWrongType(&output) }
    }

    /// The `Kind` collection in `slot` for reading, or nil after a WRONGTYPE reply.
    @inline(__always)
    func collection<Kind: CollectionKind>(
        _ kind: Kind.Type, at slot: Int, _ output: inout [UInt8]
    ) -> Kind.Collection? {
        guard let box = Kind.box(in: keyspace.slots[slot].value!.value) else {
            replyWrongType(&output)
            return nil
        }
        return box.collection
    }

    /// LLEN, HLEN and SCARD: the collection's size (0 for a missing key).
    func memberCount<Kind: CollectionKind>(_ a: [[UInt8]], _ kind: Kind.Type, _ output: inout [UInt8]) {
        guard let slot = readSlot(a[1]) else {
            RESP.appendInteger(0, to: &output)
            return
        }
        guard let held = collection(Kind.self, at: slot, &output) else { return }
        RESP.appendInteger(held.count, to: &output)
    }

    /// HEXISTS and SISMEMBER: 1 when the field or member `a[2]` is there, else 0.
    func containsMember<Kind: CollectionKind, Value>(
        _ a: [[UInt8]], _ kind: Kind.Type, _ output: inout [UInt8]
    ) where Kind.Collection == ByteMap<Value> {
        guard let slot = readSlot(a[1]) else {
            RESP.appendInteger(0, to: &output)
            return
        }
        guard let map = collection(Kind.self, at: slot, &output) else { return }
        RESP.appendInteger(map.find(a[2]) != nil ? 1 : 0, to: &output)
    }

    /// HDEL and SREM: removes the fields or members `a[2...]`, answers how many were there and
    /// deletes the key emptied.
    func removeMembers<Kind: CollectionKind, Value>(
        _ a: [[UInt8]], _ kind: Kind.Type, _ output: inout [UInt8]
    ) where Kind.Collection == ByteMap<Value> {
        guard let slot = liveSlot(a[1]) else {
            RESP.appendInteger(0, to: &output)
            return
        }
        let result = modifyValue(at: slot) { value in
            value.withCollection(Kind.self) { map -> (Int, Bool) in
                var removed = 0
                for member in a.dropFirst(2) where map.remove(member) != nil { removed += 1 }
                return (removed, map.isEmpty)
            }
        }
        guard let (removed, empty) = result else {
            replyWrongType(&output)
            return
        }
        if empty { deleteKey(slot: slot) }
        RESP.appendInteger(removed, to: &output)
    }

    func hget(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard let slot = readSlot(a[1]) else {
            RESP.appendNullBulk(to: &output)
            return
        }
        guard let map = collection(HashKind.self, at: slot, &output) else { return }
        if let value = map.value(for: a[2]) {
            RESP.appendBulkString(value, to: &output)
        } else {
            RESP.appendNullBulk(to: &output)
        }
    }

    func hdel(_ a: [[UInt8]], _ output: inout [UInt8]) {
        removeMembers(a, HashKind.self, &output)
    }

    func hgetall(_ a: [[UInt8]], _ output: inout [UInt8]) -> KVExecution {
        guard let slot = readSlot(a[1]) else {
            RESP.appendEmptyArray(to: &output)
            return .replied
        }
        guard let map = collection(HashKind.self, at: slot, &output) else { return .replied }
        if map.count >= configuration.slicingThreshold {
            return .sliced(KVSlicedReply(core: self, kind: .hash(map, cursor: 0)))
        }
        RESP.appendArrayHeader(map.count * 2, to: &output)
        for index in 0..<map.slotCount {
            if let value = map.value(at: index) {
                RESP.appendBulkString(map.key(at: index), to: &output)
                RESP.appendBulkString(value, to: &output)
            }
        }
        return .replied
    }

    func hlen(_ a: [[UInt8]], _ output: inout [UInt8]) {
        memberCount(a, HashKind.self, &output)
    }

    func hexists(_ a: [[UInt8]], _ output: inout [UInt8]) {
        containsMember(a, HashKind.self, &output)
    }

    func hincrby(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard let delta = integerArgument(a[3], &output) else { return }
        let key = a[1]
        let hash = ByteHash.hash(key)
        let existing = liveSlot(key, hash: hash)
        if let existing, case .hash = entry(at: existing).value {} else if existing != nil {
            replyWrongType(&output)
            return
        }
        let slot = existing ?? insertKey(key, hash: hash, value: .hash(CollectionBox(ByteMap())))
        let outcome = modifyValue(at: slot) { value in
            value.withHash { map -> IncrementOutcome in
                var old: Int64 = 0
                if let current = map.value(for: a[2]) {
                    guard let parsed = RedisInteger.parse(current) else { return .notInteger }
                    old = parsed
                }
                let (sum, overflow) = old.addingReportingOverflow(delta)
                if overflow { return .overflow }
                map.set(a[2], to: RedisInteger.bytes(sum))
                return .value(sum)
            }
        }
        switch outcome {
        case .value(let sum)?: RESP.appendInteger(sum, to: &output)
        case .notInteger?: RESP.appendError("ERR hash value is not an integer", to: &output)
        case .overflow?: RESP.appendError("ERR increment or decrement would overflow", to: &output)
        case .wrongType?, nil: replyWrongType(&output)
        }
        if existing == nil, entry(at: slot).value.isEmptyCollection { deleteKey(slot: slot) }
    }

    // MARK: Sets

    func sadd(_ a: [[UInt8]], _ output: inout [UInt8]) {
        let key = a[1]
        let hash = ByteHash.hash(key)
        let slot = liveSlot(key, hash: hash) ?? insertKey(key, hash: hash, value: .set(CollectionBox(ByteMap())))
        let added = modifyValue(at: slot) { value in
            value.withSet { map -> Int in
                var added = 0
                for member in a.dropFirst(2) {
                    let memberHash = ByteHash.hash(member)
                    if map.find(member, hash: memberHash) == nil {
                        map.insertNew(member, hash: memberHash, value: ())
                        added += 1
                    }
                }
                return added
            }
        }
        if let added { RESP.appendInteger(added, to: &output) } else { replyWrongType(&output) }
    }

    func srem(_ a: [[UInt8]], _ output: inout [UInt8]) {
        removeMembers(a, SetKind.self, &output)
    }

    func smembers(_ a: [[UInt8]], _ output: inout [UInt8]) -> KVExecution {
        guard let slot = readSlot(a[1]) else {
            RESP.appendEmptyArray(to: &output)
            return .replied
        }
        guard let map = collection(SetKind.self, at: slot, &output) else { return .replied }
        if map.count >= configuration.slicingThreshold {
            return .sliced(KVSlicedReply(core: self, kind: .set(map, cursor: 0)))
        }
        RESP.appendArrayHeader(map.count, to: &output)
        for index in 0..<map.slotCount where map.isOccupied(index) {
            RESP.appendBulkString(map.key(at: index), to: &output)
        }
        return .replied
    }

    func sismember(_ a: [[UInt8]], _ output: inout [UInt8]) {
        containsMember(a, SetKind.self, &output)
    }

    func scard(_ a: [[UInt8]], _ output: inout [UInt8]) {
        memberCount(a, SetKind.self, &output)
    }

    func spop(_ a: [[UInt8]], _ output: inout [UInt8]) -> KVExecution {
        if a.count > 3 {
            replySyntaxError(&output)
            return .replied
        }
        return popElements(a, SetKind.self, nullArrayForMissingKey: false, &output) { map, output in
            RESP.appendBulkString(map.remove(slot: map.randomSlot()!).key, to: &output)
        }
    }
}
