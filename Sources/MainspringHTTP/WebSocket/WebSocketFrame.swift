// The WebSocket frame codec (RFC 6455 §5): pure Swift, no I/O. `WebSocketFrame` encodes one
// frame; `WebSocketDecoder` takes bytes as they arrive and gives frames (checked: masking,
// reserved bits and opcodes, control frame rules, the message size limit against the declared
// length before anything is buffered) and, assembled, messages (fragments joined, text checked
// as UTF-8 fragment by fragment, close payloads checked). A violation is a
// `WebSocketViolation`: the close code to fail the connection with and why.

/// A frame's opcode (RFC 6455 §5.2).
enum WebSocketOpcode: UInt8, Sendable {
    case continuation = 0x0
    case text = 0x1
    case binary = 0x2
    case close = 0x8
    case ping = 0x9
    case pong = 0xA

    var isControl: Bool { rawValue & 0x8 != 0 }
}

/// Bad input from the peer: the code to close with, and what was wrong.
struct WebSocketViolation: Error, Sendable, Equatable, CustomStringConvertible {
    var code: WebSocket.CloseCode
    var reason: String

    static func protocolError(_ reason: String) -> Self { Self(code: .protocolError, reason: reason) }

    var description: String { "\(code.rawValue) \(reason)" }
}

/// One frame.
struct WebSocketFrame: Sendable, Equatable {
    var fin: Bool
    /// RSV1–RSV3 as the top three bits of the first byte's low nibble (`0x40`, `0x20`, `0x10`).
    var reserved: UInt8
    var opcode: WebSocketOpcode
    var payload: [UInt8]

    init(fin: Bool = true, reserved: UInt8 = 0, opcode: WebSocketOpcode, payload: [UInt8]) {
        self.fin = fin
        self.reserved = reserved
        self.opcode = opcode
        self.payload = payload
    }

    /// The frame as sent: masked with `maskingKey` (a client's frames) or not (a server's).
    func encoded(maskingKey: UInt32? = nil) -> [UInt8] {
        payload.withUnsafeBytes {
            Self.encode(fin: fin, reserved: reserved, opcode: opcode, payload: $0, maskingKey: maskingKey)
        }
    }

    /// A frame's bytes: header, then `payload` (masked with `maskingKey` when there is one).
    static func encode(fin: Bool = true, reserved: UInt8 = 0, opcode: WebSocketOpcode, payload: UnsafeRawBufferPointer,
                       maskingKey: UInt32?) -> [UInt8]
    {
        let length = payload.count
        let lengthBytes = length < 126 ? 0 : length <= 0xFFFF ? 2 : 8
        let headerCount = 2 + lengthBytes + (maskingKey == nil ? 0 : 4)
        return [UInt8](unsafeUninitializedCapacity: headerCount + length) { storage, count in
            storage[0] = (fin ? 0x80 : 0) | (reserved & 0x70) | opcode.rawValue
            let maskBit: UInt8 = maskingKey == nil ? 0 : 0x80
            var at = 2
            switch lengthBytes {
            case 0:
                storage[1] = maskBit | UInt8(length)
            case 2:
                storage[1] = maskBit | 126
                storage[2] = UInt8(length >> 8)
                storage[3] = UInt8(truncatingIfNeeded: length)
                at = 4
            default:
                storage[1] = maskBit | 127
                for i in 0..<8 { storage[2 + i] = UInt8(truncatingIfNeeded: UInt64(length) >> UInt64(56 - 8 * i)) }
                at = 10
            }
            if let maskingKey {
                for i in 0..<4 { storage[at + i] = UInt8(truncatingIfNeeded: maskingKey >> UInt32(24 - 8 * i)) }
                at += 4
            }
            if length > 0, let source = payload.baseAddress {
                let destination = UnsafeMutableRawBufferPointer(rebasing: UnsafeMutableRawBufferPointer(storage)[at..<(at + length)])
                destination.copyMemory(from: UnsafeRawBufferPointer(start: source, count: length))
                if let maskingKey { applyMask(maskingKey, to: destination) }
            }
            count = headerCount + length
        }
    }

