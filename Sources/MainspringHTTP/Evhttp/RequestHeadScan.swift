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
    /// Bytes of the current line, without CR and LF.
    private var lineLength = 0
    /// The blank line that ends the head was seen.
    private(set) var isComplete = false
    /// When the head's first byte arrived (monotonic ns; 0 before).
    private(set) var startedAt: UInt64 = 0
    /// When the head was complete, that is when the body started (monotonic ns; 0 before).
    private(set) var bodyStartedAt: UInt64 = 0

    init(maxHeaderBytes: Int) { self.maxHeaderBytes = maxHeaderBytes }

    /// Starts over for the next request.
    mutating func reset() {
        bytes = 0
        lineLength = 0
        isComplete = false
        startedAt = 0
        bodyStartedAt = 0
    }

    /// Scans up to `count` bytes of `buffer` (an evbuffer, left as it is) for the blank line that
    /// ends a head. Returns false when the head is over the limit.
    mutating func scan(_ buffer: OpaquePointer, count: Int) -> Bool {
        withUnsafeTemporaryAllocation(of: iovec.self, capacity: 8) { vectors in
            var offset = 0
            var position = evbuffer_ptr()
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
                    if !scanBytes(UnsafeRawBufferPointer(start: base, count: length)) { return false }
                    offset += length
                    if isComplete || offset >= count { break }
                }
            }
            return bytes <= maxHeaderBytes
        }
    }

    /// Advances the scan over `chunk`; false once the head is over the limit.
    private mutating func scanBytes(_ chunk: UnsafeRawBufferPointer) -> Bool {
        for byte in chunk {
            if bytes == 0 { startedAt = monotonicNow() }
            bytes += 1
            if byte == 0x0A {
                if lineLength == 0 {
                    isComplete = true
                    bodyStartedAt = monotonicNow()
                    return bytes <= maxHeaderBytes
                }
                lineLength = 0
            } else if byte != 0x0D {
                lineLength += 1
            }
            if bytes > maxHeaderBytes { return false }
        }
        return true
    }
}
