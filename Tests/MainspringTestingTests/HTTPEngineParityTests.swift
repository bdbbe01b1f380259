import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// The same raw requests to `HTTPServer` on a real loop (over loopback) and on a simulated one
/// (over the simulation's network): one engine on both, so the same answers in the same order —
/// status, header fields (all but `Date`, with `Connection` and `Content-Type` in full) and body,
/// refusals' bodies included — so that what a simulation tests is what production serves.
@Suite(.serialized) struct HTTPEngineParityTests {
    /// Requests whose answers both engines must agree on, each sent in one write on a
    /// connection of its own; the server closes each connection (a guard answer,
    /// `Connection: close`, or its 1 s idle timeout).
    static let requests: [String] = [
        "GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "HEAD /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /q?a=1&b=x%20y+z HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /q?a=1& HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /q?a=1&&b=2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /q?a HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /p%61th/%C3%A9 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET http://a/hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /hello HTTP/1.0\r\n\r\n",
        "GET /hello HTTP/1.0\r\n\r\nGET /hello HTTP/1.0\r\n\r\n",
        "GET /hello HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n",
        "GET http://a/hello HTTP/1.1\r\nHost: a\r\nProxy-Connection: close\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n",
        "POST /raw HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: close\r\n\r\nraw",
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\nGET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcd\r\n0\r\nX-T: 1\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4;ext=1\r\nabcd\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4 \r\nabcd\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\nabcd\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcdXY0\r\n\r\n",
        "POST /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "GET /nowhere HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "BREW /pot HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /hello HTTP/2.0\r\nHost: a\r\n\r\n",
        "GET /hello HTTP/1.2\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /hello\r\n\r\n",
        "GET /hello HTTP/1.1\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET  /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 99\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 99\r\n\r\n\(String(repeating: "b", count: 99))",
        "POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
        "GET /hello HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nConnection: close\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4 ;ext\r\nabcd\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcd0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0x4\r\nabcd\r\n0\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcd\r\n0\r\nno colon\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n4\r\nabcd\r\n0\r\nX-Long: \(String(repeating: "t", count: 1_200))\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
        "GET /a b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /stream HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /stream204 HTTP/1.1\r\nHost: a\r\n\r\nGET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "GET /stream HTTP/1.0\r\n\r\n",
        "GET /chunks HTTP/1.0\r\n\r\n",
        "HEAD /chunks HTTP/1.1\r\nHost: a\r\n\r\nGET /chunks HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            + String(repeating: "9\r\n123456789\r\n", count: 8) + "0\r\n\r\n",
    ]

    static var routes: HTTPRoutes {
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        routes.get("/q") { request in .text(request.queryItems.map { "\($0.name)=\($0.value)" }.joined(separator: ";") + "\n") }
        routes.get("/path/é") { request in .text("path \(request.path)\n") }
        routes.post("/echo") { request in .text("echo [\(request.text)]\n") }
        routes.post("/raw") { request in HTTPResponse(body: request.body) }
        routes.on([.get], "/stream", streaming: { _, writer in
            writer.start(headers: ["Content-Length": "6"])
            writer.write("hel")
            writer.write("lo\n")
            writer.finish()
        })
        routes.on([.get], "/stream204", streaming: { _, writer in
            writer.start(status: 204)
            writer.write("nothing")
            writer.finish()
        })
        routes.on([.get], "/chunks", streaming: { _, writer in
            writer.start()
            writer.write("one\n")
            writer.write("two\n")
            writer.finish()
        })
        return routes
    }

    static let configuration = HTTPServer.Configuration(host: "127.0.0.1", port: 0, maxHeaderBytes: 1_024, maxBodyBytes: 64,
                                                        idleTimeout: .seconds(1), headerTimeout: .seconds(1),
                                                        bodyTimeout: .seconds(1))

    /// Each answer in a reply: its status code, body and header fields.
    static func answers(_ reply: [UInt8]) -> [String] {
        var answers: [String] = []
        var index = 0
        func line() -> String? {
            guard let end = reply[index...].firstIndex(of: 0x0A) else { return nil }
            defer { index = end + 1 }
            var bytes = reply[index..<end]
            if bytes.last == 0x0D { bytes = bytes.dropLast() }
            return String(decoding: bytes, as: UTF8.self)
        }
        while let status = line() {
            let parts = status.split(separator: " ")
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1.") else {
                answers.append("unparsable: \(status)")
                break
            }
            var length: Int?
            var chunked = false
            var names: [String] = []
            while let field = line(), !field.isEmpty {
                let lower = field.lowercased()
                names.append(String(lower.prefix { $0 != ":" }) + (lower.hasPrefix("content-type") || lower.hasPrefix("connection") ? lower.drop { $0 != ":" } : ""))
                if lower.hasPrefix("content-length:") { length = Int(lower.dropFirst(15).trimmingPrefix(" ")) }
                if lower.hasPrefix("transfer-encoding:") && lower.contains("chunked") { chunked = true }
            }
            var body: [UInt8] = []
            let isHead = false
            if chunked {
                while let size = line(), let count = Int(size, radix: 16), count > 0, index + count <= reply.count {
                    body += reply[index..<(index + count)]
                    index += count
                    _ = line()
                }
                _ = line()
            } else if let length, !isHead {
                let end = min(reply.count, index + length)
                body = Array(reply[index..<end])
                index = end
            }
            answers.append("\(parts[1]) \(String(decoding: body, as: UTF8.self))" + " {" + names.sorted().joined(separator: ",") + "}")
        }
        return answers
    }

    /// The answers on a real loop.
    static func realAnswers() async throws -> [[String]] {
        let group = try EventLoopGroup(loopCount: 1)
        let server = try await HTTPServer(group: group, configuration: configuration, routes: routes)
        let port = server.port
        let replies = try await onPlainThread { () throws -> [[UInt8]] in
            try requests.map { request in
                let client = try TestClient(port: port)
                client.setReceiveTimeout(seconds: 5)
                client.send(request)
                return Array(client.readToEnd().utf8)
            }
        }
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
        return replies.map(answers)
    }

    /// The answers on a simulated loop.
    static func simulatedAnswers() async throws -> [[String]] {
        let simulation = try Simulation(seed: 41)
        simulation.network.latency = .milliseconds(1)
        let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.4")
        var configuration = configuration
        configuration.host = "0.0.0.0"
        configuration.port = 80
        let server = try await HTTPServer(group: group, configuration: configuration, routes: routes)
        let replies = try await simulation.run { () async throws -> [[UInt8]] in
            var replies: [[UInt8]] = []
            for request in requests {
                let connection = try await Connection.connect(to: "10.0.0.4", port: 80, on: simulation.loop)
                try await connection.send(request)
                var reply: [UInt8] = []
                while let bytes = try? await connection.read(upTo: 65_536) { reply += bytes }
                connection.close()
                replies.append(reply)
            }
            await server.closeAndWait()
            return replies
        }
        return replies.map(answers)
    }

    @Test func realAndSimulatedLoopsGiveTheSameAnswers() async throws {
        let real = try await Self.realAnswers()
        let simulated = try await Self.simulatedAnswers()
        for (index, request) in Self.requests.enumerated() {
            #expect(simulated[index] == real[index], "\(request.debugDescription)")
        }
    }
}
