import ExampleServices
import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringHTTP
import MainspringTLS
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

// WebSocket (RFC 6455): the frame codec on its own; the server driven with raw frames over a
// plain socket (every bad input with its close code, the others undisturbed); the library's
// client against its server; interop with Python's `websockets` (client and server) and curl.



@Suite("WebSocket codec")
struct WebSocketCodecTests {
    private func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    @Test("SHA-1 test vectors (FIPS 180 examples, empty, a million a's) and RFC 6455's Sec-WebSocket-Accept example")
    func sha1Vectors() {
        #expect(hex(sha1(Array("abc".utf8))) == "a9993e364706816aba3e25717850c26c9cd0d89d")
        #expect(hex(sha1([])) == "da39a3ee5e6b4b0d3255bfef95601890afd80709")
        #expect(hex(sha1(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)))
            == "84983e441c3bd26ebaae4aa1f95129e5e54670f1")
        #expect(hex(sha1([UInt8](repeating: 0x61, count: 1_000_000))) == "34aa973cd4c4daa4f61eeb2bdbad27316534016f")
        // 55, 56 and 64 bytes: the padding's edge cases.
        #expect(hex(sha1([UInt8](repeating: 0x61, count: 55))) == "c1c8bbdc22796e28c0e15163d20899b65621d65a")
        #expect(hex(sha1([UInt8](repeating: 0x61, count: 56))) == "c2db330f6083854c99d4b5bfb6e8f29f201be699")
        #expect(hex(sha1([UInt8](repeating: 0x61, count: 64))) == "0098ba824b5c16427bd7a1122a5a442a25ec644d")
        #expect(WebSocketHandshake.acceptValue(forKey: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    }

    @Test("Frames round-trip at the length boundaries (0, 125, 126, 65535, 65536), masked and not, fed a byte at a time")
    func roundTrip() throws {
        for length in [0, 1, 125, 126, 127, 65_535, 65_536, 70_001] {
            let payload = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            for masked in [false, true] {
                let bytes = WebSocketFrame(opcode: .binary, payload: payload).encoded(maskingKey: masked ? 0xDEAD_BEEF : nil)
                let headerCount = 2 + (length < 126 ? 0 : length <= 0xFFFF ? 2 : 8) + (masked ? 4 : 0)
                #expect(bytes.count == headerCount + length)
                var decoder = WebSocketDecoder(expectsMaskedFrames: masked, maxMessageBytes: 1 << 20)
                // A byte at a time for the small ones (every split point), in 1000-byte pieces for the rest.
                let step = length < 200 ? 1 : 1000
                var events: [WebSocketEvent] = []
                for start in stride(from: 0, to: bytes.count, by: step) {
                    decoder.append(Array(bytes[start..<min(bytes.count, start + step)]))
                    while let event = try decoder.next() { events.append(event) }
                }
                #expect(events == [.message(.binary(payload))], "length \(length) masked \(masked)")
            }
        }
    }

    @Test("Masking is its own inverse at every offset and length, and the mask bytes go in big-endian order")
    func masking() {
        for count in 0..<40 {
            let original = (0..<count).map { UInt8($0) }
            var bytes = original
            bytes.withUnsafeMutableBytes { WebSocketFrame.applyMask(0x0102_0304, to: $0) }
            #expect(bytes == original.enumerated().map { $0.element ^ UInt8($0.offset % 4 + 1) })
            bytes.withUnsafeMutableBytes { WebSocketFrame.applyMask(0x0102_0304, to: $0) }
            #expect(bytes == original)
        }
    }

    @Test("Fragments are joined; control frames between fragments pass through; text split inside a character is fine")
    func fragments() throws {
        let euro = Array("€".utf8)  // E2 82 AC
        var decoder = WebSocketDecoder(expectsMaskedFrames: true, maxMessageBytes: 100)
        let frames = [
            WebSocketFrame(fin: false, opcode: .text, payload: Array("a".utf8) + euro[0..<1]),
            WebSocketFrame(opcode: .ping, payload: [1, 2]),
            WebSocketFrame(fin: false, opcode: .continuation, payload: Array(euro[1..<2])),
            WebSocketFrame(fin: true, opcode: .continuation, payload: Array(euro[2...]) + Array("b".utf8)),
        ]
        for frame in frames { decoder.append(frame.encoded(maskingKey: 7)) }
        var events: [WebSocketEvent] = []
        while let event = try decoder.next() { events.append(event) }
        #expect(events == [.ping([1, 2]), .message(.text("a€b"))])
    }

    /// The violation `bytes` (frames from a client unless `fromServer`) raise.
    private func violation(_ frames: [[UInt8]], fromServer: Bool = false, limit: Int = 1000) -> WebSocketViolation? {
        var decoder = WebSocketDecoder(expectsMaskedFrames: !fromServer, maxMessageBytes: limit)
        do {
            for frame in frames {
                decoder.append(frame)
                while try decoder.next() != nil {}
            }
        } catch {
            return error
        }
        return nil
    }

