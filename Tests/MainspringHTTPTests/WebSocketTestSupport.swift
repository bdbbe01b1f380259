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

// What the WebSocket suites share: the Python peer, a server with the test routes, a raw
// client that writes frames as given.

let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
let venvPython = packageRoot.appendingPathComponent(".build/kv-venv/bin/python").path

/// Whether the test venv has Python's `websockets` (`make test-tools` makes it).
let hasPythonWebSockets: Bool = {
    guard FileManager.default.isExecutableFile(atPath: venvPython) else { return false }
    let probe = try? runProgramSynchronously(venvPython, arguments: ["-c", "import websockets.sync.client, websockets.sync.server"])
    return probe.map { $0.status == 0 && !$0.crashedBySignal } ?? false
}()

/// A Python child of the test venv (posix_spawn, through the support's `ChildProcess`: no
/// blocked signals, nothing of the test process's inherited), ended with SIGKILL.
final class PythonChild: @unchecked Sendable {
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

let hasCurl = ["/usr/bin", "/usr/local/bin"].contains { FileManager.default.isExecutableFile(atPath: "\($0)/curl") }

/// A server on its own one-loop group: the daemon's routes (`/ws/echo`) and test routes.
final class WebSocketServer: @unchecked Sendable {
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
final class FloodCount: Sendable {
    let count = Atomic<Int>(0)
}

/// A blocking WebSocket client on a plain socket that sends whatever bytes it is told to (for
/// bad input) and reads the server's frames raw.
final class RawWebSocket: @unchecked Sendable {
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

func closePayload(_ code: UInt16, _ reason: String = "") -> [UInt8] {
    [UInt8(code >> 8), UInt8(code & 0xFF)] + Array(reason.utf8)
}

// MARK: - The codec
