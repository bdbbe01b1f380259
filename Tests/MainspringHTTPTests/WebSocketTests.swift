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

// MARK: - Helpers

private let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
private let venvPython = packageRoot.appendingPathComponent(".build/kv-venv/bin/python").path

/// Whether the test venv has Python's `websockets` (`make test-tools` makes it).
private let hasPythonWebSockets: Bool = {
    guard FileManager.default.isExecutableFile(atPath: venvPython) else { return false }
    let probe = try? runProgramSynchronously(venvPython, arguments: ["-c", "import websockets.sync.client, websockets.sync.server"])
    return probe.map { $0.status == 0 && !$0.crashedBySignal } ?? false
}()

/// A Python child of the test venv (posix_spawn, through the support's `ChildProcess`: no
/// blocked signals, nothing of the test process's inherited), ended with SIGKILL.
private final class PythonChild: @unchecked Sendable {
    let child: ChildProcess

    init(_ arguments: [String]) throws {
        child = try startProgram(venvPython, arguments: arguments)
    }

    func kill() {
        child.send(SIGKILL)
        _ = child.waitForExit()
    }

    /// Starts a Python server that prints its port on its first line: the child (kill it when
    /// done) and the port. A child that prints no port is killed, and the test fails here.
    static func server(_ arguments: [String]) async throws -> (child: PythonChild, port: UInt16) {
        let child = try PythonChild(arguments)
        let portLine = await child.child.readLine(timeout: .seconds(60)) ?? ""
        do {
            return (child, try #require(UInt16(portLine), "python server port: \(portLine)"))
        } catch {
            child.kill()
            throw error
        }
    }

    /// Runs a script to its end (killed after `timeout`): status, stdout, stderr. Unbuffered
    /// (`-u`), so that a script killed at its timeout still shows how far it got.
    static func run(_ arguments: [String], timeout: Duration = .seconds(60)) async throws -> (status: Int32, stdout: String, stderr: String) {
        let child = try PythonChild(["-u"] + arguments)
        let result = await child.child.waitForExit(timeout: timeout)
        return (result.status, result.stdout, result.timedOut ? result.stderr + "\n(killed at its \(timeout) timeout)" : result.stderr)
    }
}

private let hasCurl = ["/usr/bin", "/usr/local/bin"].contains { FileManager.default.isExecutableFile(atPath: "\($0)/curl") }

/// A server on its own one-loop group: the daemon's routes (`/ws/echo`) and test routes.
private final class WebSocketServer: @unchecked Sendable {
    /// Messages `/ws/flood` has sent so far.
    let flooded = FloodCount()
    let group: EventLoopGroup
    let server: HTTPServer
    var port: UInt16 { server.port }

    init(extra: (inout HTTPRoutes) -> Void = { _ in }) async throws {
        group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPService.routes(group: group, exporter: LoopMetricsExporter(group: group))
        routes.get("/hello") { _ in .text("hello\n") }
        routes.webSocket("/ws/small", configuration: .init(maxMessageBytes: 1000)) { socket in
            for await message in socket.messages { try await socket.send(message) }
        }
        routes.webSocket("/ws/keepalive", configuration: .init(pingInterval: .milliseconds(100))) { socket in
            for await _ in socket.messages {}
        }
        // The same at 500 ms, for the peer that answers: a loaded machine can stall a loop for
        // more than 100 ms between a ping and its pong.
        routes.webSocket("/ws/keepalive-slow", configuration: .init(pingInterval: .milliseconds(500))) { socket in
            for await _ in socket.messages {}
        }
        routes.webSocket("/ws/chat", shouldUpgrade: { request in
            guard request.headers["Origin"] != "http://evil.example" else { return .refuse(.text("origin\n", status: 403)) }
            return .accept(subprotocol: request.webSocketSubprotocols.contains("chat.v2") ? "chat.v2" : nil)
        }) { socket in
            try await socket.send(text: "protocol \(socket.subprotocol ?? "none")")
            for await message in socket.messages { try await socket.send(message) }
        }
        routes.webSocket("/ws/closer", configuration: .init(closeTimeout: .milliseconds(200))) { socket in
            await socket.closeAndWait(code: .init(rawValue: 4100), reason: "closing first")
        }
        let flooded = self.flooded
        routes.webSocket("/ws/flood", configuration: .init(outputLimit: 256 * 1024)) { socket in
            let chunk = [UInt8](repeating: 0x5A, count: 65_536)
            while true {
                try await socket.send(binary: chunk)
                flooded.count.add(1, ordering: .relaxed)
            }
        }
        extra(&routes)
        server = try await HTTPServer(group: group, routes: routes)
    }

    func stop() async {
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

/// A counter shared with a route.
private final class FloodCount: Sendable {
    let count = Atomic<Int>(0)
}

/// A blocking WebSocket client on a plain socket that sends whatever bytes it is told to (for
/// bad input) and reads the server's frames raw.
private final class RawWebSocket: @unchecked Sendable {
    let client: TestClient
    private var buffer: [UInt8] = []

    /// Connects and completes the handshake (checking `101` and `Sec-WebSocket-Accept`).
    init(port: UInt16, path: String = "/ws/echo") throws {
        client = try TestClient(port: port)
        let key = "dGhlIHNhbXBsZSBub25jZQ=="
        client.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n")
        let head = try #require(readHead(), "no response head")
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect((head + "\r\n").contains("\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"), "\(head)")
    }

    /// The response head, up to the blank line.
    func readHead() -> String? {
        while true {
            if let end = find([13, 10, 13, 10]) {
                let head = String(decoding: buffer[..<end], as: UTF8.self)
                buffer.removeSubrange(..<(end + 4))
                return head
            }
            guard fill() else { return nil }
        }
    }

    private func find(_ needle: [UInt8]) -> Int? {
        guard buffer.count >= needle.count else { return nil }
        for i in 0...(buffer.count - needle.count) where Array(buffer[i..<(i + needle.count)]) == needle { return i }
        return nil
    }

    /// Reads more into the buffer; false at end of file, an error or the 10 s timeout.
    private func fill() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(client.fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                buffer.append(contentsOf: chunk[..<n])
                return true
            }
            if n < 0 && errno == EINTR { continue }
            return false
        }
    }

    private func take(_ count: Int) -> [UInt8]? {
        while buffer.count < count { guard fill() else { return nil } }
        defer { buffer.removeSubrange(..<count) }
        return Array(buffer[..<count])
    }