    /// XORs `bytes` with `key` (its bytes in big-endian order, repeated), starting at key byte
    /// `offset % 4`: masking and unmasking are the same step (RFC 6455 §5.3).
    static func applyMask(_ key: UInt32, to bytes: UnsafeMutableRawBufferPointer, offset: Int = 0) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        let keyBytes: [UInt8] = (0..<4).map { UInt8(truncatingIfNeeded: key >> UInt32(24 - 8 * (($0 + offset) % 4))) }
        var word: UInt64 = 0
        withUnsafeMutableBytes(of: &word) { w in for i in 0..<8 { w[i] = keyBytes[i % 4] } }
        var i = 0
        let count = bytes.count
        while i + 8 <= count {
            let value = base.loadUnaligned(fromByteOffset: i, as: UInt64.self) ^ word
            base.storeBytes(of: value, toByteOffset: i, as: UInt64.self)
            i += 8
        }
        while i < count {
            base.storeBytes(of: base.load(fromByteOffset: i, as: UInt8.self) ^ keyBytes[i % 4], toByteOffset: i, as: UInt8.self)
            i += 1
        }
    }

    /// A close frame's payload: the code (big-endian) and the reason, cut to fit 125 bytes at a
    /// character boundary.
    static func closePayload(_ code: WebSocket.CloseCode, reason: String) -> [UInt8] {
        var reasonBytes = Array(reason.utf8)
        if reasonBytes.count > 123 {
            var cut = 123
            while cut > 0 && reasonBytes[cut] & 0xC0 == 0x80 { cut -= 1 }
            reasonBytes.removeSubrange(cut...)
        }
        return [UInt8(code.rawValue >> 8), UInt8(truncatingIfNeeded: code.rawValue)] + reasonBytes
    }
}

/// What the decoder gives: a whole message, or a control frame's meaning.
enum WebSocketEvent: Sendable, Equatable {
    case message(WebSocket.Message)
    case ping([UInt8])
    case pong([UInt8])
    /// A close frame: its status (nil for an empty close frame, reported as 1005).
    case close(WebSocket.CloseStatus?)
}

/// Decodes the peer's frames and assembles its messages. Feed it with `append`, then take
/// events with `next()` until it returns nil (it needs more bytes).
struct WebSocketDecoder: Sendable {
    /// Whether the peer's frames must be masked (a server reading a client) or must not be (a
    /// client reading a server).
    let expectsMaskedFrames: Bool
    /// The largest message, over all its fragments (see `WebSocket.Configuration`).
    let maxMessageBytes: Int

    private var buffer: [UInt8] = []
    private var readIndex = 0
    /// The message being assembled from fragments: its opcode and the payload so far.
    private var messageOpcode: WebSocketOpcode?
    private var message: [UInt8] = []
    private var utf8 = UTF8Validator()
    /// A close frame has been decoded: any frame after it is a violation.
    private(set) var closeReceived = false
    /// permessage-deflate's decompressor, when it was agreed: RSV1 then marks a compressed
    /// message (on its first frame only).
    private let inflater: Inflater?
    /// The message being assembled is compressed.
    private var messageCompressed = false

    init(expectsMaskedFrames: Bool, maxMessageBytes: Int, inflater: Inflater? = nil) {
        self.expectsMaskedFrames = expectsMaskedFrames
        self.maxMessageBytes = maxMessageBytes
        self.inflater = inflater
    }

    /// Bytes not decoded yet.
    var bufferedCount: Int { buffer.count - readIndex }

    mutating func append(_ bytes: [UInt8]) {
        if readIndex == buffer.count {
            buffer = bytes
            readIndex = 0
        } else {
            if readIndex > 4096 && readIndex * 2 > buffer.count {
                buffer.removeSubrange(0..<readIndex)
                readIndex = 0
            }
            buffer.append(contentsOf: bytes)
        }
    }

