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
            guard case .tlsFailed(.handshakeFailed(let reason)) = error, reason.contains("did not verify") else {
                Issue.record("\(error)")
                return
            }
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
