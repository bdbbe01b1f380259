// A text message's UTF-8 check (RFC 6455 §8.1, RFC 3629), fragment by fragment: the decoder's
// (WebSocketFrame.swift).

/// Checks UTF-8 as it arrives in pieces (a message's fragments): fails at the first byte that
/// cannot start or continue a well-formed sequence (RFC 3629: no overlong forms, no surrogates,
/// nothing past U+10FFFF), so a bad text message is refused before it is complete.
///
/// Between characters, ASCII is skipped eight bytes at a time (a word whose bytes all have
/// their high bit clear); the state machine takes only what is not ASCII, a byte at a time, and
/// keeps its state from one piece to the next (a character split across fragments).
struct UTF8Validator: Sendable {
    /// Continuation bytes the current sequence still needs.
    private var needed = 0
    /// The range the next continuation byte must be in (narrower after E0, ED, F0, F4).
    private var lower: UInt8 = 0x80
    private var upper: UInt8 = 0xBF

    /// The high bit of each of a word's eight bytes: a word of ASCII has none of them set.
    private static let highBits: UInt64 = 0x8080_8080_8080_8080

    /// Whether the bytes so far end at a character boundary.
    var isAtBoundary: Bool { needed == 0 }

    mutating func reset() {
        needed = 0
        lower = 0x80
        upper = 0xBF
    }

    /// Takes `bytes`; false at the first that is not well-formed.
    mutating func validate(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let base = bytes.baseAddress else { return true }
        // The state in locals for the loop (registers), stored back at the end.
        var needed = self.needed, lower = self.lower, upper = self.upper
        defer { self.needed = needed; self.lower = lower; self.upper = upper }
        let count = bytes.count
        var i = 0
        while i < count {
            let byte = base.load(fromByteOffset: i, as: UInt8.self)
            i &+= 1
            if needed == 0 {
                if byte < 0x80 {
                    // ASCII between characters. A run of it (the next byte ASCII too, not a
                    // space between words of another script): skip it a word at a time (two
                    // while they last), then to the first byte of the word that is not ASCII.
                    guard i < count, base.load(fromByteOffset: i, as: UInt8.self) < 0x80 else { continue }
                    while i &+ 16 <= count {
                        let first = base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                        let second = base.loadUnaligned(fromByteOffset: i &+ 8, as: UInt64.self)
                        if (first | second) & Self.highBits != 0 { break }
                        i &+= 16
                    }
                    while i &+ 8 <= count {
                        // Little-endian, the lowest set bit is in the byte first in memory.
                        let high = UInt64(littleEndian: base.loadUnaligned(fromByteOffset: i, as: UInt64.self)) & Self.highBits
                        if high != 0 {
                            i &+= high.trailingZeroBitCount &>> 3
                            break
                        }
                        i &+= 8
                    }
                    continue
                }
                switch byte {
                case 0xC2...0xDF: needed = 1; lower = 0x80; upper = 0xBF
                case 0xE0: needed = 2; lower = 0xA0; upper = 0xBF
                case 0xE1...0xEC, 0xEE...0xEF: needed = 2; lower = 0x80; upper = 0xBF
                case 0xED: needed = 2; lower = 0x80; upper = 0x9F
                case 0xF0: needed = 3; lower = 0x90; upper = 0xBF
                case 0xF1...0xF3: needed = 3; lower = 0x80; upper = 0xBF
                case 0xF4: needed = 3; lower = 0x80; upper = 0x8F
                default: return false
                }
            } else {
                guard byte >= lower && byte <= upper else { return false }
                needed &-= 1
                lower = 0x80
                upper = 0xBF
            }
        }
        return true
    }

    mutating func validate(_ bytes: [UInt8]) -> Bool { bytes.withUnsafeBytes { validate($0) } }
}