    private func masked(_ opcode: WebSocketOpcode, _ payload: [UInt8], fin: Bool = true, reserved: UInt8 = 0) -> [UInt8] {
        WebSocketFrame(fin: fin, reserved: reserved, opcode: opcode, payload: payload).encoded(maskingKey: 0x1234_5678)
    }

    @Test("Each bad frame maps to its close code: 1002 for protocol errors, 1007 for bad UTF-8, 1009 over the limit")
    func violations() {
        // Masking: an unmasked client frame, a masked server frame at the client.
        #expect(violation([WebSocketFrame(opcode: .text, payload: [0x61]).encoded()])?.code == .protocolError)
        #expect(violation([masked(.text, [0x61])], fromServer: true)?.code == .protocolError)
        // Reserved bits (each), reserved opcodes (data 3–7, control B–F).
        for bit: UInt8 in [0x40, 0x20, 0x10] { #expect(violation([masked(.text, [0x61], reserved: bit)])?.code == .protocolError) }
        for opcode: UInt8 in [3, 7, 0xB, 0xF] {
            #expect(violation([[0x80 | opcode, 0x80, 1, 2, 3, 4]])?.code == .protocolError, "opcode \(opcode)")
        }
        // Control frames: over 125 bytes, fragmented.
        #expect(violation([masked(.ping, [UInt8](repeating: 0, count: 126))])?.code == .protocolError)
        #expect(violation([masked(.pong, [], fin: false)])?.code == .protocolError)
        #expect(violation([masked(.close, closePayload(1000), fin: false)])?.code == .protocolError)
        // Fragment order: continuation first, a new message inside one.
        #expect(violation([masked(.continuation, [0x61])])?.code == .protocolError)
        #expect(violation([masked(.text, [0x61], fin: false), masked(.binary, [0x62])])?.code == .protocolError)
        // UTF-8: invalid in one frame, invalid across fragments (found at the bad fragment, before
        // the message ends), a message that ends inside a character; overlong, surrogate, > U+10FFFF.
        #expect(violation([masked(.text, [0xFF])])?.code == .invalidPayload)
        #expect(violation([masked(.text, [0xE2, 0x82], fin: false), masked(.continuation, [0x28], fin: false)])?.code
            == .invalidPayload)
        #expect(violation([masked(.text, [0x61, 0xE2], fin: false), masked(.continuation, [0x82])])?.code == .invalidPayload)
        for bad: [UInt8] in [[0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xE0, 0x80, 0x80]] {
            #expect(violation([masked(.text, bad)])?.code == .invalidPayload, "\(bad)")
        }
        // The limit, against the declared length with no payload sent (nothing buffered), over
        // fragments, and a 2^63 (and 2^64 - 1) length.
        #expect(violation([[0x82, 0x80 | 126, 0x03, 0xE9]])?.code == .messageTooBig)  // 1001 bytes declared
        #expect(violation([masked(.binary, [UInt8](repeating: 0, count: 600), fin: false),
                           [0x00, 0x80 | 126, 0x01, 0x91]])?.code == .messageTooBig)  // 600 + 401
        #expect(violation([[0x82, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 0]])?.code == .messageTooBig)
        #expect(violation([[0x82, 0x80 | 127, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]])?.code == .messageTooBig)
        #expect(violation([masked(.binary, [UInt8](repeating: 0, count: 1000))]) == nil)  // exactly the limit
        // Close frames: invalid codes, a one-byte payload, a reason that is not UTF-8, data after close.
        for code: UInt16 in [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65_535] {
            #expect(violation([masked(.close, closePayload(code))])?.code == .protocolError, "code \(code)")
        }
        for code: UInt16 in [1000, 1001, 1003, 1007, 1011, 1014, 3000, 4999] {
            #expect(violation([masked(.close, closePayload(code))]) == nil, "code \(code)")
        }
        #expect(violation([masked(.close, [0x03])])?.code == .protocolError)
        #expect(violation([masked(.close, closePayload(1000) + [0xC3])])?.code == .invalidPayload)
        #expect(violation([masked(.close, closePayload(1000)), masked(.text, [0x61])])?.code == .protocolError)
    }

    @Test("UTF-8 check's ASCII fast path: a non-ASCII byte at each place of a word, characters split across words and pieces, bad bytes after long ASCII")
    func utf8FastPathBoundaries() {
        /// `pieces` through one validator: whether all were taken and it ends between characters.
        func valid(_ pieces: [[UInt8]]) -> Bool {
            var validator = UTF8Validator()
            for piece in pieces where !validator.validate(piece) { return false }
            return validator.isAtBoundary
        }
        let ascii = [UInt8](repeating: 0x61, count: 16)
        let euro = Array("€".utf8)  // E2 82 AC
        for position in 0..<16 {
            // A bad byte (a lone continuation, an invalid lead) at each position of a 16-byte run.
            for bad: UInt8 in [0x80, 0xFF, 0xC0] {
                var bytes = ascii
                bytes[position] = bad
                #expect(!valid([bytes]), "\(bad) at \(position)")
                #expect(!valid([bytes + ascii]), "\(bad) at \(position), ASCII after")
            }
            // A valid character starting at each position (its end crossing the 8- and 16-byte
            // words), with ASCII after it.
            var bytes = ascii
            bytes.replaceSubrange(position..<position + 1, with: euro)
            #expect(valid([bytes]), "€ at \(position)")
            #expect(valid([bytes + ascii]), "€ at \(position), ASCII after")
            // The same cut into two pieces at every point.
            for cut in 0...bytes.count {
                #expect(valid([Array(bytes[..<cut]), Array(bytes[cut...])]), "€ at \(position), cut at \(cut)")
            }
            // A character whose continuation is wrong, at each position.
            var broken = bytes
            broken[position + 1] = 0x28
            #expect(!valid([broken]), "broken € at \(position)")
        }
        // A character across the 8-byte boundary: lead byte at 7, continuation bytes at 8 and 9.
        let across = [UInt8](repeating: 0x61, count: 7) + euro + [UInt8](repeating: 0x62, count: 20)
        #expect(valid([across]))
        #expect(valid([Array(across[..<8]), Array(across[8...])]))
        #expect(valid([Array(across[..<9]), Array(across[9...])]))
        // Ending inside a character, after ASCII: taken, but not at a boundary.
        #expect(!valid([ascii + euro[0..<2]]))
        // Invalid bytes after a long ASCII run (surrogate, overlong, past U+10FFFF, truncated).
        let long = [UInt8](repeating: 0x7A, count: 4099)
        for bad: [UInt8] in [[0xED, 0xA0, 0x80], [0xC1, 0xBF], [0xF4, 0x90, 0x80, 0x80], [0xE2, 0x82, 0x61], [0xFE]] {
            #expect(!valid([long + bad + ascii]), "\(bad)")
            #expect(!valid([long, bad + ascii]), "\(bad), a piece of its own")
        }
        #expect(valid([long + Array("𝄞 текст".utf8) + long]))
    }

    @Test("Text frames: a character split across fragments after long ASCII is joined; a bad byte after long ASCII fails with 1007, at its fragment")
    func utf8AcrossFragmentsAfterASCII() throws {
        let long = [UInt8](repeating: 0x61, count: 1_000)
        let note = Array("𝄞".utf8)  // F0 9D 84 9E
        var decoder = WebSocketDecoder(expectsMaskedFrames: true, maxMessageBytes: 10_000)
        decoder.append(masked(.text, long + note[0..<1], fin: false))
        decoder.append(masked(.continuation, Array(note[1..<3]), fin: false))
        decoder.append(masked(.continuation, Array(note[3...]) + long))
        var events: [WebSocketEvent] = []
        while let event = try decoder.next() { events.append(event) }
        #expect(events == [.message(.text(String(decoding: long + note + long, as: UTF8.self)))])
        // Invalid after 1,000 ASCII bytes: in one frame, in a continuation (refused there, the
        // message not yet complete), and a character left open at the end.
        #expect(violation([masked(.text, long + [0xC3, 0x28])], limit: 10_000)?.code == .invalidPayload)
        #expect(violation([masked(.text, long, fin: false), masked(.continuation, long + [0xFF], fin: false)], limit: 10_000)?.code
            == .invalidPayload)
        #expect(violation([masked(.text, long + note[0..<2], fin: false), masked(.continuation, [0x61], fin: false)], limit: 10_000)?.code
            == .invalidPayload)
        #expect(violation([masked(.text, long + note[0..<3])], limit: 10_000)?.code == .invalidPayload)
    }

    @Test("Close payloads: the code and reason read back; an empty one has no status; long reasons are cut at a character")
    func closePayloads() throws {
        #expect(try WebSocketDecoder.closeStatus(closePayload(4000, "bye")) == WebSocket.CloseStatus(code: .init(rawValue: 4000), reason: "bye"))
        #expect(try WebSocketDecoder.closeStatus([]) == nil)
        let long = String(repeating: "é", count: 100)  // 200 bytes
        let payload = WebSocketFrame.closePayload(.normalClosure, reason: long)
        #expect(payload.count <= 125)
        #expect(try WebSocketDecoder.closeStatus(payload)?.reason == String(repeating: "é", count: 61))
    }
}

// MARK: - The server, driven with raw frames
