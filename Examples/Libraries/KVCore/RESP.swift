/// The RESP2 reply encoder: each function appends one reply (or an array's header) to an
/// output buffer, with no intermediate `String` for byte data or integers.
///
/// A reply of `n` bytes costs O(n); the buffer grows as `Array` does (amortised O(1) a byte).
public enum RESP {
    /// Appends `+text\r\n`. `text` must not hold CR or LF.
    @inlinable
    public static func appendSimpleString(_ text: StaticString, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "+"))
        appendStatic(text, to: &output)
        appendCRLF(to: &output)
    }

    /// Appends `+text\r\n` for a run-time text; CR and LF in it become spaces.
    public static func appendSimpleString(_ text: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "+"))
        appendSanitised(text, to: &output)
        appendCRLF(to: &output)
    }

    /// Appends `+OK\r\n`.
    @inlinable
    public static func appendOK(to output: inout [UInt8]) {
        appendStatic("+OK\r\n", to: &output)
    }

    /// Appends an error reply, `-message\r\n`. `message` starts with its code (`ERR`,
    /// `WRONGTYPE`, ...); CR and LF in it become spaces, as Redis does.
    public static func appendError(_ message: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "-"))
        appendSanitised(message, to: &output)
        appendCRLF(to: &output)
    }

    /// Appends an error reply, `-message\r\n`, from bytes (arguments quoted in an error are
    /// shown byte for byte, as Redis does); CR and LF become spaces.
    public static func appendError(bytes message: [UInt8], to output: inout [UInt8]) {
        output.append(UInt8(ascii: "-"))
        for byte in message { output.append(byte == 13 || byte == 10 ? UInt8(ascii: " ") : byte) }
        appendCRLF(to: &output)
    }

    /// Appends an error reply from a constant, `-message\r\n`.
    @inlinable
    public static func appendError(_ message: StaticString, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "-"))
        appendStatic(message, to: &output)
        appendCRLF(to: &output)
    }

    /// Appends an integer reply, `:n\r\n`.
    @inlinable
    public static func appendInteger(_ value: Int64, to output: inout [UInt8]) {
        output.append(UInt8(ascii: ":"))
        RedisInteger.append(value, to: &output)
        appendCRLF(to: &output)
    }

    /// Appends an integer reply, `:n\r\n`.
    @inlinable
    public static func appendInteger(_ value: Int, to output: inout [UInt8]) {
        appendInteger(Int64(value), to: &output)
    }

    /// Appends a bulk string, `$len\r\nbytes\r\n` (binary-safe).
    @inlinable
    public static func appendBulkString(_ bytes: [UInt8], to output: inout [UInt8]) {
        output.append(UInt8(ascii: "$"))
        RedisInteger.append(Int64(bytes.count), to: &output)
        appendCRLF(to: &output)
        output.append(contentsOf: bytes)
        appendCRLF(to: &output)
    }

    /// Appends a bulk string, `$len\r\nbytes\r\n`, from the keyspace's inline-or-heap bytes.
    @inline(__always)
    static func appendBulkString(_ bytes: SmallBytes, to output: inout [UInt8]) {
        bytes.withUnsafeBytes { raw in
            output.append(UInt8(ascii: "$"))
            RedisInteger.append(Int64(raw.count), to: &output)
            appendCRLF(to: &output)
            output.append(contentsOf: raw)
            appendCRLF(to: &output)
        }
    }

    /// Appends a bulk string holding the UTF-8 of `text`.
    public static func appendBulkString(_ text: String, to output: inout [UInt8]) {
        var text = text
        text.withUTF8 { utf8 in
            output.append(UInt8(ascii: "$"))
            RedisInteger.append(Int64(utf8.count), to: &output)
            appendCRLF(to: &output)
            output.append(contentsOf: utf8)
            appendCRLF(to: &output)
        }
    }

    /// Appends a bulk string holding the decimal digits of `value` (what `INCR`'s value is
    /// when read back with `GET`).
    public static func appendBulkInteger(_ value: Int64, to output: inout [UInt8]) {
        var digits: [UInt8] = []
        digits.reserveCapacity(20)
        RedisInteger.append(value, to: &digits)
        appendBulkString(digits, to: &output)
    }

    /// Appends the null bulk string, `$-1\r\n` (a missing value).
    @inlinable
    public static func appendNullBulk(to output: inout [UInt8]) {
        appendStatic("$-1\r\n", to: &output)
    }

    /// Appends an array header, `*count\r\n`; the caller appends the `count` elements next.
    @inlinable
    public static func appendArrayHeader(_ count: Int, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "*"))
        RedisInteger.append(Int64(count), to: &output)
        appendCRLF(to: &output)
    }

    /// Appends the null array, `*-1\r\n`.
    @inlinable
    public static func appendNullArray(to output: inout [UInt8]) {
        appendStatic("*-1\r\n", to: &output)
    }

    /// Appends the empty array, `*0\r\n`.
    @inlinable
    public static func appendEmptyArray(to output: inout [UInt8]) {
        appendStatic("*0\r\n", to: &output)
    }

    /// Appends an array of bulk strings.
    public static func appendArray(of elements: [[UInt8]], to output: inout [UInt8]) {
        appendArrayHeader(elements.count, to: &output)
        for element in elements {
            appendBulkString(element, to: &output)
        }
    }

    // MARK: Pieces

    @inlinable @inline(__always)
    static func appendCRLF(to output: inout [UInt8]) {
        output.append(13)
        output.append(10)
    }

    @inlinable @inline(__always)
    static func appendStatic(_ text: StaticString, to output: inout [UInt8]) {
        output.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    static func appendSanitised(_ text: String, to output: inout [UInt8]) {
        for byte in text.utf8 {
            output.append(byte == 13 || byte == 10 ? UInt8(ascii: " ") : byte)
        }
    }
}