    /// Sends a frame, masked unless `masked` is false, with `first` as its first byte.
    func send(first: UInt8, payload: [UInt8], masked: Bool = true) {
        var frame = [first]
        let maskBit: UInt8 = masked ? 0x80 : 0
        if payload.count < 126 {
            frame.append(maskBit | UInt8(payload.count))
        } else if payload.count <= 0xFFFF {
            frame += [maskBit | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            frame.append(maskBit | 127)
            for i in 0..<8 { frame.append(UInt8(truncatingIfNeeded: UInt64(payload.count) >> UInt64(56 - 8 * i))) }
        }
        if masked {
            let key: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]
            frame += key
            frame += payload.enumerated().map { $0.element ^ key[$0.offset % 4] }
        } else {
            frame += payload
        }
        client.send(frame)
    }

    func send(_ opcode: UInt8, _ payload: [UInt8], fin: Bool = true) {
        send(first: (fin ? 0x80 : 0) | opcode, payload: payload)
    }

    func sendBytes(_ bytes: [UInt8]) { client.send(bytes) }

    /// The server's next frame: (fin, opcode, payload); nil at end of file. Checks that it is
    /// not masked.
    func readFrame() -> (fin: Bool, opcode: UInt8, payload: [UInt8])? {
        guard let header = take(2) else { return nil }
        #expect(header[1] & 0x80 == 0, "a server frame must not be masked")
        var length = Int(header[1] & 0x7F)
        if length == 126 {
            guard let more = take(2) else { return nil }
            length = Int(more[0]) << 8 | Int(more[1])
        } else if length == 127 {
            guard let more = take(8) else { return nil }
            length = more.reduce(0) { $0 << 8 | Int($1) }
        }
        guard let payload = take(length) else { return nil }
        return (header[0] & 0x80 != 0, header[0] & 0x0F, payload)
    }

    /// Reads frames until a close frame: its code (nil if it had none), after skipping others.
    /// Fails the test at end of file without one.
    func readCloseCode() -> UInt16?? {
        while let frame = readFrame() {
            if frame.opcode == 0x8 {
                return .some(frame.payload.count >= 2 ? UInt16(frame.payload[0]) << 8 | UInt16(frame.payload[1]) : nil)
            }
        }
        return nil
    }

    /// Whether the server then ends the connection (end of file within 10 s).
    func readsEndOfFile() -> Bool {
        buffer.removeAll()
        return !fill() && buffer.isEmpty
    }
}

private func closePayload(_ code: UInt16, _ reason: String = "") -> [UInt8] {
    [UInt8(code >> 8), UInt8(code & 0xFF)] + Array(reason.utf8)
}

// MARK: - The codec

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

@Suite("WebSocket server", .serialized)
struct WebSocketServerTests {
    @Test("Echo: text, binary, a fragmented text message joined, 64 KiB binary; ping answered with its payload; the close handshake")
    func echo() async throws {
        let server = try await WebSocketServer()
        let port = server.port
        try await onPlainThread {
            let socket = try RawWebSocket(port: port)
            socket.send(0x1, Array("hello".utf8))
            let text = try #require(socket.readFrame())
            #expect(text.fin && text.opcode == 0x1 && text.payload == Array("hello".utf8))
            socket.send(0x2, [0, 1, 2, 255])
            #expect(socket.readFrame()?.payload == [0, 1, 2, 255])
            socket.send(0x1, Array("frag".utf8), fin: false)
            socket.send(0x9, Array("between".utf8))
            socket.send(0x0, Array("ment".utf8), fin: false)
            socket.send(0x0, Array("ed €".utf8), fin: true)
            let pong = try #require(socket.readFrame())
            #expect(pong.opcode == 0xA && pong.payload == Array("between".utf8))
            let joined = try #require(socket.readFrame())
            #expect(joined.opcode == 0x1 && String(decoding: joined.payload, as: UTF8.self) == "fragmented €")
            let big = (0..<65_536).map { UInt8(truncatingIfNeeded: $0) }
            socket.send(0x2, big)
            #expect(socket.readFrame()?.payload == big)
            socket.send(0x8, closePayload(1000, "done"))
            let close = try #require(socket.readFrame())
            #expect(close.opcode == 0x8 && close.payload.prefix(2) == [0x03, 0xE8])
            #expect(socket.readsEndOfFile())
        }
        await server.stop()
    }

    /// Sends `bytes` on a fresh WebSocket of `path`; returns the close code the server answers with.
    private func closeCode(port: UInt16, path: String = "/ws/echo", _ send: @escaping @Sendable (RawWebSocket) -> Void) async throws -> UInt16? {
        try await onPlainThread {
            let socket = try RawWebSocket(port: port, path: path)
            send(socket)
            let code = try #require(socket.readCloseCode(), "no close frame")
            #expect(socket.readsEndOfFile(), "the connection stays open after the close frame")
            return code
        }
    }

