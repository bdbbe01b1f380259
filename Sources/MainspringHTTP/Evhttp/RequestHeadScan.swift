// The head guard's scan: where the current request head stands as its bytes arrive, before evhttp
// buffers them. evhttp would buffer a head up to its own limit and answer 400; the guard counts
// the bytes of the head (request line and header fields, up to the blank line that ends it), so
// that a head over the limit is answered 431 at once, and it stamps when the head started and
// ended, for the slow-request deadlines (EvhttpDeadlines.swift).
internal import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// The scan of one request head (reset for each request of a connection). Loop thread only.
struct RequestHeadScan {
    let maxHeaderBytes: Int
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
    // request line's version and counts the `Host` fields as the lines go by: per line it keeps
    // the first five bytes (lowercased) and the last eight (CRs skipped), a few words in all.
    /// Lines of the head completed so far (the request line is line 0).
    private var lineIndex = 0
    /// The current line's first bytes, lowercased, up to five.
    private var lineStart: UInt64 = 0
    private var lineStartCount = 0
    /// The current line's last eight bytes other than CR.
    private var lineEnd: UInt64 = 0
    /// Whether the request line ends in `HTTP/1.1`.
    private(set) var isHTTP11 = false
    /// `Host` fields seen.
    private(set) var hostFields = 0

    /// Why a complete head is refused (400) before evhttp sees it, if it is.
    var problem: String? {
        guard isComplete, isHTTP11 else { return nil }
        if hostFields == 0 { return "an HTTP/1.1 request needs a Host header field" }
        if hostFields > 1 { return "an HTTP/1.1 request has exactly one Host header field, not \(hostFields)" }
        return nil
    }

    init(maxHeaderBytes: Int) { self.maxHeaderBytes = maxHeaderBytes }

    /// Starts over for the next request.
    mutating func reset() {
        bytes = 0
        lineHasContent = false
        isComplete = false
        startedAt = 0
        bodyStartedAt = 0
        lineIndex = 0
        lineStart = 0
        lineStartCount = 0
        lineEnd = 0
        isHTTP11 = false
        hostFields = 0
    }

    /// "http/1.1" and "host:" as the registers hold them.
    private static let versionTail = Self.pack(Array("HTTP/1.1".utf8))
    private static let hostHead = Self.pack(Array("host:".utf8))

    private static func pack(_ bytes: [UInt8]) -> UInt64 { bytes.reduce(0) { $0 << 8 | UInt64($1) } }

    /// Notes `count` bytes of the current line: the request line's last bytes, a header line's
    /// first ones (nothing else is looked at).
    @inline(__always)
    private mutating func note(_ start: UnsafeRawPointer, _ count: Int) {
        guard count > 0 else { return }
        let bytes = UnsafeRawBufferPointer(start: start, count: count)
        if lineIndex == 0 {
            var index = max(0, count - 9)
            while index < count {
                let byte = bytes[index]
                if byte != 0x0D { lineEnd = lineEnd << 8 | UInt64(byte) }
                index += 1
            }
            return
        }
        var index = 0
        while lineStartCount < 5 && index < count {
            let byte = bytes[index]
            lineStart = lineStart << 8 | UInt64(byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte)
            lineStartCount += 1
            index += 1
        }
    }

    /// A line of the head ended.
    private mutating func endLine() {
        if lineIndex == 0 {
            isHTTP11 = lineEnd == Self.versionTail
        } else if lineStartCount == 5 && lineStart == Self.hostHead {
            hostFields += 1
        }
        lineIndex += 1
        lineStart = 0
        lineStartCount = 0
        lineEnd = 0
    }

    /// Scans up to `count` bytes of `buffer` (an evbuffer, left as it is) for the blank line that
    /// ends a head. Returns false when the head is over the limit.
    mutating func scan(_ buffer: OpaquePointer, count: Int) -> Bool {
        withUnsafeTemporaryAllocation(of: iovec.self, capacity: 8) { vectors in
            var offset = 0
            var position = evbuffer_ptr()
            var now: UInt64 = 0
            while offset < count && !isComplete {
                let filled: Int
                if offset == 0 {
                    filled = Int(evbuffer_peek(buffer, count, nil, vectors.baseAddress, 8))
                } else {
                    guard evbuffer_ptr_set(buffer, &position, offset, EVBUFFER_PTR_SET) == 0 else { break }
                    filled = Int(evbuffer_peek(buffer, count - offset, &position, vectors.baseAddress, 8))
                }
                if filled <= 0 { break }
                for index in 0..<min(filled, 8) {
                    let vector = vectors[index]
                    guard let base = vector.iov_base else { continue }
                    let length = min(vector.iov_len, count - offset)
                    if !scanBytes(UnsafeRawBufferPointer(start: base, count: length), now: &now) { return false }
                    offset += length
                    if isComplete || offset >= count { break }
                }
            }
            return bytes <= maxHeaderBytes
        }
    }

    /// Advances the scan over `chunk`, a line at a time (`memchr` finds the line ends); false once
    /// the head is over the limit. `now` is read at most once per scan, when first needed.
    private mutating func scanBytes(_ chunk: UnsafeRawBufferPointer, now: inout UInt64) -> Bool {
        guard let base = chunk.baseAddress, chunk.count > 0 else { return true }
        if bytes == 0 { startedAt = Self.read(&now) }
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
                bodyStartedAt = Self.read(&now)
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

    private static func read(_ now: inout UInt64) -> UInt64 {
        if now == 0 { now = monotonicNow() }
        return now
    }
}
