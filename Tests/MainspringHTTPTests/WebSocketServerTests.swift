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
