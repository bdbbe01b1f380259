#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A fast seeded 64-bit hash of byte strings (8 bytes a step, a multiply–xorshift mix and a
/// murmur3 finaliser), for the key tables. The seed is random per process, so a client cannot
/// choose keys that collide.
enum ByteHash {
    static let seed: UInt64 = UInt64.random(in: 1...UInt64.max)

    @inline(__always)
    static func mix(_ value: UInt64) -> UInt64 {
        var x = value
        x ^= x >> 33
        x &*= 0xff51_afd7_ed55_8ccd
        x ^= x >> 33
        x &*= 0xc4ce_b9fe_1a85_ec53
        x ^= x >> 33
        return x
    }

    @inline(__always)
    static func hash(_ bytes: [UInt8]) -> UInt64 {
        bytes.withUnsafeBytes { hash($0) }
    }

    static func hash(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        let count = bytes.count
        var h = seed ^ (UInt64(truncatingIfNeeded: count) &* 0x9e37_79b9_7f4a_7c15)
        guard let base = bytes.baseAddress else { return mix(h) }
        var offset = 0
        while offset + 8 <= count {
            let word = base.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
            h = (h ^ word) &* 0x9e37_79b9_7f4a_7c15
            h ^= h >> 29
            offset += 8
        }
        if offset < count {
            var word: UInt64 = 0
            var shift: UInt64 = 0
            while offset < count {
                word |= UInt64(base.load(fromByteOffset: offset, as: UInt8.self)) << shift
                shift += 8
                offset += 1
            }
            h = (h ^ word) &* 0x9e37_79b9_7f4a_7c15
            h ^= h >> 29
        }
        return mix(h)
    }

    @inline(__always)
    static func hash(_ bytes: SmallBytes) -> UInt64 {
        bytes.withUnsafeBytes { hash($0) }
    }

    /// Byte-for-byte equality, with `memcmp`.
    @inline(__always)
    static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        let count = a.count
        guard count == b.count else { return false }
        if count == 0 { return true }
        return a.withUnsafeBytes { ra in
            b.withUnsafeBytes { rb in memcmp(ra.baseAddress!, rb.baseAddress!, count) == 0 }
        }
    }
}
