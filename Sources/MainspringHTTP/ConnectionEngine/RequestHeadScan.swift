// The head guard's scan: where the current request head stands as its bytes arrive, a piece at a
// time, before the head is parsed (RequestHead.swift). It counts the bytes of the head (request
// line and header fields, up to the blank line that ends it), so that a head over
// `maxHeaderBytes` is answered 431 as soon as it passes the limit, whatever is still to come.
//
// It also checks the head's framing before anything is parsed or routed (RFC 9112 §6.3, §5): a
// head that two readers could frame differently — one taking the first of two `Content-Length`s,
// another the last; one reading a `Transfer-Encoding` it does not know as none — would give a
// front end and this server different request boundaries (request smuggling). Two lengths that
// differ, a length that is not all digits, `Transfer-Encoding` beside `Content-Length`, and a
// control character, a bare CR, a folded line or whitespace in a field name are answered 400; a
// transfer coding other than `chunked` 501; an HTTP/1.1 request without exactly one `Host` 400.
// The connection closes after the answer (`EngineConnection.refuse`).
import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// The scan of one request head (reset for each request of a connection). Loop thread only.
struct RequestHeadScan {
    let maxHeaderBytes: Int
    /// Whether the scan keeps the request target's path (load shedding decides on it before
    /// the body is read); off, the request line costs nothing more than its last bytes.
    let keepsTargetPath: Bool
    /// The request target up to its `?`, as it came (at most `maxTargetPath` bytes: a longer
    /// one is kept empty, and matches no exempt path). Kept when `keepsTargetPath`.
    private(set) var targetPath: [UInt8] = []
    /// Where the request line stands for `targetPath`: 0 the method, 1 the target, 2 past it.
    private var targetPhase: UInt8 = 0
    static let maxTargetPath = 256
    /// Bytes of the head seen so far.
    private(set) var bytes = 0
    /// The current line has a byte other than CR so far.
    private var lineHasContent = false
    /// The blank line that ends the head was seen.
    private(set) var isComplete = false
    /// When the head's first byte arrived (monotonic ns; 0 before).
    private(set) var startedAt: UInt64 = 0
    /// When the head was complete, that is when the body started (monotonic ns; 0 before).
    private(set) var bodyStartedAt: UInt64 = 0

    // RFC 9112 §3.2: an HTTP/1.1 request needs exactly one `Host` field. The scan notes the
    // request line's version (its last eight bytes, CRs skipped) and counts the `Host` fields as
    // the lines go by.
    /// Lines of the head completed so far (the request line is line 0).
    private var lineIndex = 0
    /// The request line's last eight bytes other than CR.
    private var lineEnd: UInt64 = 0
    /// Whether the request line ends in `HTTP/1.1`.
    private(set) var isHTTP11 = false
    /// `Host` fields seen.
    private(set) var hostFields = 0

    // The framing fields, a byte at a time through each header line (name, then value).
    /// The current header line is past its colon.
    private var inValue = false
    /// The current line's field name so far: its length, and which of `fieldNames` it may be.
    private var nameLength = 0
    private var nameCandidates: UInt8 = 0b111
    /// What the current line's field is, once its colon has been seen.
    private var field = Field.other
    /// CRs since the line's last other byte: one is allowed right before the LF. (A line of
    /// nothing but CRs is the blank line that ends the head, so more than one is judged only
    /// when another byte or the line's end comes.)
    private var pendingCRs = 0
    /// The current value: where it stands (leading whitespace, the token, trailing whitespace),
    /// the number its digits make so far, how many digits (or letters of `chunked` matched) it
    /// has, and whether it was already found wrong.
    private var valuePhase = ValuePhase.leading
    private var valueNumber = 0
    private var valueDigits = 0
    private var valueBad = false
    /// The first thing found malformed in the head, if any.
    private var malformed: Malformed?
    /// `Content-Length` fields seen, the value of the first, and whether one was not a number
    /// or differed from the first.
    private var contentLengthFields = 0
    private var contentLength = 0
    private var contentLengthInvalid = false
    private var contentLengthsDiffer = false
    /// `Transfer-Encoding` fields seen, and whether one was anything but exactly `chunked`.
    private var transferEncodingFields = 0
    private var transferEncodingOther = false

    /// The header fields the scan looks at.
    private enum Field { case other, host, contentLength, transferEncoding }
    private enum ValuePhase { case leading, token, trailing }
    private enum Malformed {
        case controlCharacter, bareCR, folded, spaceInName