    @Test("Bad input, each with its close code and the connection closed; a WebSocket beside them and HTTP are undisturbed")
    func badInput() async throws {
        let server = try await WebSocketServer()
        let port = server.port
        let bystander = try await onPlainThread { try RawWebSocket(port: port) }
        let cases: [(String, UInt16, String, @Sendable (RawWebSocket) -> Void)] = [
            ("unmasked client frame", 1002, "/ws/echo", { $0.send(first: 0x81, payload: [0x61], masked: false) }),
            ("RSV1 without an extension", 1002, "/ws/echo", { $0.send(first: 0xC1, payload: [0x61]) }),
            ("RSV3", 1002, "/ws/echo", { $0.send(first: 0x91, payload: [0x61]) }),
            ("reserved data opcode 3", 1002, "/ws/echo", { $0.send(first: 0x83, payload: []) }),
            ("reserved control opcode 0xB", 1002, "/ws/echo", { $0.send(first: 0x8B, payload: []) }),
            ("ping of 126 bytes", 1002, "/ws/echo", { $0.send(0x9, [UInt8](repeating: 1, count: 126)) }),
            ("fragmented ping", 1002, "/ws/echo", { $0.send(0x9, [1], fin: false) }),
            ("continuation without a message", 1002, "/ws/echo", { $0.send(0x0, [0x61]) }),
            ("invalid UTF-8", 1007, "/ws/echo", { $0.send(0x1, [0x61, 0xFF]) }),
            ("invalid UTF-8 split across fragments", 1007, "/ws/echo", {
                $0.send(0x1, [0x61, 0xF0, 0x9F], fin: false)
                $0.send(0x0, [0x41], fin: false)
            }),
            ("declared length over the limit, no payload sent", 1009, "/ws/small", {
                $0.sendBytes([0x82, 0x80 | 126, 0x03, 0xE9, 1, 2, 3, 4])
            }),
            ("fragments over the limit", 1009, "/ws/small", {
                $0.send(0x2, [UInt8](repeating: 0, count: 900), fin: false)
                $0.send(0x0, [UInt8](repeating: 0, count: 101), fin: true)
            }),
            ("a 2^63 length", 1009, "/ws/echo", { $0.sendBytes([0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]) }),
            ("close code 1005 on the wire", 1002, "/ws/echo", { $0.send(0x8, closePayload(1005)) }),
            ("close code 999", 1002, "/ws/echo", { $0.send(0x8, closePayload(999)) }),
            ("close frame of one byte", 1002, "/ws/echo", { $0.send(0x8, [0x03]) }),
            ("close reason not UTF-8", 1007, "/ws/echo", { $0.send(0x8, closePayload(1000) + [0xFF]) }),
        ]
        for (name, expected, path, send) in cases {
            let code = try await closeCode(port: port, path: path, send)
            #expect(code == expected, "\(name): \(String(describing: code))")
        }
        // Data after the close frame: the close is answered (1000), the text never echoed.
        try await onPlainThread {
            let socket = try RawWebSocket(port: port)
            socket.send(0x8, closePayload(1000))
            socket.send(0x1, Array("after".utf8))
            let frame = try #require(socket.readFrame())
            #expect(frame.opcode == 0x8 && frame.payload.prefix(2) == [0x03, 0xE8])
            #expect(socket.readsEndOfFile())
        }
        // The bystander still echoes; HTTP still answers.
        try await onPlainThread {
            bystander.send(0x1, Array("still here".utf8))
            #expect(bystander.readFrame()?.payload == Array("still here".utf8))
            let hello = try TestClient(port: port)
            hello.send("GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            #expect(hello.readToEnd().hasSuffix("hello\n"))
        }
        await server.stop()
    }

    @Test("Upgrade errors: missing or bad key 400, wrong or missing version 426 with Sec-WebSocket-Version: 13, not an upgrade 426, POST 405")
    func upgradeErrors() async throws {
        let server = try await WebSocketServer()
        let port = server.port
        @Sendable func exchange(_ request: String) throws -> String {
            let client = try TestClient(port: port)
            client.send(request)
            return client.readToEnd()
        }
        let base = "GET /ws/echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\n"
        try await onPlainThread {
            let noKey = try exchange(base + "Sec-WebSocket-Version: 13\r\n\r\n")
            #expect(noKey.hasPrefix("HTTP/1.1 400 "), "\(noKey)")
            let shortKey = try exchange(base + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2hvcnQ=\r\n\r\n")
            #expect(shortKey.hasPrefix("HTTP/1.1 400 "), "\(shortKey)")
            let version = try exchange(base + "Sec-WebSocket-Version: 12\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            #expect(version.hasPrefix("HTTP/1.1 426 ") && version.contains("Sec-WebSocket-Version: 13\r\n"), "\(version)")
            let noVersion = try exchange(base + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            #expect(noVersion.hasPrefix("HTTP/1.1 426 "), "\(noVersion)")
            let plain = try exchange("GET /ws/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            #expect(plain.hasPrefix("HTTP/1.1 426 "), "\(plain)")
            let post = try exchange("POST /ws/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            #expect(post.hasPrefix("HTTP/1.1 405 "), "\(post)")
            let refused = try exchange(base.replacingOccurrences(of: "/ws/echo", with: "/ws/chat") + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                + "Origin: http://evil.example\r\n\r\n")
            #expect(refused.hasPrefix("HTTP/1.1 403 "), "\(refused)")
        }
        if hasCurl {
            let url = "http://127.0.0.1:\(port)/ws/echo"
            let common = ["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Connection: Upgrade", "-H", "Upgrade: websocket"]
            let missingKey = try await runProgram("curl", arguments: common + ["-H", "Sec-WebSocket-Version: 13", url])
            #expect(missingKey.stdout == "400", "\(missingKey.stdout) \(missingKey.stderr)")
            let wrongVersion = try await runProgram("curl", arguments: common + [
                "-H", "Sec-WebSocket-Version: 8", "-H", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", url,
            ])
            #expect(wrongVersion.stdout == "426", "\(wrongVersion.stdout) \(wrongVersion.stderr)")
        } else {
            print("note: curl is not installed (make test-tools installs it): the curl half of the upgrade-error test was skipped")
        }
        await server.stop()
    }

    @Test("Keep-alive: a peer that answers nothing gets pings, then close 1001, then the connection ends")
    func keepAliveClosesSilentPeer() async throws {
        let server = try await WebSocketServer()
        let port = server.port
        try await onPlainThread {
            let socket = try RawWebSocket(port: port, path: "/ws/keepalive")
            let started = ContinuousClock.now
            var pings = 0
            var closeCode: UInt16?
            while let frame = socket.readFrame() {
                if frame.opcode == 0x9 { pings += 1 }
                if frame.opcode == 0x8 {
                    closeCode = UInt16(frame.payload[0]) << 8 | UInt16(frame.payload[1])
                    break
                }
            }
            #expect(pings >= 1)
            #expect(closeCode == 1001)
            #expect(socket.readsEndOfFile())
            // Two intervals (100 ms each) at least; generous on a loaded machine.
            #expect(ContinuousClock.now - started >= .milliseconds(150))
            #expect(ContinuousClock.now - started < .seconds(10))
        }
        // A peer that answers pings stays: the library's client answers them by itself.
        let loop = server.group.loops[0]
        let client = try await WebSocket.connect(to: "ws://127.0.0.1:\(port)/ws/keepalive-slow", on: loop)
        try await loop.sleep(for: .milliseconds(2_600))  // five ticks: pings answered, it stays
        #expect(client.isOpen)
        #expect(await client.closeAndWait() == WebSocket.CloseStatus(code: .normalClosure))
        await server.stop()
    }

    @Test("Subprotocol chosen by the route's hook; the library's client sees it")
    func subprotocol() async throws {
        let server = try await WebSocketServer()
        let loop = server.group.loops[0]
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/chat", on: loop, subprotocols: ["chat.v1", "chat.v2"])
        #expect(socket.subprotocol == "chat.v2")
        #expect(await socket.receive() == .text("protocol chat.v2"))
        let plain = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/chat", on: loop)
        #expect(plain.subprotocol == nil)
        #expect(await plain.receive() == .text("protocol none"))
        await plain.closeAndWait()
        await socket.closeAndWait()
        await server.stop()
    }
}

extension WebSocketServerTests {
    @Test("Closing handshake deadline: a peer that never answers the server's close frame is cut off after closeTimeout")
    func closeDeadline() async throws {
        let server = try await WebSocketServer()
        let port = server.port
        try await onPlainThread {
            let socket = try RawWebSocket(port: port, path: "/ws/closer")
            let frame = try #require(socket.readFrame())
            #expect(frame.opcode == 0x8 && frame.payload == closePayload(4100, "closing first"))
            let started = ContinuousClock.now
            #expect(socket.readsEndOfFile())
            #expect(ContinuousClock.now - started >= .milliseconds(120))
            #expect(ContinuousClock.now - started < .seconds(10))
        }
        await server.stop()
    }

    @Test("Backpressure: send suspends while a peer does not read (bounded output), and resumes as it reads")
    func backpressure() async throws {
        let server = try await WebSocketServer()
        let port = server.port
        let socket = try await onPlainThread { try RawWebSocket(port: port, path: "/ws/flood") }
        // Not reading: the sender fills the output limit and the kernel's buffers, then waits.
        var last = -1
        var stable = 0
        let deadline = ContinuousClock.now + .seconds(20)
        while stable < 5 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(100))
            let now = server.flooded.count.load(ordering: .relaxed)
            stable = now == last ? stable + 1 : 0
            last = now
        }
        #expect(stable >= 5, "the sender never stopped")
        // 64 KiB each: a few MiB of kernel buffers on loopback plus the 256 KiB limit.
        #expect(last < 512, "\(last) messages sent to a peer that reads nothing")
        let stalled = last
        try await onPlainThread {
            for _ in 0..<(stalled + 64) { _ = try #require(socket.readFrame()) }
        }
        #expect(server.flooded.count.load(ordering: .relaxed) > stalled)
        await server.stop()
    }

    @Test("A send waiting for a peer that reads nothing, its task cancelled: it throws cancelled and the WebSocket closes")
    func cancelledSend() async throws {
        let server = try await WebSocketServer { routes in
            routes.webSocket("/ws/deaf", configuration: .init(maxQueuedMessages: 1)) { socket in
                _ = await socket.closed  // reads nothing: its queue fills, then TCP's window
            }
        }
        let group = try EventLoopGroup(loopCount: 1)
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/deaf", on: group.loops[0],
                                                 configuration: .init(outputLimit: 64 * 1024,
                                                                      closeTimeout: .milliseconds(200)))
        let sent = FloodCount()
        let sender = Task { () async -> WebSocketError? in
            let chunk = [UInt8](repeating: 0x41, count: 65_536)
            do throws(WebSocketError) {
                // Each send returns once queued; the peer reads nothing, so one of them waits.
                while true {
                    try await socket.send(binary: chunk)
                    sent.count.add(1, ordering: .relaxed)
                }
            } catch {
                return error
            }
        }
        sender.cancel()  // whether it waits already or not: the wait it meets ends at once
        #expect(await sender.value == .cancelled)
        // A cancelled send closes the WebSocket, as a cancelled reader does (posted to its loop).
        let status = await socket.closed
        #expect(status.code != .normalClosure, "\(status)")
        #expect(!socket.isOpen)
        await #expect(throws: WebSocketError.self) { try await socket.send(text: "after") }
        await group.shutdown(gracePeriod: .seconds(2))
        await server.stop()
    }

    @Test("A WebSocket whose last handle is dropped closes with 1001, going away (the library's rule for handles)")
    func droppedWebSocketCloses() async throws {
        let seen = Locked<WebSocket.CloseStatus?>(nil)
        let server = try await WebSocketServer { routes in
            routes.webSocket("/ws/watch") { socket in
                for await _ in socket.messages {}
                let status = await socket.closed
                seen.withLock { $0 = status }
            }
        }
        let group = try EventLoopGroup(loopCount: 1)
        do {
            let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/watch", on: group.loops[0])
            try await socket.send(text: "hello")
        }  // nothing can use it any more
        #expect(await eventually { seen.value != nil }, "the server never saw the WebSocket end")
        #expect(seen.value?.code == .goingAway, "\(String(describing: seen.value))")
        await group.shutdown(gracePeriod: .seconds(2))
        await server.stop()
    }

    @Test("mainspring-daemon --http-port 0 serves GET /ws/echo: text and binary echoed to the library's client")
    func daemonEcho() async throws {
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--http-port", "0", "--loops", "2"])
        _ = await daemon.readLine(timeout: .seconds(30))
        let banner = try #require(daemon.readLine(timeout: .seconds(30)), "no HTTP banner")
        let port = try #require(banner.split(separator: ":").last.flatMap { UInt16($0) }, "\(banner)")
        let group = try EventLoopGroup(loopCount: 1)
        // 2 MiB back: over the client's default limit (1 MiB), so raise it.
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(port)/ws/echo", on: group.loops[0],
                                                 configuration: .init(maxMessageBytes: 4 << 20))
        try await socket.send(text: "daemon")
        #expect(await socket.receive() == .text("daemon"))
        let big = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0) }
        try await socket.send(binary: big)
        #expect(await socket.receive() == .binary(big))
        #expect(await socket.closeAndWait() == WebSocket.CloseStatus(code: .normalClosure))
        await group.shutdown(gracePeriod: .seconds(2))
        daemon.send(SIGTERM)
        let exit = await daemon.waitForExit(timeout: .seconds(30))
        #expect(exit.status == 0 && !exit.crashedBySignal, "\(exit.summary)")
    }
}

extension WebSocketServerTests {
    @Test("HTTPServer.close() closes the WebSockets it upgraded with 1001")
    func serverCloseClosesWebSockets() async throws {
        let server = try await WebSocketServer()
        let group = try EventLoopGroup(loopCount: 1)
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/echo", on: group.loops[0])
        try await socket.send(text: "before")
        #expect(await socket.receive() == .text("before"))
        await server.server.closeAndWait()
        #expect(await socket.receive() == nil)
        #expect(await socket.closed == WebSocket.CloseStatus(code: .goingAway, reason: "server closing"))
        await group.shutdown(gracePeriod: .seconds(2))
        await server.stop()
    }
}

// MARK: - The library's client

@Suite("WebSocket client", .serialized)
struct WebSocketClientTests {
    @Test("Client against the server: text, binary, 1 MiB, many messages in order, trySend, the close handshake both ways")
    func clientEcho() async throws {
        let server = try await WebSocketServer()
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/echo", on: loop)
        try await socket.send(text: "héllo")
        #expect(await socket.receive() == .text("héllo"))
        try await socket.send(binary: [1, 2, 3])
        #expect(await socket.receive() == .binary([1, 2, 3]))
        let big = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        try await socket.send(binary: big)
        #expect(await socket.receive() == .binary(big))
        for i in 0..<200 { try await socket.send(text: "m\(i)") }
        var received: [String] = []
        for await message in socket.messages {
            if case .text(let text) = message { received.append(text) }
            if received.count == 200 { break }
        }
        #expect(received == (0..<200).map { "m\($0)" })
        #expect(socket.trySend(text: "offered"))
        #expect(await socket.receive() == .text("offered"))
        let status = await socket.closeAndWait(code: .init(rawValue: 4000), reason: "bye")
        #expect(status.code == .init(rawValue: 4000))  // the server echoes the code
        #expect(!socket.isOpen)
        do {
            try await socket.send(text: "late")
            Issue.record("send after close did not throw")
        } catch {
            guard case .closed = error else { Issue.record("\(error)"); return }
        }
        #expect(await socket.receive() == nil)
        await group.shutdown(gracePeriod: .seconds(2))
        await server.stop()
    }

