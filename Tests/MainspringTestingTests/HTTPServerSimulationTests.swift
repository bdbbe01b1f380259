import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Synchronization
import Testing

/// `HTTPServer` on simulated loops: the same routes, limits and answers as on real ones, its
/// connections the simulation's network's (the connection engine), every deadline exact on
/// virtual time.
@Suite struct HTTPServerSimulationTests {
    /// A server on a simulated group of two loops, with the routes of a small service.
    struct Service {
        let simulation: Simulation
        let server: HTTPServer

        init(seed: UInt64, configuration: HTTPServer.Configuration = .init(host: "0.0.0.0", port: 80)) throws {
            simulation = try Simulation(seed: seed)
            simulation.network.latency = .milliseconds(1)
            let group = try simulation.makeGroup(loopCount: 2, host: "10.0.0.1")
            simulation.network.register(name: "api.test", address: "10.0.0.1")
            var routes = HTTPRoutes()
            routes.get("/hello") { request in .text("hello \(request.query("name") ?? "nobody")\n") }
            routes.post("/echo") { request in HTTPResponse(body: request.body) }
            routes.on([.get], "/slow", responding: { request, responder in
                _ = request.loop.schedule(after: .milliseconds(500)) { responder.send(.text("late\n")) }
            })
            routes.on([.get], "/count", streaming: { request, writer in
                let loop = request.loop
                writer.start()
                for index in 1...3 {
                    _ = loop.schedule(after: .milliseconds(100 * index)) {
                        writer.write("\(index)\n")
                        if index == 3 { writer.finish() }
                    }
                }
            })
            server = try HTTPServer(group: group, configuration: configuration, routes: routes)
        }
    }

    /// A response as a raw client reads it: the status line, the header fields, the body.
    struct RawResponse {
        var statusLine: String
        var fields: [(String, String)]
        var body: String
        func field(_ name: String) -> String? { fields.first { $0.0.lowercased() == name.lowercased() }?.1 }
    }

    /// Reads one response off `connection`: a `Content-Length` body, a chunked one, or one that
    /// ends with the connection. Nil at the end of the input.
    static func withoutCR(_ line: String) -> String { line.hasSuffix("\r") ? String(line.dropLast()) : line }

    static func readResponse(_ connection: Connection) async throws -> RawResponse? {
        guard case .line(let statusLine)? = try await connection.readLine() else { return nil }
        var fields: [(String, String)] = []
        while case .line(let line)? = try await connection.readLine() {
            let text = Self.withoutCR(line)
            if text.isEmpty { break }
            let colon = text.firstIndex(of: ":")!
            fields.append((String(text[..<colon]), String(text[text.index(after: colon)...].drop { $0 == " " })))
        }
        var response = RawResponse(statusLine: Self.withoutCR(statusLine), fields: fields, body: "")
        if let length = response.field("Content-Length").flatMap(Int.init) {
            if length > 0 { response.body = String(decoding: try await connection.read(exactly: length) ?? [], as: UTF8.self) }
        } else if response.field("Transfer-Encoding") == "chunked" {
            while case .line(let sizeLine)? = try await connection.readLine() {
                let size = Int(Self.withoutCR(sizeLine), radix: 16) ?? 0
                let chunk = try await connection.read(exactly: size + 2) ?? []
                if size == 0 { break }
                response.body += String(decoding: chunk.dropLast(2), as: UTF8.self)
            }
        } else {
            while let bytes = try await connection.read(upTo: 65_536) { response.body += String(decoding: bytes, as: UTF8.self) }
        }
        return response
    }

