/// What a line reader reports, in order, for one input stream.
public enum LineEvent: Sendable, Equatable, CustomStringConvertible {
    /// A complete line, without its `\n` or `\r\n`. NUL bytes are kept.
    case line(String)
    /// A line longer than the reader's `maxLineLength`, skipped: its length in bytes (without
    /// the terminator). Reading resumes with the next line.
    case tooLong(Int)
    /// A line that is not valid UTF-8, skipped: its length in bytes.
    case invalidUTF8(Int)
    /// The input ended. Reported once, after the last line (a final line without `\n` included).
    case endOfFile
    /// Reading failed with this `errno`. Reported once; the reader is then cancelled.
    case error(Int32)

    public var description: String {
        switch self {
        case .line(let text): return "line(\(text.debugDescription))"
        case .tooLong(let n): return "tooLong(\(n) bytes)"
        case .invalidUTF8(let n): return "invalidUTF8(\(n) bytes)"
        case .endOfFile: return "endOfFile"
        case .error(let code): return "error(errno \(code))"
        }
    }
}

/// Splits a byte stream into `LineEvent`s: the rules behind `EventLoop.readLines`, usable on
/// their own (for sockets read elsewhere, or files).
///
/// Lines end at `\n`; a `\r` before it is dropped (CRLF). A line longer than `maxLineLength`
/// bytes is reported as `.tooLong` when its end arrives and is never buffered whole: memory
/// stays within `maxLineLength` plus the chunk being appended. Invalid UTF-8 is reported as
/// `.invalidUTF8`; NUL bytes are ordinary characters.
public struct LineSplitter: Sendable {
    /// The longest line (in bytes, without its terminator) that is delivered.
    public let maxLineLength: Int
    private var partial: [UInt8] = []
    /// Bytes seen so far of a line that is already too long (it is being skipped).
    private var overlongCount: Int?
    private var overlongEndsWithCR = false
    /// Whether `finish` was called; later input is ignored.
    public private(set) var isFinished = false

    /// A splitter for lines of at most `maxLineLength` bytes (at least 1).
    public init(maxLineLength: Int = 65_536) {
        self.maxLineLength = Swift.max(1, maxLineLength)
    }

    /// Feeds the next bytes of the stream, reporting each line they complete, in order.
    /// - Complexity: O(bytes).
    public mutating func append(_ bytes: ArraySlice<UInt8>, _ emit: (LineEvent) -> Void) {
        feed(bytes, emit)
    }

    /// Feeds bytes from any sequence (a convenience over `append(_: ArraySlice<UInt8>, _:)`).
    public mutating func append(contentsOf bytes: some Sequence<UInt8>, _ emit: (LineEvent) -> Void) {
        append(ArraySlice(bytes), emit)
    }

    /// The splitting itself, over any contiguous run of bytes (an array slice, or a socket's
    /// input read in place, without copying it first). Only the tail of an unfinished line is
    /// kept, at most `maxLineLength` + 1 bytes.
    mutating func feed<Bytes: RandomAccessCollection<UInt8>>(_ bytes: Bytes, _ emit: (LineEvent) -> Void) {
        guard !isFinished else { return }
        var start = bytes.startIndex
        while let newline = bytes[start...].firstIndex(of: 0x0A) {
            completeLine(bytes[start..<newline], emit)
            start = bytes.index(after: newline)
        }
        accumulate(bytes[start...])
    }

    /// Ends the stream: reports a final line without `\n` (or a final too-long line), then
    /// `.endOfFile`. Later calls do nothing.
    public mutating func finish(_ emit: (LineEvent) -> Void) {
        guard !isFinished else { return }
        if overlongCount != nil || !partial.isEmpty {
            completeLine(EmptyCollection<UInt8>(), emit)
        }
        isFinished = true
        emit(.endOfFile)
    }

    private mutating func accumulate(_ bytes: some BidirectionalCollection<UInt8>) {
        guard !bytes.isEmpty else { return }
        if let count = overlongCount {
            overlongCount = count + bytes.count
            overlongEndsWithCR = bytes.last == 0x0D
            return
        }
        partial.append(contentsOf: bytes)
        // One extra byte is allowed for a `\r` that may turn out to be part of a CRLF.
        if partial.count > maxLineLength + 1 {
            overlongCount = partial.count
            overlongEndsWithCR = partial.last == 0x0D
            partial = []
        }
    }

    private mutating func completeLine(_ tail: some BidirectionalCollection<UInt8>, _ emit: (LineEvent) -> Void) {
        if let count = overlongCount {
            let endsWithCR = tail.isEmpty ? overlongEndsWithCR : tail.last == 0x0D
            overlongCount = nil
            overlongEndsWithCR = false
            emit(.tooLong(count + tail.count - (endsWithCR ? 1 : 0)))
            return
        }
        if partial.isEmpty {
            emitLine(tail, emit)
        } else {
            partial.append(contentsOf: tail)
            emitLine(partial[...], emit)
            partial.removeAll(keepingCapacity: partial.capacity <= 4_096)
        }
    }

    private func emitLine<Bytes: BidirectionalCollection<UInt8>>(_ raw: Bytes, _ emit: (LineEvent) -> Void) {
        let bytes = raw.last == 0x0D ? raw.dropLast() : raw[...]
        if bytes.count > maxLineLength {
            emit(.tooLong(bytes.count))
        } else if let text = bytes.withContiguousStorageIfAvailable(utf8String(validating:))
            ?? String(validating: bytes, as: UTF8.self)
        {
            emit(.line(text))
        } else {
            emit(.invalidUTF8(bytes.count))
        }
    }
}

/// `String(validating: bytes, as: UTF8.self)`, quicker for ASCII: the standard library's
/// generic validation looks up the metadata of two generic types at run time on every call
/// (`Unicode.ParseResult`, `UnsafeBufferPointer`: some 900 instructions for a short line, in
/// callgrind, more than the rest of splitting it), where `String(decoding:as:)` of bytes known
/// to be ASCII is a copy. Anything else goes through the validation (nil when invalid).
@inline(__always)
func utf8String(validating bytes: UnsafeBufferPointer<UInt8>) -> String? {
    if isASCII(bytes) { return String(decoding: bytes, as: UTF8.self) }
    return String(validating: bytes, as: UTF8.self)
}

/// Whether every byte is below 0x80 (an OR of them all, which the optimizer vectorizes).
@inline(__always)
func isASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
    var seen: UInt8 = 0
    for byte in bytes { seen |= byte }
    return seen < 0x80
}