    @Test("Client handshake checks: a plain HTTP route (not 101), a server that is not there, not a ws:// URL")
    func handshakeFailures() async throws {
        let server = try await WebSocketServer()
        let loop = server.group.loops[0]
        await #expect(throws: WebSocketError.self) {
            _ = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/hello", on: loop)
        }
        do {
            _ = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/hello", on: loop)
        } catch {
            guard case .handshakeFailed(let reason) = error else { Issue.record("\(error)"); return }
            #expect(reason.contains("200"), "\(reason)")
        }
        await #expect(throws: WebSocketError.invalidURL("http://127.0.0.1/")) {
            _ = try await WebSocket.connect(to: "http://127.0.0.1/", on: loop)
        }
        // A listener that accepts and never answers: the handshake deadline.
        let listener = await onPlainThread { () -> (Int32, UInt16) in
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            _ = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            listen(fd, 8)
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
            return (fd, UInt16(bigEndian: address.sin_port))
        }
        defer { close(listener.0) }
        let started = ContinuousClock.now
        do {
            _ = try await WebSocket.connect(to: "ws://127.0.0.1:\(listener.1)/", on: loop,
                                            configuration: .init(handshakeTimeout: .milliseconds(300)))
            Issue.record("a silent server's handshake succeeded")
        } catch {
            guard case .handshakeFailed = error else { Issue.record("\(error)"); return }
        }
        #expect(ContinuousClock.now - started >= .milliseconds(250))
        #expect(ContinuousClock.now - started < .seconds(10))
        await server.stop()
    }
}

