// Raw HTTP/2 frames (RFC 9113) for the attack tests: builders that write frames byte by byte,
// exactly as given (a test may write what a well-behaved client never would), and a reader that
// splits a server's byte stream back into frames. HPACK lives in HPACKRaw.swift. Standard
// library only.

/// The frame types of RFC 9113 §6: the type octet of the frame header (§4.1).
enum HTTP2FrameType: UInt8, Sendable {
    case data = 0, headers = 1, priority = 2, rstStream = 3, settings = 4, pushPromise = 5
    case ping = 6, goAway = 7, windowUpdate = 8, continuation = 9
}

/// The error codes of RFC 9113 §7, as carried by RST_STREAM (§6.4) and GOAWAY (§6.8).
enum HTTP2ErrorCode: UInt32, Sendable {
    case noError = 0x0, protocolError = 0x1, internalError = 0x2, flowControlError = 0x3
    case settingsTimeout = 0x4, streamClosed = 0x5, frameSizeError = 0x6, refusedStream = 0x7
    case cancel = 0x8, compressionError = 0x9, connectError = 0xa, enhanceYourCalm = 0xb
    case inadequateSecurity = 0xc, http11Required = 0xd
}

/// The frame flags of RFC 9113 §6; what a bit means depends on the frame's type.
enum HTTP2Flags: Sendable {
    /// END_STREAM on DATA (§6.1) and HEADERS (§6.2).
    static let endStream: UInt8 = 0x1
    /// ACK on SETTINGS (§6.5) and PING (§6.7).
    static let ack: UInt8 = 0x1
    /// END_HEADERS on HEADERS (§6.2), PUSH_PROMISE (§6.6) and CONTINUATION (§6.10).
    static let endHeaders: UInt8 = 0x4
    /// PADDED on DATA (§6.1), HEADERS (§6.2) and PUSH_PROMISE (§6.6).
    static let padded: UInt8 = 0x8
    /// PRIORITY on HEADERS (§6.2): the payload starts with the deprecated priority fields.
    static let priority: UInt8 = 0x20
}

/// One HTTP/2 frame (RFC 9113 §4.1), as read from a peer or to be written to one.
struct HTTP2Frame: Sendable, Equatable {
    /// The size of the fixed frame header: 24-bit length, type, flags, stream ID (§4.1).
    static let headerSize = 9

    /// The type octet; unknown types are kept as they are (§4.1, §5.5).
    var type: UInt8
    /// The flags octet.
    var flags: UInt8
    /// The stream identifier. A reader clears the reserved bit (§4.1); a writer sends it as given.
    var streamID: UInt32
    /// The frame payload, padding and all.
    var payload: [UInt8]

    /// A frame of any type octet, known or not (§4.1).
    init(type: UInt8, flags: UInt8 = 0, streamID: UInt32 = 0, payload: [UInt8] = []) {
        self.type = type
        self.flags = flags
        self.streamID = streamID
        self.payload = payload
    }

    /// A frame of a known type (§6).
    init(_ kind: HTTP2FrameType, flags: UInt8 = 0, streamID: UInt32 = 0, payload: [UInt8] = []) {
        self.init(type: kind.rawValue, flags: flags, streamID: streamID, payload: payload)
    }

    /// The frame on the wire: the 9-byte header, then the payload (§4.1).
    var encoded: [UInt8] {
        HTTP2Raw.frame(type: type, flags: flags, stream: streamID, payload: payload)
    }

    /// The frame's type, or nil for a type RFC 9113 does not define (§5.5).
    var kind: HTTP2FrameType? { HTTP2FrameType(rawValue: type) }

    /// Whether any bit of `flag` (an `HTTP2Flags` constant) is set.
    func hasFlag(_ flag: UInt8) -> Bool { flags & flag != 0 }

    /// GOAWAY's last stream ID, reserved bit cleared (§6.8); nil for other frames or a short one.
    var goAwayLastStreamID: UInt32? {
        guard kind == .goAway, payload.count >= 8 else { return nil }
        return Self.uint32(payload, at: 0) & 0x7fff_ffff
    }

    /// GOAWAY's error code (§6.8); nil for other frames, a short one or an unknown code.
    var goAwayErrorCode: HTTP2ErrorCode? {
        guard kind == .goAway else { return nil }
        return errorCodeRawValue.flatMap(HTTP2ErrorCode.init(rawValue:))
    }

    /// GOAWAY's additional debug data (§6.8); empty for other frames.
    var goAwayDebugData: [UInt8] {
        guard kind == .goAway, payload.count > 8 else { return [] }
        return Array(payload[8...])
    }

    /// RST_STREAM's error code (§6.4); nil for other frames, a wrong size or an unknown code.
    var rstStreamErrorCode: HTTP2ErrorCode? {
        guard kind == .rstStream else { return nil }
        return errorCodeRawValue.flatMap(HTTP2ErrorCode.init(rawValue:))
    }

    /// The raw 32-bit error code of RST_STREAM (§6.4) or GOAWAY (§6.8), known to §7 or not.
    var errorCodeRawValue: UInt32? {
        switch kind {
        case .rstStream where payload.count == 4: return Self.uint32(payload, at: 0)
        case .goAway where payload.count >= 8: return Self.uint32(payload, at: 4)
        default: return nil
        }
    }

