// The byte-level reading that HTTP/1.x heads share, requests (the server's engine) and
// responses (the client): lines ended by LF with or without a CR before it, `name: value`
// fields, names matched without regard to case. Over a buffer the caller holds still; no
// String is made until a caller asks for one.

/// A head's bytes, read a line at a time. Loop thread (it is a view into memory the caller
/// keeps alive and unchanged for as long as it reads).
struct HeadBytes {
    let buffer: UnsafeBufferPointer<UInt8>
    /// Where the next line starts.
    private(set) var position = 0

    init(_ buffer: UnsafeBufferPointer<UInt8>) { self.buffer = buffer }

    /// The next line, without its LF and a CR before it; nil at the end of the buffer.
    mutating func nextLine() -> Range<Int>? {
        guard position < buffer.count else { return nil }
        let start = position
        var end = start
        while end < buffer.count, buffer[end] != 0x0A { end += 1 }
        position = end < buffer.count ? end + 1 : end
        if end > start, buffer[end - 1] == 0x0D { end -= 1 }
        return start..<end
    }

    /// The bytes of `range` as a string (invalid UTF-8 repaired).
    func string(_ range: Range<Int>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: buffer[range]), as: UTF8.self)
    }

    /// The value of a field line whose colon is at `colon`: what follows it, without the
    /// optional whitespace around it.
    func value(of line: Range<Int>, after colon: Int) -> Range<Int> {
        var start = colon + 1
        var end = line.upperBound
        while start < end, buffer[start] == 0x20 || buffer[start] == 0x09 { start += 1 }
        while end > start, buffer[end - 1] == 0x20 || buffer[end - 1] == 0x09 { end -= 1 }
        return start..<end
    }

    /// Whether `range` holds `lowercase` (ASCII, lowercase already) in any case.
    func matches(_ range: Range<Int>, _ lowercase: StaticString) -> Bool {
        guard range.count == lowercase.utf8CodeUnitCount else { return false }
        let expected = lowercase.utf8Start
        for offset in 0..<range.count {
            let byte = buffer[range.lowerBound + offset]
            if (byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte) != expected[offset] { return false }
        }
        return true
    }

    /// Whether `range` starts with `lowercase` in any case.
    func hasPrefix(_ range: Range<Int>, _ lowercase: StaticString) -> Bool {
        let count = lowercase.utf8CodeUnitCount
        return range.count >= count && matches(range.lowerBound..<(range.lowerBound + count), lowercase)
    }

    /// The first index of `byte` in `range`, or nil.
    func firstIndex(of byte: UInt8, in range: Range<Int>) -> Int? {
        var index = range.lowerBound
        while index < range.upperBound {
            if buffer[index] == byte { return index }
            index += 1
        }
        return nil
    }

    /// The value of `range` as a decimal number of at most 18 digits (nothing else); nil
    /// otherwise.
    func decimal(_ range: Range<Int>) -> Int? {
        guard !range.isEmpty, range.count <= 18 else { return nil }
        var value = 0
        for index in range {
            let byte = buffer[index]
            guard byte >= 0x30, byte <= 0x39 else { return nil }
            value = value * 10 + Int(byte - 0x30)
        }
        return value
    }
}
