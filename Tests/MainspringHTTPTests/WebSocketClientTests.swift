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
