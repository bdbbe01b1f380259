#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An incremental RESP2 request parser for one connection, with Redis 7.0's rules
/// (`processInputBuffer`, `processMultibulkBuffer`, `processInlineBuffer`).
///
/// Feed it whatever the socket gave, in pieces of any size (a byte at a time or a hundred
/// thousand pipelined commands at once) with `append(_:)`, then call `next()` until it returns
/// `nil` (it needs more bytes). Each `.command` is one request's arguments, binary-safe.
///
/// ## Requests
/// A request that starts with `*` is a multibulk one (`*N\r\n` then `N` times `$len\r\n`,
/// `len` bytes and two more bytes, which, as in Redis, are skipped without being looked at).
/// `*0` and negative counts are empty requests and are skipped. Any other request is an inline
/// one: a line up to `\n` (a `\r` before it is dropped), split at blanks, with Redis's quoting
/// (`"..."` with `\n \r \t \b \a \xHH \\ \"` escapes, `'...'` with `\'`; a closing quote must
/// be followed by a blank or the end). Empty lines are skipped.
///
/// ## Errors
/// A malformed or too large request makes `next()` return `.protocolError` once, with
/// Redis's exact text; the server replies with it, after the replies of the requests before
/// it, and then closes the connection (the parser returns `nil` from then on). Limits are
/// checked before anything is allocated for the request:
/// - a bulk length above `Limits.maxBulkLength` (`proto-max-bulk-len`), negative or not an
///   integer: `ERR Protocol error: invalid bulk length`;
/// - a multibulk count above `Limits.maxMultibulkLength` or not an integer:
///   `ERR Protocol error: invalid multibulk length`;
/// - more than `Limits.maxInlineLength` bytes without the end of the line:
///   `ERR Protocol error: too big inline request`, `... too big mbulk count string`,
///   `... too big bulk count string`;
/// - an argument that does not start with `$`: `ERR Protocol error: expected '$', got 'X'`;
/// - an inline request with an open quote: `ERR Protocol error: unbalanced quotes in request`.
///
/// As in Redis (whose line search is `strchr`), a NUL byte before the end of a header or
/// inline line hides the end: the line waits for more bytes until it is too big.
///
/// ## Cost
/// Each byte is scanned once (a partial line is not searched again when more bytes come);
/// an argument is one copy from the buffer. Consumed bytes are dropped when the buffer is
/// empty, or moved away in one `memmove` once they are most of it, so the buffer holds about
/// the unparsed tail.
public struct RESPParser: Sendable {
    /// The sizes the parser refuses.
    public struct Limits: Sendable, Hashable {
        /// The largest bulk argument (`proto-max-bulk-len`; Redis's default 512 MB).
        public var maxBulkLength: Int
        /// The largest argument count of a multibulk request (Redis 7.0: `INT_MAX`).
        public var maxMultibulkLength: Int
        /// The most bytes an inline request, or a header line, may take before its end is seen
        /// (Redis's `PROTO_INLINE_MAX_SIZE`, 64 KiB).
        public var maxInlineLength: Int

        /// Creates limits; the defaults are Redis 7.0's.
        public init(
            maxBulkLength: Int = 512 * 1024 * 1024,
            maxMultibulkLength: Int = Int(Int32.max),
            maxInlineLength: Int = 64 * 1024
        ) {
            self.maxBulkLength = maxBulkLength
            self.maxMultibulkLength = maxMultibulkLength
            self.maxInlineLength = maxInlineLength
        }
    }

    /// A protocol error: the reply to send before closing the connection.
    public struct ProtocolError: Error, Sendable, Hashable, CustomStringConvertible {
        /// The error reply's bytes without its `-` and CRLF, e.g.
        /// `ERR Protocol error: invalid bulk length` (`expected '$', got 'X'` holds the raw byte).
        public let messageBytes: [UInt8]

        /// Creates an error with its reply text (`ERR Protocol error: ...`).
        public init(message: String) {
            self.messageBytes = Array(message.utf8)
        }

        init(messageBytes: [UInt8]) {
            self.messageBytes = messageBytes
        }

        /// The reply text (a byte that is not UTF-8 shows as U+FFFD).
        public var message: String { String(decoding: messageBytes, as: UTF8.self) }

        /// `message`.
        public var description: String { message }

        /// Appends the reply (`-message\r\n`) to `output`.
        public func appendReply(to output: inout [UInt8]) {
            RESP.appendError(bytes: messageBytes, to: &output)
        }
    }

    /// What `next()` found.
    public enum Event: Sendable, Hashable {
        /// One complete request: its arguments (at least one), the command name first.
        case command([[UInt8]])
        /// Malformed input: reply with it, then close the connection. Reported once.
        case protocolError(ProtocolError)
    }

    /// The limits in force; a change applies from the next request header on.
    public var limits: Limits

