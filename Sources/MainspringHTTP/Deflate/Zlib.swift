// Sources/MainspringHTTP/Deflate/ is the only folder of MainspringHTTP that imports CZlib: raw
// DEFLATE streams (no zlib header) for permessage-deflate (RFC 7692), one compressor and one
// decompressor per WebSocket, each on its loop's thread only.
internal import CZlib

/// Why inflating failed.
enum InflateFailure: Error {
    /// The inflated message would pass the limit (a decompression bomb, or just a big message).
    case tooBig
    /// The input is not a valid DEFLATE stream.
    case corrupt
}

/// A raw DEFLATE decompressor that keeps its window between messages (context takeover).
/// Loop thread only (`@unchecked Sendable` so that the decoder, a value, can carry it).
final class Inflater: @unchecked Sendable {
    private let stream: UnsafeMutablePointer<z_stream>

    /// nil when zlib cannot make one (out of memory).
    init?() {
        stream = .allocate(capacity: 1)
        stream.initialize(to: z_stream())
        let status = ZLIB_VERSION.withCString { inflateInit2_(stream, -15, $0, Int32(MemoryLayout<z_stream>.size)) }
        guard status == Z_OK else {
            stream.deallocate()
            return nil
        }
    }

    deinit {
        inflateEnd(stream)
        stream.deallocate()
    }

    /// Inflates `input` (a message's compressed bytes, or a fragment of them) and returns what
    /// it makes, at most `limit` bytes: more throws `.tooBig` as soon as it is produced (never
    /// more than 16 KiB past the limit is held).
    func inflate(_ input: [UInt8], limit: Int) throws(InflateFailure) -> [UInt8] {
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        var failure: InflateFailure?
        input.withUnsafeBufferPointer { source in
            stream.pointee.next_in = UnsafeMutablePointer(mutating: source.baseAddress)
            stream.pointee.avail_in = UInt32(source.count)
            defer {
                stream.pointee.next_in = nil
                stream.pointee.avail_in = 0
            }
            while true {
                let (status, produced) = chunk.withUnsafeMutableBufferPointer { buffer -> (Int32, Int) in
                    stream.pointee.next_out = buffer.baseAddress
                    stream.pointee.avail_out = UInt32(buffer.count)
                    let status = CZlib.inflate(stream, Z_SYNC_FLUSH)
                    let produced = buffer.count - Int(stream.pointee.avail_out)
                    stream.pointee.next_out = nil
                    return (status, produced)
                }
                if produced > 0 {
                    if output.count + produced > limit {
                        failure = .tooBig
                        return
                    }
                    output.append(contentsOf: chunk[0..<produced])
                }
                switch status {
                case Z_OK:
                    if stream.pointee.avail_in == 0 && produced < chunk.count { return }
                case Z_STREAM_END:
                    // A final block: the next message starts a new stream.
                    inflateReset(stream)
                    if stream.pointee.avail_in == 0 { return }
                case Z_BUF_ERROR:
                    return  // no progress possible: all input taken
                default:
                    failure = .corrupt
                    return
                }
            }
        }
        if let failure { throw failure }
        return output
    }
}

/// A raw DEFLATE compressor for messages: each message is compressed and flushed to a byte
/// boundary (the trailing `00 00 FF FF` removed, RFC 7692 §7.2.1); with context takeover it
/// keeps its window between messages. Loop thread only.
final class Deflater: @unchecked Sendable {
    private let stream: UnsafeMutablePointer<z_stream>
    private let resetsEachMessage: Bool

    /// nil when zlib cannot make one. `windowBits` 9–15.
    init?(windowBits: Int, contextTakeover: Bool) {
        resetsEachMessage = !contextTakeover
        stream = .allocate(capacity: 1)
        stream.initialize(to: z_stream())
        let status = ZLIB_VERSION.withCString {
            deflateInit2_(stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -Int32(windowBits), 8, Z_DEFAULT_STRATEGY, $0,
                          Int32(MemoryLayout<z_stream>.size))
        }
        guard status == Z_OK else {
            stream.deallocate()
            return nil
        }
    }

    deinit {
        deflateEnd(stream)
        stream.deallocate()
    }

    /// `payload` compressed as one message's payload.
    func compress(_ payload: UnsafeRawBufferPointer) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(payload.count / 2 + 64)
        var chunk = [UInt8](repeating: 0, count: 16_384)
        stream.pointee.next_in = UnsafeMutablePointer(mutating: payload.baseAddress?.assumingMemoryBound(to: UInt8.self))
        stream.pointee.avail_in = UInt32(payload.count)
        while true {
            let (produced, full) = chunk.withUnsafeMutableBufferPointer { buffer -> (Int, Bool) in
                stream.pointee.next_out = buffer.baseAddress
                stream.pointee.avail_out = UInt32(buffer.count)
                _ = deflate(stream, Z_SYNC_FLUSH)
                let produced = buffer.count - Int(stream.pointee.avail_out)
                stream.pointee.next_out = nil
                return (produced, stream.pointee.avail_out == 0)
            }
            output.append(contentsOf: chunk[0..<produced])
            if !full && stream.pointee.avail_in == 0 { break }
        }
        stream.pointee.next_in = nil
        if resetsEachMessage { deflateReset(stream) }
        if output.count >= 4 && output.suffix(4) == [0x00, 0x00, 0xFF, 0xFF] { output.removeLast(4) }
        return output.isEmpty ? [0x00] : output
    }
}