    /// The next frame, checked on its own (not against the message in progress), or nil when
    /// its bytes have not all arrived.
    mutating func nextFrame() throws(WebSocketViolation) -> WebSocketFrame? {
        let available = buffer.count - readIndex
        guard available >= 2 else { return nil }
        let first = buffer[readIndex], second = buffer[readIndex + 1]
        let fin = first & 0x80 != 0
        let reserved = first & 0x70
        let masked = second & 0x80 != 0
        guard reserved & (inflater == nil ? 0x70 : 0x30) == 0 else {
            throw .protocolError("reserved bits set without an extension")
        }
        guard let opcode = WebSocketOpcode(rawValue: first & 0x0F) else {
            throw .protocolError("reserved opcode \(first & 0x0F)")
        }
        if reserved != 0 && opcode != .text && opcode != .binary {
            throw .protocolError("RSV1 on a control or continuation frame")
        }
        if masked != expectsMaskedFrames {
            throw .protocolError(expectsMaskedFrames ? "unmasked frame from a client" : "masked frame from a server")
        }
        var headerCount = 2
        var length = UInt64(second & 0x7F)
        if length == 126 {
            guard available >= 4 else { return nil }
            length = UInt64(buffer[readIndex + 2]) << 8 | UInt64(buffer[readIndex + 3])
            headerCount = 4
        } else if length == 127 {
            guard available >= 10 else { return nil }
            length = 0
            for i in 0..<8 { length = length << 8 | UInt64(buffer[readIndex + 2 + i]) }
            headerCount = 10
        }
        if opcode.isControl {
            guard fin else { throw .protocolError("fragmented control frame") }
            guard length <= 125 else { throw .protocolError("control frame longer than 125 bytes") }
        } else {
            // Before anything is buffered: the declared length against the limit (a length of
            // 2^63 and more included, which no Int holds).
            let sofar = opcode == .continuation ? UInt64(message.count) : 0
            if length > UInt64(Int.max) || sofar + length > UInt64(maxMessageBytes) {
                throw WebSocketViolation(code: .messageTooBig,
                                         reason: "message over \(maxMessageBytes) bytes")
            }
        }
        var maskingKey: UInt32?
        if masked {
            guard available >= headerCount + 4 else { return nil }
            var key: UInt32 = 0
            for i in 0..<4 { key = key << 8 | UInt32(buffer[readIndex + headerCount + i]) }
            maskingKey = key
            headerCount += 4
        }
        let count = Int(length)
        guard available - headerCount >= count else { return nil }
        let start = readIndex + headerCount
        var payload = Array(buffer[start..<(start + count)])
        readIndex = start + count
        if readIndex == buffer.count {
            // All taken: nothing is held between frames (the next input becomes the buffer as
            // it is, in `append`, so a kept capacity would only sit idle).
            buffer = []
            readIndex = 0
        }
        if let maskingKey { payload.withUnsafeMutableBytes { WebSocketFrame.applyMask(maskingKey, to: $0) } }
        return WebSocketFrame(fin: fin, reserved: reserved, opcode: opcode, payload: payload)
    }

    /// The next event — a whole message, a ping, a pong, a close — or nil when more bytes are
    /// needed.
    /// - Throws: the violation that must fail the connection.
    mutating func next() throws(WebSocketViolation) -> WebSocketEvent? {
        while let frame = try nextFrame() {
            if closeReceived { throw .protocolError("frame after the close frame") }
            switch frame.opcode {
            case .ping:
                return .ping(frame.payload)
            case .pong:
                return .pong(frame.payload)
            case .close:
                closeReceived = true
                return .close(try Self.closeStatus(frame.payload))
            case .text, .binary:
                guard messageOpcode == nil else { throw .protocolError("new message inside a fragmented message") }
                messageCompressed = frame.reserved & 0x40 != 0
                let data = messageCompressed ? try inflate(frame.payload, final: frame.fin, sofar: 0) : frame.payload
                if frame.opcode == .text {
                    utf8.reset()
                    guard utf8.validate(data) else {
                        throw WebSocketViolation(code: .invalidPayload, reason: "text message not valid UTF-8")
                    }
                }
                if frame.fin {
                    return .message(try finish(frame.opcode, data))
                }
                messageOpcode = frame.opcode
                message = data
            case .continuation:
                guard let opcode = messageOpcode else { throw .protocolError("continuation frame without a message") }
                let data = messageCompressed ? try inflate(frame.payload, final: frame.fin, sofar: message.count) : frame.payload
                if opcode == .text, !utf8.validate(data) {
                    throw WebSocketViolation(code: .invalidPayload, reason: "text message not valid UTF-8")
                }
                message.append(contentsOf: data)
                if frame.fin {
                    messageOpcode = nil
                    let payload = message
                    message = []
                    return .message(try finish(opcode, payload))
                }
            }
        }
        return nil
    }

    /// A compressed message's fragment inflated (with the tail RFC 7692 §7.2.2 removed put back
    /// after its last one), at most the limit's remainder.
    private func inflate(_ payload: [UInt8], final: Bool, sofar: Int) throws(WebSocketViolation) -> [UInt8] {
        guard let inflater else { throw .protocolError("compressed message without permessage-deflate") }
        do throws(InflateFailure) {
            return try inflater.inflate(final ? payload + [0x00, 0x00, 0xFF, 0xFF] : payload, limit: maxMessageBytes - sofar)
        } catch .tooBig {
            throw WebSocketViolation(code: .messageTooBig, reason: "message over \(maxMessageBytes) bytes inflated")
        } catch {
            throw .protocolError("compressed data that does not inflate")
        }
    }

