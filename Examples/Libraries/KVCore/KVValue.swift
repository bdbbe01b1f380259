/// A value in the keyspace: 16 bytes.
///
/// A string is a `SmallBytes` (up to 15 bytes inline, else a heap array); a list, hash or set
/// is one reference to a box that holds the collection. The boxes keep the enum at 16 bytes
/// (a `ListValue` is 32 bytes and a `ByteMap` 40, which made every slot of the keyspace that
/// much bigger, strings included); the tag lives in spare bits of the string's count and of
/// the references (see `SmallBytes`).
///
/// Value semantics are kept: a box shared by two copies of a `KVValue` is copied before it
/// is changed (`withList`, `withHash`, `withSet`), and the collections inside are copy-on-write
/// themselves (a sliced reply's snapshot is a copy of the collection, not of the box).
enum KVValue {
    case string(SmallBytes)
    case list(CollectionBox<ListValue>)
    case hash(CollectionBox<ByteMap<[UInt8]>>)
    case set(CollectionBox<ByteMap<Void>>)

    /// The empty string: a placeholder while a value is moved out of its slot.
    static var placeholder: KVValue { .string(.empty) }

    /// Elements to release when the value is freed (what freeing it costs, roughly).
    var elementCount: Int {
        switch self {
        case .string: return 1
        case .list(let box): return box.collection.count
        case .hash(let box): return box.collection.count
        case .set(let box): return box.collection.count
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

/// A list, hash or set in the keyspace (`KVValue`). A class so that the enum holds one
/// reference; not checked for exclusive access at run time (the core's thread only, and no
/// overlapping accesses: see `KVCore`'s hot state).
final class CollectionBox<Collection> {
    @exclusivity(unchecked) var collection: Collection

    init(_ collection: Collection) {
        self.collection = collection
    }
}

/// One key's entry: 20 bytes (see `ByteMap` for the slot it is part of).
struct KeyEntry {
    var value: KVValue
    /// The key's place in `KVCore.expiring` (the keys with a TTL, and their times), or -1.
    var expiryPosition: Int32 = -1

    init(value: KVValue) {
        self.value = value
    }

    /// `KVCore.expireAt(slot:)` of a key without a TTL.
    static let persistent: Int64 = -1

    /// Whether the key has a TTL.
    @inline(__always)
    var hasExpiry: Bool { expiryPosition >= 0 }
}

/// A key with a TTL: its slot and its absolute expiry in Unix milliseconds.
struct ExpiryRecord {
    var slot: Int32
    var expireAt: Int64
}

/// A sliced `KEYS` in progress, as the core sees it (`KVCore.noteInsertion`): where its
/// cursor is, where it ends, and the slots ahead of the cursor that got a new key since it
/// began (skipped when the cursor reaches them).
final class KeysScanProgress {
    // Not checked for exclusive access at run time, like the core's hot state.
    @exclusivity(unchecked) var cursor = 0
    let end: Int
    @exclusivity(unchecked) var createdAhead: Set<Int> = []

    init(end: Int) {
        self.end = end
    }
}

/// `KVCore.keysScans`' entry.
struct WeakKeysScan {
    weak var progress: KeysScanProgress?
}

/// What the code shared by lists, hashes and sets needs of the collection itself.
protocol KVCollection {
    /// Elements, fields or members held.
    var count: Int { get }
    /// Whether nothing is held (the key must then go).
    var isEmpty: Bool { get }
}

extension ListValue: KVCollection {}
extension ByteMap: KVCollection {}

/// One of the collection kinds a `KVValue` holds (`ListKind`, `HashKind`, `SetKind`), so that a
/// command that does the same thing to a hash as to a set (or a list) is written once, generic
/// over the kind. Caseless enums used as types only: the generic code is specialized for each,
/// so it costs what the hand-written `case .hash(let box)` did.
protocol CollectionKind {
    /// The collection in the kind's box.
    associatedtype Collection: KVCollection
    /// The box, when `value` is of this kind; nil when it is of another.
    static func box(in value: KVValue) -> CollectionBox<Collection>?
    /// A value of this kind holding `box`.
    static func value(_ box: CollectionBox<Collection>) -> KVValue
}

/// `KVValue.list`, as a `CollectionKind`.
enum ListKind: CollectionKind {
    @inline(__always)
    static func box(in value: KVValue) -> CollectionBox<ListValue>? {
        if case .list(let box) = value { return box }
        return nil
    }

    @inline(__always)
    static func value(_ box: CollectionBox<ListValue>) -> KVValue { .list(box) }
}

/// `KVValue.hash`, as a `CollectionKind`.
enum HashKind: CollectionKind {
    @inline(__always)
    static func box(in value: KVValue) -> CollectionBox<ByteMap<[UInt8]>>? {
        if case .hash(let box) = value { return box }
        return nil
    }

    @inline(__always)
    static func value(_ box: CollectionBox<ByteMap<[UInt8]>>) -> KVValue { .hash(box) }
}

/// `KVValue.set`, as a `CollectionKind`.
enum SetKind: CollectionKind {
    @inline(__always)
    static func box(in value: KVValue) -> CollectionBox<ByteMap<Void>>? {
        if case .set(let box) = value { return box }
        return nil
    }

    @inline(__always)
    static func value(_ box: CollectionBox<ByteMap<Void>>) -> KVValue { .set(box) }
}