    private var buffer: [UInt8] = []
    private var position = 0
    /// Where the search for the current line's end goes on (nothing before it is looked at again).
    private var scanFrom = 0
    private var lineHidden = false  // a NUL byte came before the end of the current line
    private var kind: Kind = .unknown
    private var remaining = 0  // arguments still to read of the current multibulk request
    private var bulkLength = -1  // of the argument being read, or -1 before its header
    private var arguments: [[UInt8]] = []
    private var failed = false

    private enum Kind: Sendable { case unknown, inline, multibulk }

    /// Creates a parser with `limits`.
    public init(limits: Limits = Limits()) {
        self.limits = limits
    }

    /// Bytes received and not yet consumed by a complete request.
    public var bufferedByteCount: Int { buffer.count - position }

    /// Whether a protocol error was reported (the parser ignores everything after it).
    public var hasFailed: Bool { failed }

    /// Adds received bytes. O(n) in their count (one copy).
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard !failed, !bytes.isEmpty else { return }
        makeRoom()
        buffer.append(contentsOf: bytes)
    }

    /// Adds received bytes. O(n) in their count.
    public mutating func append<Bytes: Sequence>(contentsOf bytes: Bytes) where Bytes.Element == UInt8 {
        guard !failed else { return }
        makeRoom()
        buffer.append(contentsOf: bytes)
    }

    private mutating func makeRoom() {
        if position == buffer.count {
            if position > 0 {
                buffer.removeAll(keepingCapacity: true)
                scanFrom -= position
                position = 0
            }
        } else if position >= 4096 && position * 2 >= buffer.count {
            buffer.removeSubrange(0..<position)
            scanFrom -= position
            position = 0
        }
    }

    /// The next complete request, a protocol error, or `nil` when more bytes are needed.
    ///
    /// Amortised O(size of the request); a call that finds nothing new costs O(1) plus the
    /// bytes added since the last call.
    public mutating func next() -> Event? {
        if failed { return nil }
        let bytes = buffer  // shares the storage: `self` stays free to change below
        let result = bytes.withUnsafeBufferPointer { parse($0) }
        if position == buffer.count && position > 0 && kind == .unknown {
            buffer.removeAll(keepingCapacity: true)
            scanFrom = 0
            position = 0
        }
        return result
    }

    private mutating func fail(_ message: String) -> Event {
        fail(bytes: Array(message.utf8))
    }

    private mutating func fail(bytes: [UInt8]) -> Event {
        failed = true
        arguments = []
        return .protocolError(ProtocolError(messageBytes: bytes))
    }

    /// The end of the line that starts at `position`: the index of the first `terminator`
    /// at or after `scanFrom`, or nil (no terminator yet, or a NUL before it).
    @inline(__always)
    private mutating func findLineEnd(_ base: UnsafePointer<UInt8>, end: Int, terminator: UInt8) -> Int? {
        if lineHidden { return nil }
        let from = scanFrom
        guard from < end else { return nil }
        let found = memchr(base + from, Int32(terminator), end - from)
        let stop = found.map { UnsafeRawPointer($0) - UnsafeRawPointer(base) } ?? end
        if stop > from, memchr(base + from, 0, stop - from) != nil {
            lineHidden = true
            return nil
        }
        if found == nil {
            scanFrom = end
            return nil
        }
        scanFrom = stop
        return stop
    }

    private mutating func parse(_ input: UnsafeBufferPointer<UInt8>) -> Event? {
        guard let base = input.baseAddress else { return nil }
        let end = input.count
        while position < end {
            if kind == .unknown {
                kind = base[position] == UInt8(ascii: "*") ? .multibulk : .inline
                scanFrom = position
                lineHidden = false
            }
            if kind == .inline {
                guard let newline = findLineEnd(base, end: end, terminator: 10) else {
                    if end - position > limits.maxInlineLength {
                        return fail("ERR Protocol error: too big inline request")
                    }
                    return nil
                }
                var lineEnd = newline
                if lineEnd > position && base[lineEnd - 1] == 13 { lineEnd -= 1 }
                let line = UnsafeBufferPointer(start: base + position, count: lineEnd - position)
                position = newline + 1
                kind = .unknown
                guard let split = InlineSplitter.split(line) else {
                    return fail("ERR Protocol error: unbalanced quotes in request")
                }
                if split.isEmpty { continue }
                return .command(split)
            }
            // Multibulk.
            if remaining == 0 {
                guard let cr = findLineEnd(base, end: end, terminator: 13) else {
                    if end - position > limits.maxInlineLength {
                        return fail("ERR Protocol error: too big mbulk count string")
                    }
                    return nil
                }
                if cr > end - 2 { return nil }
                let digits = UnsafeBufferPointer(start: base + position + 1, count: cr - position - 1)
                guard let count = RedisInteger.parse(digits), count <= Int64(limits.maxMultibulkLength) else {
                    return fail("ERR Protocol error: invalid multibulk length")
                }
                position = cr + 2
                scanFrom = position
                if count <= 0 {
                    kind = .unknown
                    continue
                }
                remaining = Int(count)
                bulkLength = -1
                arguments = []
                arguments.reserveCapacity(min(remaining, 1024))
            }
            while remaining > 0 {
                if bulkLength == -1 {
                    guard let cr = findLineEnd(base, end: end, terminator: 13) else {
                        if end - position > limits.maxInlineLength {
                            return fail("ERR Protocol error: too big bulk count string")
                        }
                        return nil
                    }
                    if cr > end - 2 { return nil }
                    let first = base[position]
                    if first != UInt8(ascii: "$") {
                        // The byte as it came (CR and LF become spaces when the reply is written).
                        return fail(bytes: Array("ERR Protocol error: expected '$', got '".utf8) + [first, 39])
                    }
                    let digits = UnsafeBufferPointer(start: base + position + 1, count: cr - position - 1)
                    guard let length = RedisInteger.parse(digits), length >= 0,
                        length <= Int64(limits.maxBulkLength)
                    else {
                        return fail("ERR Protocol error: invalid bulk length")
                    }
                    position = cr + 2
                    bulkLength = Int(length)
                }
                if end - position < bulkLength + 2 { return nil }
                arguments.append(Array(UnsafeBufferPointer(start: base + position, count: bulkLength)))
                position += bulkLength + 2
                scanFrom = position
                bulkLength = -1
                remaining -= 1
            }
            kind = .unknown
            let command = arguments
            arguments = []
            return .command(command)
        }
        return nil
    }
}