        var reason: String {
            switch self {
            case .controlCharacter: "a header field holds a control character"
            case .bareCR: "a header line holds a CR that is not followed by LF"
            case .folded: "a header line starts with whitespace (obsolete line folding)"
            case .spaceInName: "a header field name holds whitespace"
            }
        }
    }

    /// "host", "content-length", "transfer-encoding": the names `nameCandidates` tracks (bits 0,
    /// 1, 2), lowercased.
    private static let fieldNames: [[UInt8]] = [Array("host".utf8), Array("content-length".utf8),
                                                Array("transfer-encoding".utf8)]
    private static let chunked = Array("chunked".utf8)

    /// Why a complete head is refused before anything is routed.
    enum Refusal: Equatable {
        /// Malformed (no `Host` in HTTP/1.1, or two; framing that could be read two ways: two
        /// different lengths, a length that is not a number, `Transfer-Encoding` beside
        /// `Content-Length`; a control character in a field): 400 with the reason.
        case badRequest(String)
        /// A transfer coding the server does not decode (anything but exactly `chunked`): 501.
        case notImplemented(String)
    }

    /// Why a complete head is refused, if it is: 400, or 501 for a transfer coding other than
    /// `chunked`.
    var problem: Refusal? {
        guard isComplete else { return nil }
        if let malformed { return .badRequest(malformed.reason) }
        if contentLengthInvalid { return .badRequest("Content-Length is not a number (digits only)") }
        if contentLengthsDiffer { return .badRequest("two Content-Length header fields with different values") }
        if transferEncodingFields > 0 {
            if contentLengthFields > 0 { return .badRequest("a request has Transfer-Encoding or Content-Length, not both") }
            if transferEncodingOther { return .notImplemented("only Transfer-Encoding: chunked is supported") }
            if transferEncodingFields > 1 { return .badRequest("Transfer-Encoding: chunked more than once") }
        }
        guard isHTTP11 else { return nil }
        if hostFields == 0 { return .badRequest("an HTTP/1.1 request needs a Host header field") }
        if hostFields > 1 { return .badRequest("an HTTP/1.1 request has exactly one Host header field, not \(hostFields)") }
        return nil
    }

    init(maxHeaderBytes: Int, keepsTargetPath: Bool = false) {
        self.maxHeaderBytes = maxHeaderBytes
        self.keepsTargetPath = keepsTargetPath
    }

    /// Whether the head announces a body (a `Content-Length` over zero, or chunked).
    var declaresBody: Bool { contentLength > 0 || transferEncodingFields > 0 }

    /// Starts over for the next request.
    mutating func reset() {
        if keepsTargetPath {
            targetPath.removeAll(keepingCapacity: true)
            targetPhase = 0
        }
        bytes = 0
        lineHasContent = false
        isComplete = false
        startedAt = 0
        bodyStartedAt = 0
        lineIndex = 0
        lineEnd = 0
        isHTTP11 = false
        hostFields = 0
        startField()
        malformed = nil
        contentLengthFields = 0
        contentLength = 0
        contentLengthInvalid = false
        contentLengthsDiffer = false
        transferEncodingFields = 0
        transferEncodingOther = false
    }

    /// Clears the state of one header line.
    private mutating func startField() {
        inValue = false
        nameLength = 0
        nameCandidates = 0b111
        field = .other
        pendingCRs = 0
        valuePhase = .leading
        valueNumber = 0
        valueDigits = 0
        valueBad = false
    }

    /// "HTTP/1.1" as the register holds it.
    private static let versionTail = Self.pack(Array("HTTP/1.1".utf8))

    private static func pack(_ bytes: [UInt8]) -> UInt64 { bytes.reduce(0) { $0 << 8 | UInt64($1) } }

    /// Notes `count` bytes of the current line: the request line's last bytes; every byte of a
    /// header line (`noteField`).
    @inline(__always)
    private mutating func note(_ start: UnsafeRawPointer, _ count: Int) {
        guard count > 0 else { return }
        let bytes = UnsafeRawBufferPointer(start: start, count: count)
        if lineIndex == 0 {
            if keepsTargetPath && targetPhase < 2 { noteTarget(bytes) }
            // The last eight bytes other than CR (whatever the CRs and however the line arrives).
            var index = count
            var kept = 0
            while index > 0 && kept < 8 {
                index -= 1
                if bytes[index] != 0x0D { kept += 1 }
            }
            while index < count {
                let byte = bytes[index]
                if byte != 0x0D { lineEnd = lineEnd << 8 | UInt64(byte) }
                index += 1
            }
            return
        }
        for byte in bytes { noteField(byte) }
    }

