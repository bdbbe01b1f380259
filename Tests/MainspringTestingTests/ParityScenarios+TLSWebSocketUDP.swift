import Mainspring
import MainspringHTTP
import MainspringTLS
import MainspringTestSupport
import MainspringTesting
import Testing

/// TLS (real OpenSSL on both worlds: over loopback, and over the simulation's bytes), WebSocket
/// (compressed, and bad frames as raw bytes), and UDP.
extension ParityScenario {
    /// The test certificates' contexts: a server for "localhost", a client trusting their CA (or
    /// another one).
    static func tlsContexts(trustingOtherCA: Bool = false) throws -> (server: TLSServerContext, client: TLSClientContext) {
        let certificates = try #require(TestCertificates.shared, "needs the openssl command")
        let server = try TLSServerContext(configuration: .init(certificateFile: certificates.serverCertificate,
                                                               keyFile: certificates.serverKey))
        let roots = trustingOtherCA ? certificates.untrustedCACertificate : certificates.caCertificate
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(roots)))
        return (server, client)
    }

    /// A TLS listener on the server's loop for `body` (the world it gets has the listener's
    /// port); its connections are closed, and the listener, when `body` returns.
    static func withTLSListener(_ world: ParityWorld, _ context: TLSServerContext,
                                server: @escaping @Sendable (Connection, Transcript) -> Void,
                                _ body: (ParityWorld) async throws -> Void) async throws
    {
        let accepted = Locked<[Connection]>([])
        let transcript = world.server
        let listener = try await world.onServerLoop {
            try Listener(.tcp(host: world.bindHost, port: world.port), on: world.serverLoop, tls: context) { connection in
                accepted.withLock { $0.append(connection) }
                server(connection, transcript)
            }
        }
        defer {
            listener.close()
            for connection in accepted.value { connection.close() }
        }
        try await body(world.listening(on: listener.port))
    }

    static let tlsWebSocketUDP: [ParityScenario] = [
        ParityScenario("TLS: an echo over a TLS listener, the session's version and verified certificate, then the client closes") { world in
            let (serverContext, clientContext) = try tlsContexts()
            try await withTLSListener(world, serverContext, server: { connection, transcript in
                transcript.add("session \(connection.tls?.version ?? "none")")
                recordingClose(connection, transcript)
                readingLines(connection, transcript, onLine: { connection.writeLine("echo: \($0)") }, atEnd: { connection.close() })
            }) { world in
                let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop,
                                                              tls: clientContext, serverName: world.certifiedHost)
                let session = connection.tls
                world.client.add("session \(session?.version ?? "none"), certificate verified: \(session?.peerCertificate?.isVerified == true)")
                try await connection.send(line: "hello over TLS")
                world.client.add("read \(String(describing: try await connection.readLine()))")
                connection.close()
                world.client.add(await ending(connection))
                try await world.settle("the server's end") { world.server.has("closed") }
                world.server.add("handshakes: \(serverContext.statistics.completedHandshakes) completed, \(serverContext.statistics.failedHandshakes) failed")
            }
        },

        ParityScenario("TLS: a certificate the client does not trust fails the connect, naming the check; the server counts a failed handshake") { world in
            let (serverContext, clientContext) = try tlsContexts(trustingOtherCA: true)
            try await withTLSListener(world, serverContext, server: { _, transcript in transcript.add("accepted") }) { world in
                do throws(TLSError) {
                    _ = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop,
                                                     tls: clientContext, serverName: world.certifiedHost)
                    world.client.add("connected")
                } catch {
                    world.client.add("failed: \(error)")
                }
                try await world.settle("the server's failed handshake") { serverContext.statistics.failedHandshakes > 0 }
                world.server.add("handshakes: \(serverContext.statistics.completedHandshakes) completed, \(serverContext.statistics.failedHandshakes) failed")
            }
        },

        ParityScenario("HTTPS: HTTPServer over TLS and HTTPClient with .tls: GET and POST on one connection, one handshake") { world in
            let (serverContext, clientContext) = try tlsContexts()
            try await world.withHTTPServer(tls: serverContext) { world in
                let client = HTTPClient(loop: world.clientLoop, configuration: .init(secureConnector: .tls(clientContext)))
                let base = "https://\(world.certifiedHost):\(world.port)"
                for line in ParityHTTP.lines(of: try await client.get(base + "/hello")) { world.client.add(line) }
                let big = String(repeating: "é", count: 3_000)
                let echoed = try await client.post(base + "/echo", body: Array(big.utf8))
                world.client.add("status \(echoed.status), echoed whole: \(echoed.text == "echo [\(big)]\n")")
                client.shutdown()
            }
            world.server.add("handshakes: \(serverContext.statistics.completedHandshakes) completed, \(serverContext.statistics.failedHandshakes) failed")
        },

        ParityScenario("WebSocket with permessage-deflate: text, binary and 64 KiB of repetitive text both ways, then close 1000") { world in
            try await world.withHTTPServer { world in
                let socket = try await WebSocket.connect(to: "ws://\(world.serverHost):\(world.port)/ws", on: world.clientLoop,
                                                         configuration: .init(compression: .init()))
                world.client.add("compressed \(socket.isCompressed)")
                let messages: [WebSocket.Message] = [.text("héllo"), .binary((0..<256).map { UInt8($0) }),
                                                     .text(String(repeating: "0123456789abcdef", count: 4_096))]
                for message in messages {
                    try await socket.send(message)
                    let echo = await socket.receive()
                    world.client.add("echo of \(ParityHTTP.describe(message)): \(echo == message ? "equal" : "\(echo.map(ParityHTTP.describe) ?? "none")")")
                }
                world.client.add("closed \(await socket.closeAndWait())")
                try await world.settle("the server's handler to end") { world.server.has("ws: closed") }
            }
        },

        ParityScenario("WebSocket bad frames as raw bytes: unmasked, a reserved opcode, RSV1 without compression, bad UTF-8: each closed with its code") { world in
            try await world.withHTTPServer { world in
                let frames: [(String, [UInt8])] = [
                    ("an unmasked text frame", [0x81, 0x02, 0x68, 0x69]),
                    ("reserved opcode 3", [0x83, 0x80, 1, 2, 3, 4]),
                    ("RSV1 set, no extension agreed", [0xC1, 0x81, 0, 0, 0, 0, 0x61]),
                    ("a text frame of invalid UTF-8", [0x81, 0x81, 0, 0, 0, 0, 0xFF]),
                ]
                for (label, frame) in frames {
                    let connection = try await world.connect()
                    try await connection.send("GET /plain-ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
                    for line in ParityHTTP.lines(of: try await readResponse(connection) ?? []) { world.client.add(line) }
                    world.client.add("> \(label)")
                    try await connection.send(frame)
                    world.client.add(await outcome { try await readFrame(connection) ?? "the end of input" })
                    try await readToEnd(connection, world.client)
                }
            }
        },

        ParityScenario("UDP echo: three datagrams each way, each side seeing the other's address") { world in
            let clientPort = Locked<UInt16>(0)
            let transcript = world.server
            let server = try await world.onServerLoop {
                let socket = try DatagramSocket(bindingTo: world.bindHost, port: world.port, on: world.serverLoop)
                try socket.onReceive { event in
                    guard case .datagram(let datagram) = event, let sender = datagram.address else {
                        return transcript.add("\(event)")
                    }
                    let text = String(decoding: datagram.bytes, as: UTF8.self)
                    transcript.add("\(text) from the client's port: \(sender.port == clientPort.value)")
                    _ = try? socket.trySend(Datagram(Array("echo: \(text)".utf8), to: sender))
                }
                return socket
            }
            let serverAddress = try SocketAddress(ipAddress: world.serverHost, port: server.localAddress.port)
            let client = try await world.onClientLoop {
                let socket = try DatagramSocket(bindingTo: "0.0.0.0", port: 0, on: world.clientLoop)
                clientPort.withLock { $0 = socket.localAddress.port }
                try socket.onReceive { event in
                    guard case .datagram(let datagram) = event else { return world.client.add("\(event)") }
                    world.client.add("\(String(decoding: datagram.bytes, as: UTF8.self)) from the server: \(datagram.address == serverAddress)")
                }
                for text in ["one", "two", "three"] {
                    let outcome = try socket.trySend(Datagram(Array(text.utf8), to: serverAddress))
                    world.client.add("sent \(text): \(outcome)")
                }
                return socket
            }
            try await world.settle("three echoes") { world.client.all.filter { $0.hasPrefix("echo") }.count == 3 }
            try await world.onClientLoop { client.close() }
            try await world.onServerLoop { server.close() }
        },
    ]

    /// Reads one WebSocket frame from a server (unmasked): "frame" with its first byte and, for a
    /// close frame, its code and reason; nil at the end of the input.
    static func readFrame(_ connection: Connection) async throws -> String? {
        guard let head = try await connection.read(exactly: 2) else { return nil }
        var length = Int(head[1] & 0x7F)
        if length >= 126 {
            let extended = try await connection.read(exactly: length == 126 ? 2 : 8) ?? []
            length = extended.reduce(0) { $0 << 8 | Int($1) }
        }
        let payload = try await connection.read(exactly: length) ?? []
        let first = String(head[0], radix: 16)
        guard head[0] & 0x0F == 0x8, payload.count >= 2 else { return "frame 0x\(first), \(payload.count) bytes" }
        let code = Int(payload[0]) << 8 | Int(payload[1])
        return "frame 0x\(first): close \(code) \(String(decoding: payload.dropFirst(2), as: UTF8.self).debugDescription)"
    }

    /// A TLS client that half-closes (`shutdownOutput()`) after its line: the server reads the
    /// end, answers nothing more and closes; the client reads the end.
    static let tlsHalfClose = ParityScenario("TLS half-close: the client's shutdownOutput() after its line; the server reads the end and closes") { world in
        let (serverContext, clientContext) = try tlsContexts()
        try await withTLSListener(world, serverContext, server: { connection, transcript in
            recordingClose(connection, transcript)
            readingLines(connection, transcript, onLine: { connection.writeLine("echo: \($0)") }, atEnd: { connection.close() })
        }) { world in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop,
                                                          tls: clientContext, serverName: world.certifiedHost)
            try await connection.send(line: "hello over TLS")
            world.client.add("read \(String(describing: try await connection.readLine()))")
            connection.shutdownOutput()
            world.client.add("read \(await outcome { try await connection.readLine() })")
            connection.close()
            world.client.add(await ending(connection))
            try await world.settle("the server's end") { world.server.has("closed") }
        }
    }
}