// MARK: - Interop with Python's websockets

@Suite("WebSocket interop (Python websockets)", .serialized,
       .enabled(if: hasPythonWebSockets, "needs .build/kv-venv with websockets (make test-tools makes it)"))
struct WebSocketInteropTests {
    @Test("Python's client against the server: text, binary, fragmented, ping/pong, close 1000 and 4001 with a reason")
    func pythonClient() async throws {
        let server = try await WebSocketServer()
        let script = """
        import sys
        from websockets.sync.client import connect
        url = sys.argv[1]
        with connect(url, max_size=None, open_timeout=120) as ws:
            ws.send("héllo"); print("text", ws.recv())
            ws.send(bytes([0, 1, 255])); print("binary", list(ws.recv()))
            ws.send(["frag", "ment", "ed"]); print("fragmented", ws.recv())
            ws.send([b"ab", b"cd"]); print("fragmented-binary", ws.recv())
            big = bytes(range(256)) * 4096
            ws.send(big); print("big", ws.recv() == big)
            print("pong", ws.ping(b"payload").wait(10))
            ws.close(4001, "done here")
            print("close", ws.close_code, ws.close_reason)
        with connect(url, open_timeout=120) as ws:
            ws.send("x"); ws.recv()
        print("second", ws.close_code)
        """
        let result = try await PythonChild.run(["-c", script, "ws://127.0.0.1:\(server.port)/ws/echo"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout == """
        text héllo
        binary [0, 1, 255]
        fragmented fragmented
        fragmented-binary b'abcd'
        big True
        pong True
        close 4001 done here
        second 1000

        """, "\(result.stdout)\n\(result.stderr)")
        await server.stop()
    }

    @Test("Python's client sending bad input gets the close codes (unmasked frames are not possible from it: raw tests cover them)")
    func pythonClientBadUTF8() async throws {
        let server = try await WebSocketServer()
        let script = """
        import sys
        from websockets.sync.client import connect
        from websockets.frames import Frame, Opcode
        from websockets.exceptions import ConnectionClosed
        with connect(sys.argv[1], open_timeout=120) as ws:
            with ws.protocol_mutex:
                ws.protocol.send_frame(Frame(Opcode.TEXT, b"\\xff\\xfe", fin=True))
                ws.send_data()
            try:
                ws.recv(timeout=10)
            except ConnectionClosed as e:
                print("closed", e.rcvd.code if e.rcvd else None)
        """
        let result = try await PythonChild.run(["-c", script, "ws://127.0.0.1:\(server.port)/ws/echo"])
        // The script reaches into the library's internals (send_frame); if its version moved
        // them, say so rather than fail on Python.
        if result.stderr.contains("AttributeError") {
            print("note: this websockets version has no protocol.send_frame/send_data; bad-UTF-8 interop skipped")
        } else {
            #expect(result.stdout == "closed 1007\n", "\(result.stdout)\n\(result.stderr)")
        }
        await server.stop()
    }

    @Test("The library's client against Python's server: text, binary, fragmented from Python joined, close both ways")
    func pythonServer() async throws {
        let script = """
        import sys
        from websockets.sync.server import serve
        def handler(ws):
            for message in ws:
                if message == "fragment please":
                    ws.send(["one ", "two ", "three"])
                elif message == "close please":
                    ws.close(4002, "as asked")
                    return
                else:
                    ws.send(message)
        with serve(handler, "127.0.0.1", 0, open_timeout=120) as server:
            print(server.socket.getsockname()[1], flush=True)
            server.serve_forever()
        """
        let (child, port) = try await PythonChild.server(["-c", script])
        defer { child.kill() }
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(port)/", on: loop)
        try await socket.send(text: "héllo")
        #expect(await socket.receive() == .text("héllo"))
        try await socket.send(binary: [9, 8, 7])
        #expect(await socket.receive() == .binary([9, 8, 7]))
        let big = (0..<300_000).map { UInt8(truncatingIfNeeded: $0) }
        try await socket.send(binary: big)
        #expect(await socket.receive() == .binary(big))
        try await socket.send(text: "fragment please")
        #expect(await socket.receive() == .text("one two three"))
        try await socket.send(text: "close please")
        #expect(await socket.receive() == nil)
        #expect(await socket.closed == WebSocket.CloseStatus(code: .init(rawValue: 4002), reason: "as asked"))
        // And a close from this side.
        let second = try await WebSocket.connect(to: "ws://127.0.0.1:\(port)/", on: loop)
        try await second.send(text: "x")
        #expect(await second.receive() == .text("x"))
        let status = await second.closeAndWait(code: .goingAway, reason: "leaving")
        #expect(status == WebSocket.CloseStatus(code: .goingAway, reason: "leaving"))
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

// MARK: - permessage-deflate

@Suite("WebSocket compression (permessage-deflate)", .serialized)
struct WebSocketCompressionTests {
    @Test("Negotiation: the server's answer to offers, and the client's reading of answers")
    func negotiation() {
        let defaults = WebSocket.Compression()
        #expect(DeflateAgreement.answer(offers: ["permessage-deflate; client_max_window_bits"], settings: defaults)?.response
            == "permessage-deflate")
        let asked = DeflateAgreement.answer(
            offers: ["permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10"],
            settings: defaults)
        #expect(asked?.response == "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10")
        #expect(asked?.agreement == DeflateAgreement(serverNoContextTakeover: true, clientNoContextTakeover: true,
                                                      serverMaxWindowBits: 10, clientMaxWindowBits: 15))
        // The first acceptable offer wins: an unknown parameter, a bad value, a duplicate, an
        // 8-bit server window (zlib has none) are each skipped.
        #expect(DeflateAgreement.answer(offers: ["permessage-deflate; foo, permessage-deflate; server_max_window_bits=16",
                                                 "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
                                                 "permessage-deflate; server_max_window_bits=8, x-webkit-deflate-frame"],
                                        settings: defaults) == nil)
        #expect(DeflateAgreement.answer(offers: ["permessage-deflate; foo, permessage-deflate"], settings: defaults)?.response
            == "permessage-deflate")
        // This side's settings: no context takeover and a smaller window are announced.
        #expect(DeflateAgreement.answer(offers: ["permessage-deflate"], settings: .init(contextTakeover: false, maxWindowBits: 11))?.response
            == "permessage-deflate; server_no_context_takeover; server_max_window_bits=11")
        // The client's side.
        #expect(DeflateAgreement.offer(defaults) == "permessage-deflate; client_max_window_bits")
        #expect(DeflateAgreement.accepted(["permessage-deflate; client_max_window_bits=12; server_no_context_takeover"], settings: defaults)
            == DeflateAgreement(serverNoContextTakeover: true, clientNoContextTakeover: false, serverMaxWindowBits: 15, clientMaxWindowBits: 12))
        #expect(DeflateAgreement.accepted(["permessage-deflate; client_max_window_bits=8"], settings: defaults) == nil)
        #expect(DeflateAgreement.accepted(["permessage-deflate; mystery"], settings: defaults) == nil)
        #expect(DeflateAgreement.accepted(["permessage-deflate", "permessage-deflate"], settings: defaults) == nil)
    }

    @Test("zlib: messages round-trip with and without context takeover; inflating stops at the limit (a bomb); garbage is refused")
    func zlib() throws {
        for takeover in [true, false] {
            let deflater = try #require(Deflater(windowBits: 15, contextTakeover: takeover))
            let inflater = try #require(Inflater())
            var sizes: [Int] = []
            for i in 0..<5 {
                let message = Array(String(repeating: "{\"id\":\(i),\"name\":\"sensor\",\"value\":42}", count: 50).utf8)
                let compressed = message.withUnsafeBytes { deflater.compress($0) }
                sizes.append(compressed.count)
                #expect(try inflater.inflate(compressed + [0, 0, 0xFF, 0xFF], limit: 1 << 20) == message)
            }
            // With context takeover the later messages refer back to the first: smaller.
            if takeover { #expect(sizes[1] < sizes[0] / 2, "\(sizes)") } else { #expect(sizes[1] == sizes[0], "\(sizes)") }
            let empty = [UInt8]().withUnsafeBytes { deflater.compress($0) }
            #expect(empty == [0x00])
            #expect(try inflater.inflate(empty + [0, 0, 0xFF, 0xFF], limit: 10) == [])
        }
        let deflater = try #require(Deflater(windowBits: 15, contextTakeover: true))
        let bomb = [UInt8](repeating: 0, count: 10 << 20).withUnsafeBytes { deflater.compress($0) }
        #expect(bomb.count < 20_000)
        #expect(throws: InflateFailure.tooBig) { try Inflater()!.inflate(bomb + [0, 0, 0xFF, 0xFF], limit: 1 << 20) }
        #expect(throws: InflateFailure.corrupt) { try Inflater()!.inflate([0xFF, 0xFF, 0xFF, 0x00, 0x12], limit: 1 << 20) }
    }

    @Test("Compressed frames: RSV1 on a continuation or a control frame is 1002; the inflated size counts against the limit (1009)")
    func compressedFrames() throws {
        let deflater = try #require(Deflater(windowBits: 15, contextTakeover: true))
        let text = Array(String(repeating: "abc", count: 1000).utf8)
        let compressed = text.withUnsafeBytes { deflater.compress($0) }
        func decode(_ frames: [[UInt8]], limit: Int = 1 << 20) -> Result<[WebSocketEvent], WebSocketViolation> {
            var decoder = WebSocketDecoder(expectsMaskedFrames: true, maxMessageBytes: limit, inflater: Inflater())
            var events: [WebSocketEvent] = []
            do throws(WebSocketViolation) {
                for frame in frames {
                    decoder.append(frame)
                    while let event = try decoder.next() { events.append(event) }
                }
            } catch {
                return .failure(error)
            }
            return .success(events)
        }
        let whole = WebSocketFrame(reserved: 0x40, opcode: .text, payload: compressed).encoded(maskingKey: 9)
        #expect(try decode([whole]).get() == [.message(.text(String(repeating: "abc", count: 1000)))])
        // Fragmented: the compressed bytes cut in two frames.
        let half = compressed.count / 2
        let first = WebSocketFrame(fin: false, reserved: 0x40, opcode: .text, payload: Array(compressed[..<half])).encoded(maskingKey: 9)
        let second = WebSocketFrame(opcode: .continuation, payload: Array(compressed[half...])).encoded(maskingKey: 9)
        #expect(try decode([first, second]).get() == [.message(.text(String(repeating: "abc", count: 1000)))])
        let badContinuation = WebSocketFrame(reserved: 0x40, opcode: .continuation, payload: Array(compressed[half...])).encoded(maskingKey: 9)
        #expect(throws: WebSocketViolation.self) { try decode([first, badContinuation]).get() }
        let badPing = WebSocketFrame(reserved: 0x40, opcode: .ping, payload: []).encoded(maskingKey: 9)
        if case .failure(let violation) = decode([badPing]) { #expect(violation.code == .protocolError) } else { Issue.record("RSV1 ping") }
        if case .failure(let violation) = decode([whole], limit: 2000) { #expect(violation.code == .messageTooBig) } else { Issue.record("limit") }
    }

    @Test("The library's client and server, compressed both ways (with and without context takeover)")
    func clientAndServer() async throws {
        let server = try await WebSocketServer()
        let loop = server.group.loops[0]
        for compression in [WebSocket.Compression(), WebSocket.Compression(contextTakeover: false, maxWindowBits: 10)] {
            let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/echo", on: loop,
                                                     configuration: .init(compression: compression))
            #expect(socket.isCompressed)
            for i in 0..<20 {
                let text = String(repeating: "message \(i) ", count: 200)
                try await socket.send(text: text)
                #expect(await socket.receive() == .text(text))
            }
            let noise = (0..<100_000).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) }
            try await socket.send(binary: noise)
            #expect(await socket.receive() == .binary(noise))
            #expect(socket.trySend(text: "offered"))
            #expect(await socket.receive() == .text("offered"))
            #expect(await socket.closeAndWait() == WebSocket.CloseStatus(code: .normalClosure))
        }
        // Not asked for: not used.
        let plain = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/echo", on: loop)
        #expect(!plain.isCompressed)
        await plain.closeAndWait()
        let refused = try await WebSocket.connect(to: "ws://127.0.0.1:\(server.port)/ws/small", on: loop,
                                                  configuration: .init(compression: .init()))
        #expect(!refused.isCompressed)  // that route does not compress
        await refused.closeAndWait()
        await server.stop()
    }

    @Test("Python's client, compressing: echo, a 1 MB repetitive message, and a decompression bomb over the limit closed with 1009",
          .enabled(if: hasPythonWebSockets, "needs .build/kv-venv with websockets (make test-tools makes it)"))
    func pythonClient() async throws {
        let server = try await WebSocketServer()
        let script = """
        import sys
        from websockets.sync.client import connect
        from websockets.exceptions import ConnectionClosed
        url = sys.argv[1]
        with connect(url, max_size=None, open_timeout=120) as ws:
            print("extensions", [e.name for e in ws.protocol.extensions])
            ws.send("héllo"); print("text", ws.recv())
            ws.send(["frag", "ment"]); print("fragmented", ws.recv())
            big = "0123456789abcdef" * 65536
            ws.send(big); print("big", ws.recv() == big)
            ws.send(bytes(range(256))); print("binary", ws.recv() == bytes(range(256)))
        with connect(url, max_size=None, open_timeout=120) as ws:
            ws.send(bytes(20 * 1024 * 1024))
            try:
                ws.recv(timeout=30)
            except ConnectionClosed as e:
                print("bomb", e.rcvd.code if e.rcvd else None)
        """
        let result = try await PythonChild.run(["-c", script, "ws://127.0.0.1:\(server.port)/ws/echo"])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout == """
        extensions ['permessage-deflate']
        text héllo
        fragmented fragment
        big True
        binary True
        bomb 1009

        """, "\(result.stdout)\n\(result.stderr)")
        await server.stop()
    }

    @Test("The library's client, compressing, against Python's server (which limits the client's window)",
          .enabled(if: hasPythonWebSockets, "needs .build/kv-venv with websockets (make test-tools makes it)"))
    func pythonServer() async throws {
        let script = """
        from websockets.sync.server import serve
        def handler(ws):
            names = [e.name for e in ws.protocol.extensions]
            for message in ws:
                ws.send(message if message != "extensions?" else ",".join(names))
        with serve(handler, "127.0.0.1", 0, max_size=None, open_timeout=120) as server:
            print(server.socket.getsockname()[1], flush=True)
            server.serve_forever()
        """
        let (child, port) = try await PythonChild.server(["-c", script])
        defer { child.kill() }
        let group = try EventLoopGroup(loopCount: 1)
        let socket = try await WebSocket.connect(to: "ws://127.0.0.1:\(port)/", on: group.loops[0],
                                                 configuration: .init(compression: .init()))
        #expect(socket.isCompressed)
        try await socket.send(text: "extensions?")
        #expect(await socket.receive() == .text("permessage-deflate"))
        for i in 0..<10 {
            let text = String(repeating: "line \(i) of a repetitive stream\n", count: 500)
            try await socket.send(text: text)
            #expect(await socket.receive() == .text(text))
        }
        let bytes = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 % 251) }
        try await socket.send(binary: bytes)
        #expect(await socket.receive() == .binary(bytes))
        #expect(await socket.closeAndWait() == WebSocket.CloseStatus(code: .normalClosure))
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