    /// One byte of a header line (not its LF).
    @inline(__always)
    private mutating func noteField(_ byte: UInt8) {
        if byte == 0x0D {
            pendingCRs += 1
            return
        }
        if pendingCRs > 0 { found(.bareCR) }
        if (byte < 0x20 && byte != 0x09) || byte == 0x7F { found(.controlCharacter) }
        if !inValue {
            if byte == 0x3A {  // ":"
                inValue = true
                if nameCandidates != 0 {
                    for index in 0..<3 where nameCandidates & (1 << index) != 0 && Self.fieldNames[index].count == nameLength {
                        field = index == 0 ? .host : index == 1 ? .contentLength : .transferEncoding
                    }
                }
            } else if byte == 0x20 || byte == 0x09 {
                found(nameLength == 0 ? .folded : .spaceInName)
            } else {
                if nameCandidates != 0 {
                    let lower = Self.lowercased(byte)
                    for index in 0..<3 where nameCandidates & (1 << index) != 0 {
                        let name = Self.fieldNames[index]
                        if nameLength >= name.count || name[nameLength] != lower { nameCandidates &= ~(1 << index) }
                    }
                }
                nameLength += 1
            }
            return
        }
        switch field {
        case .other, .host: return
        case .contentLength: noteLengthByte(byte)
        case .transferEncoding: noteCodingByte(byte)
        }
    }

    /// A byte of a `Content-Length` value: optional whitespace, digits, optional whitespace.
    @inline(__always)
    private mutating func noteLengthByte(_ byte: UInt8) {
        let isSpace = byte == 0x20 || byte == 0x09
        switch valuePhase {
        case .leading where isSpace, .trailing where isSpace:
            return
        case .leading, .token:
            if isSpace {
                valuePhase = .trailing
            } else if byte >= 0x30 && byte <= 0x39 && valueDigits < 18 {
                valuePhase = .token
                valueNumber = valueNumber * 10 + Int(byte - 0x30)
                valueDigits += 1
            } else {
                valueBad = true  // a sign, a comma, another character, or more than 18 digits
            }
        case .trailing:
            valueBad = true
        }
    }

    /// A byte of a `Transfer-Encoding` value, compared with `chunked`: leading spaces and
    /// trailing whitespace are dropped, the rest must be `chunked` in any case. A leading tab is
    /// not dropped, so `Transfer-Encoding:<tab>chunked` is a coding other than `chunked` (501).
    @inline(__always)
    private mutating func noteCodingByte(_ byte: UInt8) {
        switch valuePhase {
        case .leading where byte == 0x20:
            return
        case .leading, .token:
            valuePhase = .token
            if byte == 0x20 || byte == 0x09 {
                valuePhase = .trailing
            } else if valueDigits < Self.chunked.count, Self.lowercased(byte) == Self.chunked[valueDigits] {
                valueDigits += 1  // the letters of "chunked" matched so far
            } else {
                valueBad = true
            }
        case .trailing:
            if byte != 0x20 && byte != 0x09 { valueBad = true }
        }
    }

    /// Bytes of the request line, for `targetPath`: the target is what lies between the first
    /// space and the next space or `?`.
    private mutating func noteTarget(_ bytes: UnsafeRawBufferPointer) {
        for byte in bytes {
            if targetPhase == 0 {
                if byte == 0x20 { targetPhase = 1 }
            } else if byte == 0x20 || byte == 0x3F || byte == 0x0D {
                targetPhase = 2
                return
            } else if targetPath.count == Self.maxTargetPath {
                targetPath.removeAll()
                targetPhase = 2
                return
            } else {
                targetPath.append(byte)
            }
        }
    }

    @inline(__always)
    private static func lowercased(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte }

    private mutating func found(_ problem: Malformed) {
        if malformed == nil { malformed = problem }
    }

    /// A line of the head ended.
    private mutating func endLine() {
        if lineIndex == 0 {
            isHTTP11 = lineEnd == Self.versionTail
        } else {
            if pendingCRs > 1 { found(.bareCR) }
            switch field {
            case .other: break
            case .host: hostFields += 1
            case .contentLength:
                if valueBad || valueDigits == 0 {
                    contentLengthInvalid = true
                } else if contentLengthFields == 0 {
                    contentLength = valueNumber
                } else if valueNumber != contentLength {
                    contentLengthsDiffer = true
                }
                contentLengthFields += 1
            case .transferEncoding:
                if valueBad || valueDigits != Self.chunked.count { transferEncodingOther = true }
                transferEncodingFields += 1
            }
            startField()
        }
        lineIndex += 1
        lineEnd = 0
    }

