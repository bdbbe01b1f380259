// The head's scan: where the current request head stands as its bytes arrive, a piece at a
// time, before the head is parsed (RequestHead.swift, by the rules every HTTP/1.x head is read
// by: Parsing/HeadFields.swift). It counts the bytes of the head (request line and header
// fields, up to the blank line that ends it), so that a head over `maxHeaderBytes` is answered
// 431 as soon as it passes the limit, whatever is still to come; and keeps the request target's
// path for load shedding, which decides before the body is read.
import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// The scan of one request head (reset for each request of a connection). Loop thread only.
struct RequestHeadScan {
    let maxHeaderBytes: Int
    /// Whether the scan keeps the request target's path (load shedding decides on it before
    /// the body is read); off, the request line costs nothing more than its line end.
    let keepsTargetPath: Bool
    /// The request target up to its `?`, as it came (at most `maxTargetPath` bytes: a longer
    /// one is kept empty, and matches no exempt path). Kept when `keepsTargetPath`.
    private(set) var targetPath: [UInt8] = []
    /// Where the request line stands for `targetPath`: 0 the method, 1 the target, 2 past it.
    private var targetPhase: UInt8 = 0
    static let maxTargetPath = 256
    /// Bytes of the head seen so far.
    private(set) var bytes = 0
    /// Lines of the head completed so far (the request line is line 0).
    private var lineIndex = 0
    /// The current line has a byte other than CR so far.
    private var lineHasContent = false
    /// The blank line that ends the head was seen.
    private(set) var isComplete = false

    init(maxHeaderBytes: Int, keepsTargetPath: Bool = false) {
        self.maxHeaderBytes = maxHeaderBytes
        self.keepsTargetPath = keepsTargetPath
    }

    /// Starts on the next request's head.
    mutating func reset() {
        targetPath.removeAll(keepingCapacity: true)
        targetPhase = 0
        bytes = 0
        lineIndex = 0
        lineHasContent = false
        isComplete = false
    }

    /// Advances the scan over `chunk`, a line at a time (`memchr` finds the line ends); false
    /// once the head is over the limit.
    mutating func scan(_ chunk: UnsafeRawBufferPointer) -> Bool {
        guard let base = chunk.baseAddress, chunk.count > 0 else { return true }
        var offset = 0
        while offset < chunk.count {
            let remaining = chunk.count - offset
            guard let found = memchr(base + offset, 0x0A, remaining) else {
                // No line end: the rest is part of the current line.
                if !lineHasContent { lineHasContent = Self.hasContent(base + offset, remaining) }
                noteRequestLine(base + offset, remaining)
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
                return bytes <= maxHeaderBytes
            }
            if bytes > maxHeaderBytes { return false }
            noteRequestLine(base + offset, segment)
            lineIndex += 1
            lineHasContent = false
            offset = end + 1
        }
        return true
    }

    /// Bytes of the request line, for `targetPath`: the target is what lies between the first
    /// space and the next space or `?`.
    private mutating func noteRequestLine(_ start: UnsafeRawPointer, _ count: Int) {
        guard lineIndex == 0, keepsTargetPath, targetPhase < 2 else { return }
        for byte in UnsafeRawBufferPointer(start: start, count: count) {
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

    /// Whether any of the `count` bytes at `start` is not a CR.
    private static func hasContent(_ start: UnsafeRawPointer, _ count: Int) -> Bool {
        UnsafeRawBufferPointer(start: start, count: count).contains { $0 != 0x0D }
    }
}

/// The head guard's verdict on bytes, for the fuzz harness (`MainspringFuzzing`, through
/// `@_spi(Fuzzing)`): the scan fed the bytes in pieces as they would arrive, then the checks a
/// complete head meets before its request line is read (`RequestHead.guardRefusal`: its field
/// lines, its framing, `Host`). A harness feeds the same bytes cut several ways and compares.
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
        let refusal = withinLimit && scan.isComplete ? RequestHead.guardRefusal(bytes[..<scan.bytes]) : nil
        return Verdict(isComplete: scan.isComplete, isOversized: !withinLimit, status: refusal?.status,
                       reason: refusal?.reason)
    }
}