/// Redis's `sdssplitargs`: an inline request's arguments.
enum InlineSplitter {
    @inline(__always)
    static func isSpace(_ byte: UInt8) -> Bool {
        byte == 32 || (byte >= 9 && byte <= 13)
    }

    static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x30...0x39: return byte - 0x30
        case 0x61...0x66: return byte - 0x61 + 10
        case 0x41...0x46: return byte - 0x41 + 10
        default: return nil
        }
    }

    /// The arguments of `line`, or nil when a quote is not closed (or a closing quote is not
    /// followed by a blank).
    static func split(_ line: UnsafeBufferPointer<UInt8>) -> [[UInt8]]? {
        var result: [[UInt8]] = []
        let count = line.count
        var i = 0
        @inline(__always) func at(_ index: Int) -> UInt8 { index < count ? line[index] : 0 }
        while true {
            while i < count && isSpace(line[i]) { i += 1 }
            if i >= count { return result }
            var current: [UInt8] = []
            var inDouble = false
            var inSingle = false
            var done = false
            while !done {
                let c = at(i)
                if inDouble {
                    if c == UInt8(ascii: "\\") && at(i + 1) == UInt8(ascii: "x"),
                        let high = hexValue(at(i + 2)), let low = hexValue(at(i + 3))
                    {
                        current.append(high * 16 + low)
                        i += 3
                    } else if c == UInt8(ascii: "\\") && at(i + 1) != 0 {
                        i += 1
                        switch line[i] {
                        case UInt8(ascii: "n"): current.append(10)
                        case UInt8(ascii: "r"): current.append(13)
                        case UInt8(ascii: "t"): current.append(9)
                        case UInt8(ascii: "b"): current.append(8)
                        case UInt8(ascii: "a"): current.append(7)
                        default: current.append(line[i])
                        }
                    } else if c == UInt8(ascii: "\"") {
                        if at(i + 1) != 0 && !isSpace(at(i + 1)) { return nil }
                        done = true
                    } else if c == 0 {
                        return nil
                    } else {
                        current.append(c)
                    }
                } else if inSingle {
                    if c == UInt8(ascii: "\\") && at(i + 1) == UInt8(ascii: "'") {
                        i += 1
                        current.append(UInt8(ascii: "'"))
                    } else if c == UInt8(ascii: "'") {
                        if at(i + 1) != 0 && !isSpace(at(i + 1)) { return nil }
                        done = true
                    } else if c == 0 {
                        return nil
                    } else {
                        current.append(c)
                    }
                } else {
                    switch c {
                    case 32, 10, 13, 9, 0:
                        done = true
                    case UInt8(ascii: "\""):
                        inDouble = true
                    case UInt8(ascii: "'"):
                        inSingle = true
                    default:
                        // An unquoted run: copy it whole.
                        var j = i + 1
                        while j < count {
                            let d = line[j]
                            if d == 32 || d == 10 || d == 13 || d == 9 || d == UInt8(ascii: "\"") || d == UInt8(ascii: "'") {
                                break
                            }
                            j += 1
                        }
                        current.append(contentsOf: UnsafeBufferPointer(rebasing: line[i..<j]))
                        i = j - 1
                    }
                }
                if i < count { i += 1 }
            }
            result.append(current)
        }
    }
}