    /// SETTINGS' parameters in order, 6 bytes each (§6.5.1); empty for other frames. A trailing
    /// partial parameter (a FRAME_SIZE_ERROR, §6.5) is left out.
    var settings: [(id: UInt16, value: UInt32)] {
        guard kind == .settings else { return [] }
        return stride(from: 0, to: payload.count - payload.count % 6, by: 6).map { offset in
            (id: UInt16(payload[offset]) << 8 | UInt16(payload[offset + 1]),
             value: Self.uint32(payload, at: offset + 2))
        }
    }

    /// WINDOW_UPDATE's increment, reserved bit cleared (§6.9); nil for other frames or a wrong size.
    var windowIncrement: UInt32? {
        guard kind == .windowUpdate, payload.count == 4 else { return nil }
        return Self.uint32(payload, at: 0) & 0x7fff_ffff
    }

    /// The field block fragment of HEADERS, without padding and priority fields (§6.2), or of
    /// CONTINUATION (§6.10); nil for other frames or malformed padding.
    var headerBlockFragment: [UInt8]? {
        switch kind {
        case .headers: return unpadded(skipping: hasFlag(HTTP2Flags.priority) ? 5 : 0)
        case .continuation: return payload
        default: return nil
        }
    }

    /// DATA's content without padding (§6.1); nil for other frames or malformed padding.
    var dataBytes: [UInt8]? { kind == .data ? unpadded(skipping: 0) : nil }

    /// The payload past the Pad Length octet (when PADDED) and `count` more bytes, minus the
    /// padding (§6.1, §6.2); nil when the padding does not fit.
    private func unpadded(skipping count: Int) -> [UInt8]? {
        let isPadded = hasFlag(HTTP2Flags.padded)
        guard !isPadded || !payload.isEmpty else { return nil }
        let padding = isPadded ? Int(payload[0]) : 0
        let start = (isPadded ? 1 : 0) + count
        guard start + padding <= payload.count else { return nil }
        return Array(payload[start..<(payload.count - padding)])
    }

    /// The big-endian 32-bit number at `offset`; the caller checks the bounds.
    private static func uint32(_ bytes: [UInt8], at offset: Int) -> UInt32 {
        bytes[offset..<(offset + 4)].reduce(0) { $0 << 8 | UInt32($1) }
    }
}

/// Builders of encoded frames (RFC 9113 §6), each returning the bytes to write.
enum HTTP2Raw: Sendable {
    /// The client connection preface (§3.4), sent before the client's first SETTINGS.
    static let clientPreface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    /// SETTINGS_HEADER_TABLE_SIZE (§6.5.2).
    static let headerTableSize: UInt16 = 0x1
    /// SETTINGS_ENABLE_PUSH (§6.5.2).
    static let enablePush: UInt16 = 0x2
    /// SETTINGS_MAX_CONCURRENT_STREAMS (§6.5.2).
    static let maxConcurrentStreams: UInt16 = 0x3
    /// SETTINGS_INITIAL_WINDOW_SIZE (§6.5.2).
    static let initialWindowSize: UInt16 = 0x4
    /// SETTINGS_MAX_FRAME_SIZE (§6.5.2).
    static let maxFrameSize: UInt16 = 0x5
    /// SETTINGS_MAX_HEADER_LIST_SIZE (§6.5.2).
    static let maxHeaderListSize: UInt16 = 0x6

    /// Any frame (§4.1), every field as given: the stream ID's reserved bit is sent if set, and
    /// `declaredLength` (low 24 bits) replaces the true payload length to write a lying header.
    static func frame(
        type: UInt8, flags: UInt8 = 0, stream: UInt32, payload: [UInt8] = [],
        declaredLength: Int? = nil
    ) -> [UInt8] {
        precondition(payload.count < 1 << 24, "an HTTP/2 payload length has 24 bits")
        let length = UInt32(truncatingIfNeeded: declaredLength ?? payload.count) & 0xff_ffff
        var bytes = Array(bigEndian(length).dropFirst())
        bytes += [type, flags]
        bytes += bigEndian(stream)
        return bytes + payload
    }

    /// A frame of a known type (§6) with a true length header.
    static func frame(
        _ kind: HTTP2FrameType, flags: UInt8 = 0, stream: UInt32, payload: [UInt8] = []
    ) -> [UInt8] {
        frame(type: kind.rawValue, flags: flags, stream: stream, payload: payload)
    }

    /// SETTINGS (§6.5) on stream 0: the parameters in order, or an empty ACK.
    static func settings(_ values: [(id: UInt16, value: UInt32)] = [], ack: Bool = false) -> [UInt8] {
        let payload = values.flatMap { bigEndian($0.id) + bigEndian($0.value) }
        return frame(.settings, flags: ack ? HTTP2Flags.ack : 0, stream: 0, payload: payload)
    }

