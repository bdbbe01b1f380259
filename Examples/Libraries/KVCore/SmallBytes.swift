#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A binary-safe byte string in 16 bytes: up to `inlineCapacity` (15) bytes are stored in the
/// value itself, longer ones in a heap array (`[UInt8]`, taken as it is, not copied).
///
/// Why: a key of the keyspace, and a small string value, were each an array of their own: a
/// 32-byte array header plus the bytes, rounded up by malloc to 48 bytes, and a pointer in the
/// slot. Most keys and many values are short (`user:1000`, `value:42`, a counter), so storing
/// them inline, as Swift's small `String` does, saves two allocations per key (about 100 bytes)
/// and a pointer chase on every lookup. See `ByteMap` for the slot layout this is part of.
///
/// Layout: the `.inline` payload is 15 bytes of data and a count (`InlineCount`, a one-byte
/// enum of 16 cases). The count's unused bit patterns are spare bits, so Swift stores the case
/// tag there: a `SmallBytes` is 16 bytes, an `Optional<SmallBytes>` too, and so is a `KVValue`
/// that has a `SmallBytes` case beside class references (checked by a test).
///
/// The form is canonical: 15 bytes or fewer are always inline, more always on the heap, so two
/// inline values are equal exactly when their 16 bytes are (the unused data bytes are zero).
struct SmallBytes {
    /// The most bytes stored inline.
    static let inlineCapacity = 15

    /// The count of an inline string: an enum, not a `UInt8`, so that its 240 unused bit
    /// patterns are spare bits for the enclosing enums' tags (a `UInt8` has none, and every
    /// enum around it would grow by a byte, and by 8 with alignment).
    enum InlineCount: UInt8 {
        case c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15
    }

    /// 15 bytes of data (unused ones zero) and the count, in memory order.
    struct InlineStorage {
        var word: UInt64 = 0
        var half: UInt32 = 0
        var quarter: UInt16 = 0
        var byte: UInt8 = 0
        var count: InlineCount = .c0

        static let zero = InlineStorage()
    }

    enum Storage {
        case inline(InlineStorage)
        case heap([UInt8])
    }

    var storage: Storage

    /// The empty string.
    static let empty = SmallBytes(storage: .inline(.zero))

    @inline(__always)
    init(storage: Storage) {
        self.storage = storage
    }

    /// `bytes`: copied inline when they fit, else the array itself is kept (no copy).
    @inline(__always)
    init(_ bytes: [UInt8]) {
        if bytes.count <= Self.inlineCapacity {
            storage = .inline(bytes.withUnsafeBytes { Self.inlineStorage($0) })
        } else {
            storage = .heap(bytes)
        }
    }

    /// A copy of `bytes`.
    @inline(__always)
    init(_ bytes: UnsafeRawBufferPointer) {
        if bytes.count <= Self.inlineCapacity {
            storage = .inline(Self.inlineStorage(bytes))
        } else {
            storage = .heap(Array(bytes))
        }
    }

    /// `bytes` (at most `inlineCapacity`) as inline storage.
    @inline(__always)
    static func inlineStorage(_ bytes: UnsafeRawBufferPointer) -> InlineStorage {
        var inline = InlineStorage.zero
        let count = bytes.count
        if count > 0 {
            withUnsafeMutableBytes(of: &inline) { raw in
                raw.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: count)
            }
        }
        inline.count = InlineCount(rawValue: UInt8(truncatingIfNeeded: count))!
        return inline
    }

    /// The number of bytes.
    @inline(__always)
    var count: Int {
        switch storage {
        case .inline(let inline): return Int(inline.count.rawValue)
        case .heap(let bytes): return bytes.count
        }
    }

    var isEmpty: Bool { count == 0 }

    /// Whether the bytes are stored inline (for tests and the memory figures).
    var isInline: Bool {
        if case .inline = storage { return true }
        return false
    }

    /// Calls `body` with the bytes (an inline string is copied to the stack for it).
    @inline(__always)
    func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        switch storage {
        case .inline(var inline):
            let count = Int(inline.count.rawValue)
            return try Swift.withUnsafeBytes(of: &inline) { raw in
                try body(UnsafeRawBufferPointer(rebasing: raw[0..<count]))
            }
        case .heap(let bytes):
            return try bytes.withUnsafeBytes(body)
        }
    }

    /// Calls `body` with the bytes as `UInt8`s.
    @inline(__always)
    func withUnsafeBufferPointer<R>(_ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        try withUnsafeBytes { raw in try raw.withMemoryRebound(to: UInt8.self, body) }
    }

    /// Moves the bytes out as an array, leaving this empty: a heap string's own array, which
    /// is then uniquely referenced (if nothing else holds this value) and can grow in place.
    @inline(__always)
    mutating func takeArray() -> [UInt8] {
        let taken = array
        storage = .inline(.zero)
        return taken
    }

    /// The decimal digits of `value` (what `INCR` stores), inline: at most 20 bytes, so only
    /// values beyond ±10^14 or so go to the heap.
    static func decimal(_ value: Int64) -> SmallBytes {
        var scratch: (UInt64, UInt64, UInt64) = (0, 0, 0)
        return Swift.withUnsafeMutableBytes(of: &scratch) { raw -> SmallBytes in
            var magnitude = value.magnitude
            var index = raw.count
            repeat {
                index -= 1
                raw[index] = UInt8(ascii: "0") + UInt8(truncatingIfNeeded: magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            if value < 0 {
                index -= 1
                raw[index] = UInt8(ascii: "-")
            }
            return SmallBytes(UnsafeRawBufferPointer(rebasing: raw[index...]))
        }
    }

    /// The bytes as an array (a heap string's own array, not a copy).
    var array: [UInt8] {
        switch storage {
        case .inline: return withUnsafeBytes { Array($0) }
        case .heap(let bytes): return bytes
        }
    }

    /// Whether these are exactly `bytes`.
    @inline(__always)
    func equals(_ bytes: [UInt8]) -> Bool {
        let count = bytes.count
        switch storage {
        case .inline(var inline):
            guard Int(inline.count.rawValue) == count else { return false }
            if count == 0 { return true }
            return Swift.withUnsafeBytes(of: &inline) { raw in
                bytes.withUnsafeBytes { memcmp(raw.baseAddress!, $0.baseAddress!, count) == 0 }
            }
        case .heap(let heap):
            return ByteHash.equal(heap, bytes)
        }
    }
}

extension SmallBytes: Equatable {
    static func == (a: SmallBytes, b: SmallBytes) -> Bool {
        switch (a.storage, b.storage) {
        case (.inline(let x), .inline(let y)):
            // Canonical: the unused bytes are zero, so the two words decide.
            return x.word == y.word && x.half == y.half && x.quarter == y.quarter && x.byte == y.byte
                && x.count == y.count
        case (.heap(let x), .heap(let y)):
            return ByteHash.equal(x, y)
        default:
            return false  // canonical: the same bytes are never stored both ways
        }
    }
}

extension SmallBytes: ExpressibleByStringLiteral {
    init(stringLiteral text: String) {
        self.init(Array(text.utf8))
    }
}

extension SmallBytes: CustomStringConvertible {
    var description: String { String(decoding: array, as: UTF8.self) }
}
