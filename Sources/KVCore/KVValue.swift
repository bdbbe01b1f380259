/// A value in the keyspace.
enum KVValue {
    case string([UInt8])
    case list(ListValue)
    case hash(ByteMap<[UInt8]>)
    case set(ByteMap<Void>)

    /// Elements to release when the value is freed (what freeing it costs, roughly).
    var elementCount: Int {
        switch self {
        case .string: return 1
        case .list(let list): return list.count
        case .hash(let map): return map.count
        case .set(let map): return map.count
        }
    }

    /// `TYPE`'s answer.
    var typeName: StaticString {
        switch self {
        case .string: return "string"
        case .list: return "list"
        case .hash: return "hash"
        case .set: return "set"
        }
    }
}

/// One key's entry.
struct KeyEntry {
    var value: KVValue
    /// Absolute expiry in Unix milliseconds, or `KeyEntry.persistent`.
    var expireAt: Int64 = KeyEntry.persistent
    /// When the key was created (a counter, not a time): a sliced `KEYS` reports only keys
    /// created before it began.
    var epoch: UInt64
    /// The entry's place in the keyspace's list of keys with a TTL, or -1.
    var expiryPosition: Int32 = -1

    static let persistent: Int64 = -1

    init(value: KVValue, epoch: UInt64) {
        self.value = value
        self.epoch = epoch
    }
}