    /// HEADERS (§6.2) carrying a field block fragment, without padding or priority.
    static func headers(
        stream: UInt32, block: [UInt8], endStream: Bool, endHeaders: Bool = true
    ) -> [UInt8] {
        let flags = (endStream ? HTTP2Flags.endStream : 0) | (endHeaders ? HTTP2Flags.endHeaders : 0)
        return frame(.headers, flags: flags, stream: stream, payload: block)
    }

    /// CONTINUATION (§6.10) carrying the next field block fragment.
    static func continuation(stream: UInt32, block: [UInt8], endHeaders: Bool) -> [UInt8] {
        let flags = endHeaders ? HTTP2Flags.endHeaders : 0
        return frame(.continuation, flags: flags, stream: stream, payload: block)
    }

    /// DATA (§6.1) without padding; an empty one is legal and costs the receiver a frame.
    static func data(stream: UInt32, _ bytes: [UInt8], endStream: Bool) -> [UInt8] {
        frame(.data, flags: endStream ? HTTP2Flags.endStream : 0, stream: stream, payload: bytes)
    }

    /// PRIORITY (§6.3, deprecated but still parsed): `weight` is the wire value, one less than
    /// the weight it means.
    static func priority(
        stream: UInt32, dependsOn dependency: UInt32, weight: UInt8 = 15, exclusive: Bool = false
    ) -> [UInt8] {
        let field = dependency & 0x7fff_ffff | (exclusive ? 0x8000_0000 : 0)
        return frame(.priority, stream: stream, payload: bigEndian(field) + [weight])
    }

    /// RST_STREAM (§6.4): the stream ends at once with `code`.
    static func rstStream(stream: UInt32, code: HTTP2ErrorCode) -> [UInt8] {
        frame(.rstStream, stream: stream, payload: bigEndian(code.rawValue))
    }

    /// PING (§6.7) on stream 0; `opaque` is sent as given (8 bytes in a valid PING).
    static func ping(_ opaque: [UInt8] = Array(repeating: 0, count: 8), ack: Bool = false) -> [UInt8] {
        frame(.ping, flags: ack ? HTTP2Flags.ack : 0, stream: 0, payload: opaque)
    }

    /// WINDOW_UPDATE (§6.9) for a stream, or the connection when `stream` is 0; `increment` is
    /// sent as given (0 is a PROTOCOL_ERROR, §6.9; a total past 2^31-1 a FLOW_CONTROL_ERROR, §6.9.1).
    static func windowUpdate(stream: UInt32, increment: UInt32) -> [UInt8] {
        frame(.windowUpdate, stream: stream, payload: bigEndian(increment))
    }

    /// GOAWAY (§6.8) on stream 0, with optional debug data.
    static func goAway(lastStreamID: UInt32, code: HTTP2ErrorCode, debugData: [UInt8] = []) -> [UInt8] {
        let payload = bigEndian(lastStreamID) + bigEndian(code.rawValue) + debugData
        return frame(.goAway, stream: 0, payload: payload)
    }

    /// The 4 bytes of `value`, most significant first (network byte order, §4.1).
    static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8(value >> 16 & 0xff), UInt8(value >> 8 & 0xff), UInt8(value & 0xff)]
    }

    /// The 2 bytes of `value`, most significant first.
    static func bigEndian(_ value: UInt16) -> [UInt8] {
        [UInt8(value >> 8), UInt8(value & 0xff)]
    }
}

/// Splits a byte stream from a peer into frames (RFC 9113 §4.1): append bytes as they arrive,
/// then take whole frames. It checks no size limit (a test sees exactly what the peer sent).
struct HTTP2FrameReader: Sendable {
    /// Bytes received; those before `start` were already returned as frames.
    private var buffer: [UInt8] = []
    /// Where the first byte not yet returned as part of a frame is in `buffer`.
    private var start = 0

    /// An empty reader.
    init() {}

    /// How many received bytes wait for the rest of their frame.
    var bufferedByteCount: Int { buffer.count - start }

    /// Adds received bytes (in the order the peer sent them).
    mutating func append(_ bytes: [UInt8]) {
        if start > 0, start >= buffer.count / 2 {
            buffer.removeFirst(start)
            start = 0
        }
        buffer += bytes
    }

    /// The next whole frame, or nil until one is buffered (§4.1: 9-byte header, then the
    /// 24-bit length's worth of payload). The stream ID's reserved bit is cleared.
    mutating func next() -> HTTP2Frame? {
        guard bufferedByteCount >= HTTP2Frame.headerSize else { return nil }
        let length = buffer[start..<(start + 3)].reduce(0) { $0 << 8 | Int($1) }
        let end = start + HTTP2Frame.headerSize + length
        guard end <= buffer.count else { return nil }
        let stream = buffer[(start + 5)..<(start + 9)].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let frame = HTTP2Frame(
            type: buffer[start + 3], flags: buffer[start + 4], streamID: stream & 0x7fff_ffff,
            payload: Array(buffer[(start + HTTP2Frame.headerSize)..<end]))
        start = end
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        return frame
    }

    /// Every whole frame buffered so far, in order; a partial one stays for later.
    mutating func drain() -> [HTTP2Frame] {
        var frames: [HTTP2Frame] = []
        while let frame = next() { frames.append(frame) }
        return frames
    }
}