// MARK: - wss://

@Suite("WebSocket over TLS", .serialized)
struct WebSocketTLSTests {
    @Test("wss:// through MainspringTLS's connector against Python's TLS server; without a connector it is refused",
          .enabled(if: hasPythonWebSockets, "needs .build/kv-venv with websockets (make test-tools makes it)"))
    func wss() async throws {
        let certs = try #require(TestCertificates.shared, "needs the openssl command")
        let script = """
        import ssl, sys
        from websockets.sync.server import serve
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[1], sys.argv[2])
        def handler(ws):
            for message in ws:
                ws.send(message)
        with serve(handler, "127.0.0.1", 0, ssl=context, open_timeout=120) as server:
            print(server.socket.getsockname()[1], flush=True)
            server.serve_forever()
        """
        let (child, port) = try await PythonChild.server(["-c", script, certs.serverCertificate, certs.serverKey])
        defer { child.kill() }
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let trusting = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let socket = try await WebSocket.connect(to: "wss://127.0.0.1:\(port)/", on: loop,
                                                 configuration: .init(compression: .init()), secureConnector: .tls(trusting))
        try await socket.send(text: "over tls")
        #expect(await socket.receive() == .text("over tls"))
        let bytes = (0..<100_000).map { UInt8(truncatingIfNeeded: $0) }
        try await socket.send(binary: bytes)
        #expect(await socket.receive() == .binary(bytes))
        #expect(await socket.closeAndWait() == WebSocket.CloseStatus(code: .normalClosure))
        // Not trusted: the connect fails, naming TLS.
        let untrusting = try TLSClientContext()
        do {
            _ = try await WebSocket.connect(to: "wss://127.0.0.1:\(port)/", on: loop, secureConnector: .tls(untrusting))
            Issue.record("an untrusted server was accepted")
        } catch {
            guard case .connectFailed = error else { Issue.record("\(error)"); return }
        }
        // No connector: refused before connecting.
        do {
            _ = try await WebSocket.connect(to: "wss://127.0.0.1:\(port)/", on: loop)
            Issue.record("wss:// without a connector was accepted")
        } catch {
            guard case .invalidURL = error else { Issue.record("\(error)"); return }
        }
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("Our HTTPS server upgrades to wss://: echo over the same TLS session (our client and Python's websockets), bytes that came with the request kept, compression, a client that leaves reads as leaving, the server's close", .timeLimit(.minutes(5)))
    func httpsServerUpgrades() async throws {
        let certs = try #require(TestCertificates.shared, "needs the openssl command")
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let trusting = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let (ends, ended) = AsyncStream<WebSocket.CloseStatus>.makeStream()
        var routes = HTTPRoutes()
        routes.webSocket("/ws", configuration: .init(compression: .init())) { socket in
            for await message in socket.messages { try await socket.send(message) }
            ended.yield(await socket.closed)
        }
        routes.get("/plain") { _ in .text("still HTTPS\n") }
        let tls = try TLSServerContext(configuration: .init(certificates: [
            TLSCertificate(certificateFile: certs.serverCertificate, keyFile: certs.serverKey),
        ]))
        let server = try await HTTPServer(group: group, routes: routes, tls: tls)
        for compressed in [false, true] {
            let socket = try await WebSocket.connect(to: "wss://localhost:\(server.port)/ws", on: loop,
                                                     configuration: .init(compression: compressed ? .init() : nil),
                                                     secureConnector: .tls(trusting))
            #expect(socket.isCompressed == compressed)
            try await socket.send(text: "over tls")
            #expect(await socket.receive() == .text("over tls"))
            let bytes = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 % 251) }
            try await socket.send(binary: bytes)
            #expect(await socket.receive() == .binary(bytes))
            #expect(await socket.closeAndWait() == WebSocket.CloseStatus(code: .normalClosure))
        }
        // A frame sent in the same TLS record as the upgrade request is kept (read by evhttp
        // with the request, handed over with the session).
        let raw = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: trusting)
        let key = "dGhlIHNhbXBsZSBub25jZQ=="
        var request = Array("GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".utf8)
        request += Array("Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n".utf8)
        let mask: [UInt8] = [1, 2, 3, 4]
        let payload = Array("early".utf8)
        request += [0x81, 0x80 | UInt8(payload.count)] + mask + payload.enumerated().map { $1 ^ mask[$0 % 4] }
        try await raw.send(request)
        #expect(try await raw.readLine() == .line("HTTP/1.1 101 Switching Protocols"))
        while let event = try await raw.readLine(), event != .line("") {}
        #expect(try await raw.read(exactly: 2 + payload.count) == [0x81, UInt8(payload.count)] + payload)
        // The client leaves without a closing handshake or close_notify: the server's WebSocket
        // ends as one whose peer went away (1006), not with a TLS error.
        raw.abort()
        // Python's websockets, a client nobody here wrote, over wss:// with compression.
        if hasPythonWebSockets {
            let script = """
            import ssl, sys
            from websockets.sync.client import connect
            context = ssl.create_default_context(cafile=sys.argv[2])
            with connect(sys.argv[1], ssl=context, server_hostname="localhost", open_timeout=120) as ws:
                ws.send("from python"); print("text", ws.recv())
                ws.send(bytes(range(256)) * 100); print("binary", ws.recv() == bytes(range(256)) * 100)
                print("compressed", ws.protocol.extensions != [] if hasattr(ws, "protocol") else "?")
            """
            let result = try await PythonChild.run(["-c", script, "wss://localhost:\(server.port)/ws", certs.caCertificate])
            #expect(result.stdout == "text from python\nbinary True\ncompressed True\n", "\(result.stdout)\n\(result.stderr)")
        }
        // Plain HTTPS requests are served beside the WebSockets.
        let client = HTTPClient(loop: loop, configuration: .init(secureConnector: .tls(trusting)))
        let plain = try await client.get("https://localhost:\(server.port)/plain")
        #expect(plain.status == 200 && String(decoding: plain.body, as: UTF8.self) == "still HTTPS\n")
        // The server's side of each: closed normally, but the one whose client aborted (1006).
        var statuses: [WebSocket.CloseStatus] = []
        for await status in ends {
            statuses.append(status)
            if statuses.count == (hasPythonWebSockets ? 4 : 3) { break }
        }
        #expect(statuses.filter { $0.code == .normalClosure }.count == statuses.count - 1, "\(statuses)")
        #expect(statuses.filter { $0.code == .abnormalClosure }.count == 1, "\(statuses)")
        // The server's close starts the closing handshake of a wss:// WebSocket it upgraded.
        let last = try await WebSocket.connect(to: "wss://localhost:\(server.port)/ws", on: loop, secureConnector: .tls(trusting))
        try await last.send(text: "ping")
        #expect(await last.receive() == .text("ping"))
        await server.closeAndWait()
        #expect(await last.receive() == nil)
        let lastStatus = await last.closed
        #expect(lastStatus.code == .goingAway, "\(lastStatus)")
        client.shutdown()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