    @Test func routesAnswerOverTheSimulatedNetworkAtExactInstants() async throws {
        let service = try Service(seed: 21)
        let simulation = service.simulation
        let client = HTTPClient(loop: simulation.loop)
        let (answers, times) = try await simulation.run { () async throws -> ([HTTPClientResponse], [Duration]) in
            var answers: [HTTPClientResponse] = []
            var times: [Duration] = []
            for (method, url, body) in [("GET", "http://api.test/hello?name=J%C3%BCrgen+x", ""),
                                        ("POST", "http://api.test/echo", "payload"),
                                        ("GET", "http://api.test/nowhere", ""),
                                        ("POST", "http://api.test/hello", ""),
                                        ("GET", "http://api.test/slow", ""),
                                        ("GET", "http://api.test/count", "")]
            {
                let sent = simulation.now
                answers.append(method == "GET" ? try await client.get(url) : try await client.post(url, body: Array(body.utf8)))
                times.append(simulation.now - sent)
            }
            return (answers, times)
        }
        #expect(answers.map(\.status) == [200, 200, 404, 405, 200, 200])
        #expect(answers[0].text == "hello Jürgen x\n", "the query decoded, + as a space")
        #expect(answers[1].text == "payload")
        #expect(answers[3].headers["Allow"] == "GET, HEAD", "a GET route answers HEAD too")
        #expect(answers[4].text == "late\n")
        #expect(answers[5].text == "1\n2\n3\n", "a streamed response, chunk by chunk")
        // The first request connects (a round trip) and then takes one; the others reuse the
        // connection: one round trip each, plus the handler's own time.
        #expect(times == [.milliseconds(4), .milliseconds(2), .milliseconds(2), .milliseconds(2),
                          .milliseconds(502), .milliseconds(302)])
        #expect(service.server.statistics.snapshot.connectionsAccepted == 1, "one keep-alive connection for all six")
        client.shutdown()
        try await simulation.run { await service.server.closeAndWait() }
        simulation.advance(by: .seconds(1))
        #expect(service.server.isClosed)
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A simulated server dates its responses on virtual time — 2026-01-01 00:00:00 UTC at the
    /// simulation's start — so that a run of a seed is the same to the byte at every run: a
    /// routed answer and the engine's own refusal alike.
    @Test func responsesAreDatedOnVirtualTime() async throws {
        let service = try Service(seed: 27)
        let simulation = service.simulation
        let client = HTTPClient(loop: simulation.loop)
        let first = try await simulation.run { try await client.get("http://api.test/hello") }
        simulation.advance(by: .seconds(86_400 + 3_600 + 61))
        let (second, refusal) = try await simulation.run { () async throws -> (HTTPClientResponse, RawResponse?) in
            let second = try await client.get("http://api.test/hello")
            let connection = try await Connection.connect(to: "api.test", port: 80, on: simulation.loop)
            try await connection.send("BREW /pot HTTP/1.1\r\nHost: api.test\r\n\r\n")
            return (second, try await Self.readResponse(connection))
        }
        #expect(first.headers["Date"] == "Thu, 01 Jan 2026 00:00:00 GMT")
        #expect(second.headers["Date"] == "Fri, 02 Jan 2026 01:01:01 GMT")
        #expect(refusal?.statusLine == "HTTP/1.1 501 Not Implemented")
        #expect(refusal?.field("Date") == "Fri, 02 Jan 2026 01:01:01 GMT")
        client.shutdown()
        try await simulation.run { await service.server.closeAndWait() }
    }

    @Test func pipelinedRequestsOneByteAtATimeAreAnsweredInOrder() async throws {
        let service = try Service(seed: 22)
        let simulation = service.simulation
        simulation.network.maxSegmentSize = 1
        let responses = try await simulation.run { () async throws -> [RawResponse] in
            let connection = try await Connection.connect(to: "api.test", port: 80, on: simulation.loop)
            try await connection.send("GET /hello?name=a HTTP/1.1\r\nHost: api.test\r\n\r\n"
                + "POST /echo HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n4 ;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nTrailer: x\r\n\r\n"
                + "GET /hello?name=c HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
            var responses: [RawResponse] = []
            while let response = try await Self.readResponse(connection) { responses.append(response) }
            return responses
        }
        #expect(responses.map(\.statusLine) == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK", "HTTP/1.1 200 OK"])
        #expect(responses.map(\.body) == ["hello a\n", "abcdefg", "hello c\n"])
        #expect(responses[2].field("Connection") == "close")
        #expect(simulation.network.openStreamEnds == 0, "the server closed after the request that asked it to")
    }

    @Test func badRequestsGetTheGuardsAnswersAndTheirConnectionsClose() async throws {
        let service = try Service(seed: 23, configuration: .init(host: "0.0.0.0", port: 80, maxHeaderBytes: 512, maxBodyBytes: 16))
        let simulation = service.simulation
        let requests = [
            "GET /hello HTTP/1.1\r\n\r\n",
            "GET /hello HTTP/1.1\r\nHost: a\r\nX-Long: \(String(repeating: "x", count: 600))\r\n\r\n",
            "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 17\r\n\r\n\(String(repeating: "b", count: 17))",
            "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
            "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n123456789\r\n9\r\n123456789\r\n0\r\n\r\n",
            "BREW /pot HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /hello HTTP/2.0\r\nHost: a\r\n\r\n",
        ]
        let answers = try await simulation.run { () async throws -> [(String, String)] in
            var answers: [(String, String)] = []
            for request in requests {
                let connection = try await Connection.connect(to: "api.test", port: 80, on: simulation.loop)
                try await connection.send(request)
                guard let response = try await Self.readResponse(connection) else { throw TestFailure("no answer to \(request)") }
                answers.append((response.statusLine, response.body))
                // The server shut its side after the answer: the end of the input follows it.
                let after = try await connection.readLine()
                #expect(after == nil || after == .endOfFile, "after \(response.statusLine): \(String(describing: after))")
                connection.close()
            }
            return answers
        }
        #expect(answers.map(\.0) == [
            "HTTP/1.1 400 Bad Request", "HTTP/1.1 431 Request Header Fields Too Large", "HTTP/1.1 413 Payload Too Large",
            "HTTP/1.1 400 Bad Request", "HTTP/1.1 501 Not Implemented", "HTTP/1.1 413 Payload Too Large",
            "HTTP/1.1 501 Not Implemented", "HTTP/1.1 400 Bad Request",
        ])
        #expect(answers[0].1 == "an HTTP/1.1 request needs a Host header field\n")
        #expect(answers[1].1 == "request head larger than 512 bytes\n")
        #expect(answers[3].1 == "two Content-Length header fields with different values\n")
        #expect(service.server.statistics.snapshot.requestsInFlight == 0)
        simulation.advance(by: .seconds(3))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// The three deadlines, each to the instant: a head that stops halfway is cut at
    /// `headerTimeout` after its first byte, a body at `bodyTimeout` after its head, an idle
    /// keep-alive connection at `idleTimeout` after its last response.
    @Test func slowRequestsAndIdleConnectionsAreClosedAtTheirDeadlines() async throws {
        let service = try Service(seed: 24, configuration: .init(host: "0.0.0.0", port: 80, idleTimeout: .seconds(7),
                                                                 headerTimeout: .seconds(2), bodyTimeout: .seconds(3)))
        let simulation = service.simulation
        let ends = try await simulation.run { () async throws -> [Duration] in
            var ends: [Duration] = []
            for partial in ["GET /hello HTTP/1.1\r\nHo", "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nabc", nil] {
                let connection = try await Connection.connect(to: "api.test", port: 80, on: simulation.loop)
                let sent: Duration
                if let partial {
                    sent = simulation.now
                    try await connection.send(partial)
                } else {
                    try await connection.send("GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
                    _ = try await Self.readResponse(connection)
                    sent = simulation.now - .milliseconds(1)  // the response left the server then
                }
                while try await connection.readLine() != nil {}
                ends.append(simulation.now - sent)
                connection.close()
            }
            return ends
        }
        // Each deadline counts from when its bytes reached the server (one latency after they
        // were sent), and the close takes one latency back.
        #expect(ends == [.seconds(2) + .milliseconds(2), .seconds(3) + .milliseconds(2), .seconds(7) + .milliseconds(1)])
        #expect(service.server.statistics.snapshot.connectionsTimedOut == 3)
    }

    /// A response longer than the link carries in `idleTimeout` (2 MB through a 64 KiB window
    /// with 100 ms latency: over three seconds) is not cut at the idle timeout while it keeps
    /// moving, and its request counts as in flight until the last byte has left.
    @Test func aLongResponseKeepsItsConnectionWhileItMoves() async throws {
        let simulation = try Simulation(seed: 25)
        simulation.network.latency = .milliseconds(100)
        simulation.network.window = 65_536
        let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        var routes = HTTPRoutes()
        let payload = String(repeating: "0123456789", count: 200_000)
        routes.get("/big") { _ in HTTPResponse(body: Array(payload.utf8)) }
        let server = try await HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80, idleTimeout: .seconds(2)),
                                    routes: routes)
        let inFlight = Mutex<[Int]>([])
        let (response, took) = try await simulation.run { () async throws -> (RawResponse?, Duration) in
            let connection = try await Connection.connect(to: "10.0.0.1", port: 80, on: simulation.loop)
            let sent = simulation.now
            try await connection.send("GET /big HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            _ = simulation.loop.execute(after: .seconds(3)) {
                inFlight.withLock { $0.append(server.statistics.snapshot.requestsInFlight) }
            }
            let response = try await Self.readResponse(connection)
            let took = simulation.now - sent
            inFlight.withLock { $0.append(server.statistics.snapshot.requestsInFlight) }
            connection.close()
            return (response, took)
        }
        #expect(response?.statusLine == "HTTP/1.1 200 OK")
        #expect(response?.body == payload, "all 2,000,000 bytes")
        // The request's trip, then 31 windows of 64 KiB (2,000,000 bytes and the head), each one
        // latency on its way: the window paces it far past the 2 s idle timeout.
        #expect(took == .milliseconds(3_200))
        #expect(inFlight.withLock { $0 } == [1, 0], "in flight while it leaves, finished once it has")
        try await simulation.run { await server.closeAndWait() }
        simulation.advance(by: .seconds(3))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// The DocC article's "Your HTTP service, end to end" (TestingWithVirtualTime.md), as written there.
    @Test func aSlowHandlerMeetsTheClientsResponseTimeoutToTheInstant() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(1)
        let group = try simulation.makeGroup(loopCount: 2, host: "10.0.0.5")
        simulation.network.register(name: "api.test", address: "10.0.0.5")
        var routes = HTTPRoutes()
        routes.get("/fast") { _ in .text("fast\n") }
        routes.on([.get], "/slow", responding: { request, responder in
            _ = request.loop.schedule(after: .seconds(5)) { responder.send(.text("late\n")) }
        })
        let server = try await HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80), routes: routes)
        let client = HTTPClient(loop: simulation.loop, configuration: .init(responseTimeout: .seconds(2)))

        let (fast, slow) = try await simulation.run { () async throws -> (String, HTTPClientError?) in
            let fast = try await client.get("http://api.test/fast").text
            do throws(HTTPClientError) {
                _ = try await client.get("http://api.test/slow")
                return (fast, nil)
            } catch {
                return (fast, error)
            }
        }
        #expect(fast == "fast\n")
        #expect(slow == .responseTimeout(.seconds(2)))
        // Connected after one round trip (2 ms), /fast answered after another (2 ms), then
        // /slow: no answer for 2 s.
        #expect(simulation.now == .milliseconds(4) + .seconds(2))
        #expect(server.statistics.snapshot.requestsInFlight == 1, "its handler is still at work")
        client.shutdown()
        try await simulation.run { await server.closeAndWait() }
        simulation.advance(by: .seconds(5))
        #expect(server.isClosed)
    }

    /// A client that reads part of a long response and then stops: its connection is closed
    /// exactly `idleTimeout` after the response last moved — not at the next check after it.
    @Test func aStalledResponseIsCutExactlyIdleTimeoutAfterItLastMoved() async throws {
        let simulation = try Simulation(seed: 26)
        simulation.network.latency = .milliseconds(1)
        simulation.network.window = 65_536
        let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        var routes = HTTPRoutes()
        routes.get("/big") { _ in .text(String(repeating: "x", count: 1_000_000)) }
        let server = try await HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80, idleTimeout: .seconds(2)),
                                          routes: routes)
        let (lastRead, end) = try await simulation.run { () async throws -> (Duration, Duration) in
            let connection = try await Connection.connect(to: "10.0.0.1", port: 80, on: simulation.loop)
            try await connection.send("GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
            try await simulation.loop.sleep(for: .milliseconds(500))
            _ = try await connection.read(exactly: 65_536)  // one window's worth, then no more
            let lastRead = simulation.now
            // The server's side: polled every millisecond (this client reads nothing more, so
            // its own connection cannot see the end).
            while server.statistics.snapshot.connectionsTimedOut == 0, simulation.now < .seconds(10) {
                try await simulation.loop.sleep(for: .milliseconds(1))
            }
            let end = simulation.now
            connection.close()
            return (lastRead, end)
        }
        // The response last moved just after the read (the client's socket takes input up to its
        // read limit for a few more round trips of 2 ms), and the server cut it 2 s later — to the
        // millisecond of polling. Checked only every `idleTimeout` from the request, it would
        // have been cut at 4.003 s.
        #expect(end > lastRead + .seconds(2) && end <= lastRead + .seconds(2) + .milliseconds(10), "\(lastRead) \(end)")
        #expect(server.statistics.snapshot.connectionsTimedOut == 1)
        try await simulation.run { await server.closeAndWait() }
    }
}
