/// Redis's glob matching (`stringmatchlen`), as `KEYS`, `SCAN ... MATCH` and `CONFIG GET` use it.
///
/// `*` any run of bytes, `?` one byte, `[abc]` one of a set, `[^abc]` none of it, `[a-z]` a
/// range (either order), `\x` the byte `x` itself (also inside brackets). An unclosed `[` takes
/// the rest of the pattern as its set. Ranges compare bytes as C's signed `char`, as Redis does
/// on x86-64 Linux (so bytes from 0x80 sort below ASCII). Binary-safe. Like Redis 7.0, a `*` whose rest fails everywhere stops the search, so the cost
/// is O(pattern × string) at worst.
public struct GlobPattern: Sendable, Hashable {
    /// The pattern's bytes.
    public let bytes: [UInt8]
    /// Whether letters match regardless of case (`CONFIG GET` matches that way).
    public let ignoresCase: Bool
    /// Whether the pattern is exactly `*`, which Redis's `KEYS` and `SCAN` take as "every key"
    /// (the empty key included) without matching.
    public let matchesEverything: Bool

    /// Creates a pattern.
    public init(_ bytes: [UInt8], ignoresCase: Bool = false) {
        self.bytes = bytes
        self.ignoresCase = ignoresCase
        self.matchesEverything = bytes == [UInt8(ascii: "*")]
    }

    /// Whether `string` matches the pattern.
    public func matches(_ string: [UInt8]) -> Bool {
        if matchesEverything { return true }
        return bytes.withUnsafeBufferPointer { pattern in
            string.withUnsafeBufferPointer { string in
                var skipLonger = false
                return Self.match(pattern, 0, string, 0, ignoresCase, &skipLonger)
            }
        }
    }

    /// Whether the keyspace's `string` matches the pattern.
    func matches(_ string: SmallBytes) -> Bool {
        if matchesEverything { return true }
        return string.withUnsafeBytes { raw in
            raw.withMemoryRebound(to: UInt8.self) { string in
                bytes.withUnsafeBufferPointer { pattern in
                    var skipLonger = false
                    return Self.match(pattern, 0, string, 0, ignoresCase, &skipLonger)
                }
            }
        }
    }

    @inline(__always)
    private static func lower(_ byte: UInt8) -> UInt8 {
        byte >= 0x41 && byte <= 0x5a ? byte | 0x20 : byte
    }

    private static func match(
        _ pattern: UnsafeBufferPointer<UInt8>, _ startP: Int,
        _ string: UnsafeBufferPointer<UInt8>, _ startS: Int,
        _ nocase: Bool, _ skipLonger: inout Bool
    ) -> Bool {
        var p = startP
        var s = startS
        let pEnd = pattern.count
        let sEnd = string.count
        while p < pEnd && s < sEnd {
            switch pattern[p] {
            case UInt8(ascii: "*"):
                while p + 1 < pEnd && pattern[p + 1] == UInt8(ascii: "*") { p += 1 }
                if p + 1 == pEnd { return true }
                while s < sEnd {
                    if match(pattern, p + 1, string, s, nocase, &skipLonger) { return true }
                    if skipLonger { return false }
                    s += 1
                }
                skipLonger = true
                return false
            case UInt8(ascii: "?"):
                s += 1
            case UInt8(ascii: "["):
                p += 1
                let negate = p < pEnd && pattern[p] == UInt8(ascii: "^")
                if negate { p += 1 }
                var matched = false
                let c = string[s]
                while true {
                    if p < pEnd && pattern[p] == UInt8(ascii: "\\") && pEnd - p >= 2 {
                        p += 1
                        if pattern[p] == c { matched = true }
                    } else if p < pEnd && pattern[p] == UInt8(ascii: "]") {
                        break
                    } else if p >= pEnd {
                        p -= 1
                        break
                    } else if pEnd - p >= 3 && pattern[p + 1] == UInt8(ascii: "-") {
                        var start = Int(Int8(bitPattern: pattern[p]))
                        var end = Int(Int8(bitPattern: pattern[p + 2]))
                        var value = Int(Int8(bitPattern: c))
                        if start > end { swap(&start, &end) }
                        if nocase {
                            start = Int(Int8(bitPattern: lower(UInt8(bitPattern: Int8(start)))))
                            end = Int(Int8(bitPattern: lower(UInt8(bitPattern: Int8(end)))))
                            value = Int(Int8(bitPattern: lower(c)))
                        }
                        p += 2
                        if value >= start && value <= end { matched = true }
                    } else if nocase ? lower(pattern[p]) == lower(c) : pattern[p] == c {
                        matched = true
                    }
                    p += 1
                }
                if negate { matched = !matched }
                if !matched { return false }
                s += 1
            default:
                if pattern[p] == UInt8(ascii: "\\") && pEnd - p >= 2 { p += 1 }
                let equal = nocase ? lower(pattern[p]) == lower(string[s]) : pattern[p] == string[s]
                if !equal { return false }
                s += 1
            }
            p += 1
            if s == sEnd {
                while p < pEnd && pattern[p] == UInt8(ascii: "*") { p += 1 }
                break
            }
        }
        return p == pEnd && s == sEnd
    }
}
