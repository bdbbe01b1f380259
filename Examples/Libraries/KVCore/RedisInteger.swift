/// Redis's integer syntax (`string2ll`): what counts as an integer in a command argument, a
/// length in the protocol, or a string value that `INCR` may change.
///
/// Accepted: `0`, or an optional `-` followed by a digit 1–9 and more digits, within `Int64`.
/// Refused: the empty string, a leading `+`, leading zeros (`01`), `-0`, spaces, and anything
/// of 21 bytes or more. O(n) in the length (at most 20 bytes are looked at).
public enum RedisInteger {
    /// The value of `bytes` under Redis's integer syntax, or `nil` when it is not one.
    @inlinable
    public static func parse(_ bytes: [UInt8]) -> Int64? {
        bytes.withUnsafeBufferPointer { parse($0) }
    }

    /// The value of `bytes` under Redis's integer syntax, or `nil` when it is not one.
    public static func parse(_ bytes: UnsafeBufferPointer<UInt8>) -> Int64? {
        let count = bytes.count
        if count == 0 || count >= 21 { return nil }
        if count == 1 {
            let digit = bytes[0] &- 0x30
            return digit <= 9 ? Int64(digit) : nil
        }
        var index = 0
        let negative = bytes[0] == UInt8(ascii: "-")
        if negative {
            index = 1
        }
        let first = bytes[index] &- 0x30
        guard first >= 1 && first <= 9 else { return nil }
        var magnitude = UInt64(first)
        index += 1
        while index < count {
            let digit = bytes[index] &- 0x30
            guard digit <= 9 else { return nil }
            let (times10, overflow1) = magnitude.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(UInt64(digit))
            if overflow1 || overflow2 { return nil }
            magnitude = sum
            index += 1
        }
        if negative {
            if magnitude > UInt64(Int64.max) + 1 { return nil }
            return magnitude == UInt64(Int64.max) + 1 ? Int64.min : -Int64(magnitude)
        }
        return magnitude > UInt64(Int64.max) ? nil : Int64(magnitude)
    }

    /// Appends the decimal digits of `value` (with a `-` when negative) to `output`, without
    /// going through `String`.
    @inline(__always)
    public static func append(_ value: Int64, to output: inout [UInt8]) {
        if value >= 0 && value < 10 {
            output.append(UInt8(truncatingIfNeeded: value) &+ 0x30)
            return
        }
        var magnitude = value.magnitude
        // 20 digits and a sign fit in 24 bytes.
        var buffer: (UInt64, UInt64, UInt64) = (0, 0, 0)
        withUnsafeMutableBytes(of: &buffer) { raw in
            var position = 24
            repeat {
                let (quotient, remainder) = magnitude.quotientAndRemainder(dividingBy: 10)
                position -= 1
                raw[position] = UInt8(truncatingIfNeeded: remainder) &+ 0x30
                magnitude = quotient
            } while magnitude != 0
            if value < 0 {
                position -= 1
                raw[position] = UInt8(ascii: "-")
            }
            output.append(contentsOf: UnsafeRawBufferPointer(rebasing: raw[position..<24]))
        }
    }

    /// The decimal digits of `value`, as bytes.
    public static func bytes(_ value: Int64) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(20)
        append(value, to: &output)
        return output
    }

    /// A `SCAN` cursor as Redis reads one (`strtoul` in base 10): optional sign, digits, no
    /// leading space; a negative value wraps around; the empty string is 0. `nil` when the text
    /// is not a cursor or does not fit in 64 bits.
    static func parseCursor(_ bytes: [UInt8]) -> UInt64? {
        var index = 0
        var negative = false
        if let first = bytes.first, first == UInt8(ascii: "-") || first == UInt8(ascii: "+") {
            negative = first == UInt8(ascii: "-")
            index = 1
        }
        var value: UInt64 = 0
        var digits = 0
        while index < bytes.count {
            let digit = bytes[index] &- 0x30
            guard digit <= 9 else { return nil }
            let (times10, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(UInt64(digit))
            if overflow1 || overflow2 { return nil }
            value = sum
            index += 1
            digits += 1
        }
        if digits == 0 { return bytes.isEmpty ? 0 : nil }
        return negative ? 0 &- value : value
    }
}