    /// `scanBytes` over `chunk`, without a clock (its stamps are all 1: the engine keeps its
    /// deadlines on its own timer): the engine's entry, and the fuzz harness's. False once the
    /// head is over the limit.
    mutating func scan(_ chunk: UnsafeRawBufferPointer) -> Bool {
        var now: UInt64 = 1
        return scanBytes(chunk, now: &now, clock: nil)
    }

    /// Advances the scan over `chunk`, a line at a time (`memchr` finds the line ends); false once
    /// the head is over the limit. `now` is read at most once per scan, when first needed, from
    /// the connection's loop's clock.
    private mutating func scanBytes(_ chunk: UnsafeRawBufferPointer, now: inout UInt64, clock loop: EventLoop?) -> Bool {
        guard let base = chunk.baseAddress, chunk.count > 0 else { return true }
        if bytes == 0 { startedAt = Self.read(&now, loop) }
        var offset = 0
        while offset < chunk.count {
            let remaining = chunk.count - offset
            guard let found = memchr(base + offset, 0x0A, remaining) else {
                // No line end: the rest is part of the current line.
                if !lineHasContent { lineHasContent = Self.hasContent(base + offset, remaining) }
                note(base + offset, remaining)
                bytes += remaining
                return bytes <= maxHeaderBytes
            }
            let end = UnsafeRawPointer(found) - base
            let segment = end - offset
            let hasContent = lineHasContent || Self.hasContent(base + offset, segment)
            bytes += segment + 1
            if !hasContent {
                // A line of nothing but CR and LF: the head is complete.
                isComplete = true
                bodyStartedAt = Self.read(&now, loop)
                return bytes <= maxHeaderBytes
            }
            if bytes > maxHeaderBytes { return false }
            note(base + offset, segment)
            endLine()
            lineHasContent = false
            offset = end + 1
        }
        return true
    }

    /// Whether any of the `count` bytes at `start` is not a CR.
    private static func hasContent(_ start: UnsafeRawPointer, _ count: Int) -> Bool {
        UnsafeRawBufferPointer(start: start, count: count).contains { $0 != 0x0D }
    }

    private static func read(_ now: inout UInt64, _ loop: EventLoop?) -> UInt64 {
        if now == 0, let loop { now = loop.monotonicNow() }
        return now
    }
}

/// The head guard's verdict on bytes, for the fuzz harness (`MainspringFuzzing`, through
/// `@_spi(Fuzzing)`): the scan is a state machine fed in pieces as they arrive, so a harness
/// feeds the same bytes cut several ways and compares.
@_spi(Fuzzing)
public enum RequestHeadCheck {
    /// What the guard concluded about a head.
    public struct Verdict: Equatable, Sendable {
        /// The blank line that ends the head arrived.
        public var isComplete: Bool
        /// The head was over the limit (431).
        public var isOversized: Bool
        /// The status the head is refused with (400, 501), nil when it is accepted or
        /// incomplete.
        public var status: Int?
        /// Why, as the answer's body says it.
        public var reason: String?
    }

    /// The verdict on `bytes`, fed to one scan in pieces of the sizes in `pieces` (cycled; sizes
    /// below 1 count as 1) until the head is complete or over `maxHeaderBytes`.
    public static func verdict(_ bytes: [UInt8], pieces: [Int], maxHeaderBytes: Int = 1 << 20) -> Verdict {
        var scan = RequestHeadScan(maxHeaderBytes: maxHeaderBytes)
        var offset = 0
        var turn = 0
        var withinLimit = true
        bytes.withUnsafeBytes { all in
            while offset < all.count && !scan.isComplete && withinLimit {
                let size = min(max(pieces.isEmpty ? all.count : pieces[turn % pieces.count], 1), all.count - offset)
                withinLimit = scan.scan(UnsafeRawBufferPointer(rebasing: all[offset..<(offset + size)]))
                offset += size
                turn += 1
            }
        }
        let refusal = withinLimit ? scan.problem : nil
        let (status, reason): (Int?, String?) = switch refusal {
        case .badRequest(let why): (400, why)
        case .notImplemented(let why): (501, why)
        case nil: (nil, nil)
        }
        return Verdict(isComplete: scan.isComplete, isOversized: !withinLimit, status: status, reason: reason)
    }
}