    private mutating func finish(_ opcode: WebSocketOpcode, _ payload: [UInt8]) throws(WebSocketViolation) -> WebSocket.Message {
        if opcode == .binary { return .binary(payload) }
        guard utf8.isAtBoundary else { throw WebSocketViolation(code: .invalidPayload, reason: "text message ends inside a character") }
        return .text(String(decoding: payload, as: UTF8.self))
    }

    /// A close frame's status: nil when empty; a code, then a UTF-8 reason.
    static func closeStatus(_ payload: [UInt8]) throws(WebSocketViolation) -> WebSocket.CloseStatus? {
        if payload.isEmpty { return nil }
        guard payload.count >= 2 else { throw .protocolError("close frame with a one-byte payload") }
        let code = WebSocket.CloseCode(rawValue: UInt16(payload[0]) << 8 | UInt16(payload[1]))
        guard code.isValidOnTheWire else { throw .protocolError("close frame with invalid code \(code.rawValue)") }
        let reason = Array(payload[2...])
        var validator = UTF8Validator()
        guard validator.validate(reason), validator.isAtBoundary else {
            throw WebSocketViolation(code: .invalidPayload, reason: "close reason not valid UTF-8")
        }
        return WebSocket.CloseStatus(code: code, reason: String(decoding: reason, as: UTF8.self))
    }
}

/// The WebSocket decoder's outcome on bytes, for the fuzz harness (`MainspringFuzzing`, through
/// `@_spi(Fuzzing)`): the decoder is fed in pieces as they arrive, so a harness feeds the same
/// bytes cut several ways and compares.
@_spi(Fuzzing)
public enum WebSocketFrameCheck {
    /// What the decoder made of some bytes.
    public struct Outcome: Equatable, Sendable {
        /// The events, described (`text …`, `binary <count>`, `ping <count>`, `close <code>`).
        public var events: [String]
        /// The close code of the violation found, if any (decoding stops there).
        public var violation: UInt16?
        /// Bytes left undecoded (a frame not complete yet).
        public var leftover: Int

        public init(events: [String], violation: UInt16?, leftover: Int) {
            self.events = events
            self.violation = violation
            self.leftover = leftover
        }
    }

    /// Decodes `bytes` as a server (masked frames expected) or a client, fed in pieces of the
    /// sizes in `pieces` (cycled; sizes below 1 count as 1), with `maxMessageBytes` as the limit.
    public static func decode(_ bytes: [UInt8], pieces: [Int], asServer: Bool, maxMessageBytes: Int = 4096) -> Outcome {
        var decoder = WebSocketDecoder(expectsMaskedFrames: asServer, maxMessageBytes: maxMessageBytes)
        var outcome = Outcome(events: [], violation: nil, leftover: 0)
        var offset = 0
        var turn = 0
        feeding: while offset < bytes.count {
            let size = min(max(pieces.isEmpty ? bytes.count : pieces[turn % pieces.count], 1), bytes.count - offset)
            decoder.append(Array(bytes[offset..<(offset + size)]))
            offset += size
            turn += 1
            do throws(WebSocketViolation) {
                while let event = try decoder.next() {
                    switch event {
                    case .message(.text(let text)): outcome.events.append("text \(text.utf8.count)")
                    case .message(.binary(let data)): outcome.events.append("binary \(data.count)")
                    case .ping(let payload): outcome.events.append("ping \(payload.count)")
                    case .pong(let payload): outcome.events.append("pong \(payload.count)")
                    case .close(let status): outcome.events.append("close \(status.map { String($0.code.rawValue) } ?? "none")")
                    }
                }
            } catch {
                outcome.violation = error.code.rawValue
                break feeding
            }
        }
        outcome.leftover = outcome.violation == nil ? decoder.bufferedCount : 0
        return outcome
    }

    /// `payload` as one frame of `opcode` (a raw opcode value, 0–15), masked with `maskingKey`
    /// when there is one: what a harness re-encodes and decodes again.
    public static func encode(opcode: UInt8, payload: [UInt8], maskingKey: UInt32?) -> [UInt8]? {
        guard let opcode = WebSocketOpcode(rawValue: opcode) else { return nil }
        return WebSocketFrame(opcode: opcode, payload: payload).encoded(maskingKey: maskingKey)
    }
}
