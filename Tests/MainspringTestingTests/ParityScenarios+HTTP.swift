import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// The HTTP server both worlds run: its routes, and how a scenario starts and ends it.
enum ParityHTTP {
    /// The routes; the WebSockets' handlers write what they saw on `transcript`.
    static func routes(recording transcript: Transcript) -> HTTPRoutes {
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        routes.post("/echo") { request in .text("echo [\(request.text)]\n") }
        routes.get("/metrics") { _ in .text("metrics, which a smuggled request would reach\n") }
        // Three pieces, 20 ms apart (on the loop's clock): a chunked response written as it goes.
        routes.on([.get], "/chunks", streaming: { request, writer in
            let loop = request.loop
            writer.start(headers: ["Content-Type": "text/plain"])
            for (index, piece) in ["one\n", "two\n", "three\n"].enumerated() {
                _ = loop.schedule(after: .milliseconds(20 * (index + 1))) {
                    writer.write(piece)
                    if index == 2 { writer.finish() }
                }
            }
        })
        routes.webSocket("/ws", configuration: .init(compression: .init())) { socket in
            transcript.add("ws: compressed \(socket.isCompressed)")
            for await message in socket.messages {
                transcript.add("ws: got \(describe(message))")
                try await socket.send(message)
            }
            let status = await socket.closed
            transcript.add("ws: closed \(status)")
        }
        routes.webSocket("/plain-ws") { socket in
            for await message in socket.messages { try await socket.send(message) }
        }
        return routes
    }

    /// A WebSocket message in words: its kind, size, and the start of a text.
    static func describe(_ message: WebSocket.Message) -> String {
        switch message {
        case .text(let text): "text of \(text.utf8.count) bytes: \(text.prefix(12).debugDescription)"
        case .binary(let bytes): "binary of \(bytes.count) bytes: \(bytes.prefix(6))"
        }
    }

    /// Each response's bytes as lines, without `Date` (inherent: the real server dates on the
    /// machine's clock, the simulated one on virtual time) — everything else to the byte, CRs
    /// shown.
    static func lines(of reply: [UInt8]) -> [String] {
        reply.split(separator: 0x0A, omittingEmptySubsequences: false)
            .map { String(decoding: $0, as: UTF8.self) }
            .filter { !$0.hasPrefix("Date: ") }
            .map { "< " + $0.debugDescription }
    }

    /// A response read by `HTTPClient`: its status line, header fields in order but `Date`, body.
    static func lines(of response: HTTPClientResponse) -> [String] {
        ["status \(response.status) \(response.reason)"]
            + response.headers.fields.filter { $0.name.lowercased() != "date" }.map { "header \($0.name): \($0.value)" }
            + ["body \(response.text.debugDescription)"]
    }
}

extension ParityWorld {
    /// Runs `body` against an `HTTPServer` with `ParityHTTP.routes` on the server's group (the
    /// world it gets has the server's port); then waits until the server has no connection
    /// open, writes its counters on the server's transcript, and closes it.
    func withHTTPServer(configuration: HTTPServer.Configuration = .init(), tls: (any ServerConnectionSecurity)? = nil,
                        _ body: (ParityWorld) async throws -> Void) async throws
    {
        var configuration = configuration
        configuration.host = bindHost
        configuration.port = port
        let server: HTTPServer
        if let tls {
            server = try await HTTPServer(group: serverGroup, configuration: configuration, routes: ParityHTTP.routes(recording: self.server), tls: tls)
        } else {
            server = try await HTTPServer(group: serverGroup, configuration: configuration, routes: ParityHTTP.routes(recording: self.server))
        }
        do {
            try await body(listening(on: server.port))
            try await settle("the server's connections to close") { server.statistics.snapshot.connectionsOpen == 0 }
        } catch {
            await server.closeAndWait()
            throw error
        }
        let counters = server.statistics.snapshot
        self.server.add("accepted \(counters.connectionsAccepted) connections; responses "
                        + counters.responses.sorted { $0.key < $1.key }.filter { $0.value > 0 }.map { "\($0.key): \($0.value)" }
                        .joined(separator: ", ") + "; timed out \(counters.connectionsTimedOut)")
        await server.closeAndWait()
    }

    /// A plain connection to the server.
    func connect() async throws -> Connection {
        try await Connection.connect(to: serverHost, port: port, on: clientLoop)
    }
}

extension ParityScenario {
    /// Sends `request` on a new connection and reads until the connection ends; writes the
    /// reply's lines and how the connection ended on the client's transcript.
    /// With `within`, also whether the connection ended within that long (on the world's clock:
    /// real time, or virtual time in the simulation) — for an answer that must not wait for a
    /// timer.
    static func exchange(_ world: ParityWorld, _ request: String, label: String? = nil, within: Duration? = nil) async throws {
        let connection = try await world.connect()
        if let label { world.client.add("> \(label)") }
        let clock = world.clientLoop.clock
        let sent = clock.now
        try await connection.send(request)
        try await readToEnd(connection, world.client)
        if let within { world.client.add("ended within \(within): \(sent.duration(to: clock.now) < within)") }
    }

    /// Reads `connection` until it ends: the reply's lines and the end.
    static func readToEnd(_ connection: Connection, _ transcript: Transcript) async throws {
        var reply: [UInt8] = []
        let end: String
        do {
            while let bytes = try await connection.read(upTo: 65_536) { reply += bytes }
            end = "the end of input"
        } catch {
            end = "\(error)"
        }
        for line in ParityHTTP.lines(of: reply) { transcript.add(line) }
        transcript.add("ended: \(end)")
        connection.close()
    }

    /// Reads one response off `connection`, to the byte: its head, then a body by its
    /// `Content-Length` or its chunks (none after `HEAD`). Nil at the end of the input.
    static func readResponse(_ connection: Connection, afterHEAD: Bool = false) async throws -> [UInt8]? {
        guard case .found(let head)? = try await connection.read(until: [0x0D, 0x0A, 0x0D, 0x0A], limit: 16_384) else { return nil }
        var reply = head + [0x0D, 0x0A, 0x0D, 0x0A]
        let text = String(decoding: head, as: UTF8.self).lowercased()
        let fields = text.split(separator: "\r\n").dropFirst()
        let length = fields.first { $0.hasPrefix("content-length:") }.flatMap { Int($0.dropFirst(15).trimmingPrefix(" ")) }
        if afterHEAD || text.hasPrefix("http/1.1 1") { return reply }
        if fields.contains(where: { $0.hasPrefix("transfer-encoding:") }) {
            while case .found(let size)? = try await connection.read(until: [0x0D, 0x0A], limit: 64) {
                reply += size + [0x0D, 0x0A]
                let count = Int(String(decoding: size, as: UTF8.self), radix: 16) ?? 0
                reply += try await connection.read(exactly: count + 2) ?? []
                if count == 0 { break }
            }
        } else if let length, length > 0 {
            reply += try await connection.read(exactly: length) ?? []
        }
        return reply
    }

    static var http: [ParityScenario] { httpExchanges + http2 + [deadlines] }

    /// HTTP/2 (h2c with prior knowledge) between `HTTPClient` and `HTTPServer`: the same
    /// answers, streams and connection counts in both worlds.
    static let http2: [ParityScenario] = [
        ParityScenario("HTTP/2 (h2c): GET, POST, HEAD, a 404, a 405 and six requests at once on one connection") { world in
            try await world.withHTTPServer { world in
                var configuration = HTTPClient.Configuration()
                configuration.http2PriorKnowledge = true
                let client = HTTPClient(loop: world.clientLoop, configuration: configuration)
                let base = "http://\(world.serverHost):\(world.port)"
                for (method, path, body) in [("GET", "/hello", ""), ("POST", "/echo", "payload"), ("HEAD", "/hello", ""),
                                             ("GET", "/nowhere", ""), ("POST", "/hello", "")]
                {
                    let request = HTTPClientRequest(method: HTTPMethod(rawValue: method)!, url: base + path, body: Array(body.utf8))
                    world.client.add("> \(method) \(path)")
                    for line in ParityHTTP.lines(of: try await client.execute(request)) { world.client.add(line) }
                }
                let texts = try await withThrowingTaskGroup(of: String.self) { tasks in
                    for index in 0..<6 {
                        tasks.addTask { try await client.post(base + "/echo", body: Array("n\(index)".utf8)).text }
                    }
                    return try await tasks.reduce(into: [String]()) { $0.append($1) }
                }
                world.client.add("side by side: \(texts.sorted())")
                client.shutdown()
            }
        },

        ParityScenario("HTTP/2 (h2c): a streamed download read as it comes") { world in
            try await world.withHTTPServer { world in
                var configuration = HTTPClient.Configuration()
                configuration.http2PriorKnowledge = true
                let client = HTTPClient(loop: world.clientLoop, configuration: configuration)
                let response = try await client.stream(HTTPClientRequest(url: "http://\(world.serverHost):\(world.port)/chunks"))
                world.client.add("status \(response.status) \(response.reason)")
                for field in response.headers.fields where field.name.lowercased() != "date" {
                    world.client.add("header \(field.name): \(field.value)")
                }
                var body: [UInt8] = []
                for try await piece in response.body { body += piece }
                world.client.add("body \(String(decoding: body, as: UTF8.self).debugDescription)")
                client.shutdown()
            }
        },
    ]

    static let httpExchanges: [ParityScenario] = [
        ParityScenario("HTTPClient, keep-alive: GET, POST, HEAD, a 404 and a 405 on one connection") { world in
            try await world.withHTTPServer { world in
                let client = HTTPClient(loop: world.clientLoop)
                let base = "http://\(world.serverHost):\(world.port)"
                for (method, path, body) in [("GET", "/hello", ""), ("POST", "/echo", "payload"), ("HEAD", "/hello", ""),
                                             ("GET", "/nowhere", ""), ("POST", "/hello", ""), ("GET", "/hello", "")]
                {
                    let request = HTTPClientRequest(method: HTTPMethod(rawValue: method)!, url: base + path, body: Array(body.utf8))
                    world.client.add("> \(method) \(path)")
                    for line in ParityHTTP.lines(of: try await client.execute(request)) { world.client.add(line) }
                }
                let pooled = client.connectionCount(for: base)
                world.client.add("pooled: \(pooled.busy) busy, \(pooled.idle) idle")
                client.shutdown()
            }
        },

        ParityScenario("HTTPClient, a streamed (chunked) download read as it comes") { world in
            try await world.withHTTPServer { world in
                let client = HTTPClient(loop: world.clientLoop)
                let response = try await client.stream(HTTPClientRequest(url: "http://\(world.serverHost):\(world.port)/chunks"))
                world.client.add("status \(response.status) \(response.reason)")
                for field in response.headers.fields where field.name.lowercased() != "date" {
                    world.client.add("header \(field.name): \(field.value)")
                }
                // The whole body: where its pieces were cut depends on timing (two pieces may
                // be read at once on a loaded machine).
                var body: [UInt8] = []
                for try await piece in response.body { body += piece }
                world.client.add("body \(String(decoding: body, as: UTF8.self).debugDescription)")
                client.shutdown()
            }
        },

        ParityScenario("raw keep-alive: HEAD, GET, a 404, then Connection: close, one at a time on one connection") { world in
            try await world.withHTTPServer { world in
                let connection = try await world.connect()
                for (request, isHEAD) in [("HEAD /hello HTTP/1.1\r\nHost: a\r\n\r\n", true),
                                          ("GET /hello HTTP/1.1\r\nHost: a\r\n\r\n", false),
                                          ("GET /nowhere HTTP/1.1\r\nHost: a\r\n\r\n", false),
                                          ("GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", false)]
                {
                    world.client.add("> \(request.prefix { $0 != "\r" })")
                    try await connection.send(request)
                    let reply = try await readResponse(connection, afterHEAD: isHEAD)
                    for line in ParityHTTP.lines(of: reply ?? []) { world.client.add(line) }
                }
                try await readToEnd(connection, world.client)
            }
        },

        ParityScenario("raw chunked upload: three chunks, an extension and a trailer, echoed") { world in
            try await world.withHTTPServer { world in
                try await exchange(world, "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    + "4\r\nabcd\r\n3;note=x\r\nefg\r\n1\r\nh\r\n0\r\nX-Trailer: 1\r\n\r\n")
            }
        },

        ParityScenario("raw streamed download: the chunks' framing to the byte, then the end") { world in
            try await world.withHTTPServer { world in
                try await exchange(world, "GET /chunks HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                try await exchange(world, "GET /chunks HTTP/1.0\r\n\r\n", label: "HTTP/1.0: no chunks, the end of the stream ends it")
            }
        },

        ParityScenario("raw Expect: 100-continue: the interim 100, then the body, then the answer") { world in
            try await world.withHTTPServer { world in
                let connection = try await world.connect()
                try await connection.send("POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\nConnection: close\r\n\r\n")
                let interim = try await readResponse(connection)
                for line in ParityHTTP.lines(of: interim ?? []) { world.client.add(line) }
                world.client.add("> the body")
                try await connection.send("body")
                try await readToEnd(connection, world.client)
            }
        },
    ]

    /// Requests pipelined in one write: the server answers them in order, the last closing —
    /// at once, not when a timer of the connection fires.
    static let pipelining = ParityScenario("raw pipelining: three requests in one write, answered in order at once, the last closing") { world in
        try await world.withHTTPServer { world in
            try await exchange(world, "GET /hello HTTP/1.1\r\nHost: a\r\n\r\n"
                + "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
                + "GET /nowhere HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                within: .seconds(5))  // half the header timeout (10 s)
        }
    }

    /// The server's deadlines: a head that never ends is cut at `headerTimeout`, an idle
    /// keep-alive connection at `idleTimeout` — each closed, each client reading the end.
    static let deadlines = ParityScenario("HTTP deadlines: half a head cut at headerTimeout (300 ms), an idle keep-alive connection at idleTimeout (500 ms)") { world in
        try await world.withHTTPServer(configuration: .init(idleTimeout: .milliseconds(500), headerTimeout: .milliseconds(300))) { world in
            let clock = world.clientLoop.clock
            // Each wait counted from before the server could start its timer (the connect, the
            // request): a loaded machine may deliver the end late, never early.
            var start = clock.now
            let slow = try await world.connect()
            try await slow.send("GET /hello HTTP/1.1\r\nHost: a\r\n")  // and no more
            try await readToEnd(slow, world.client)
            var waited = start.duration(to: clock.now)
            world.client.add("ended after the header timeout, within 30 s: \(waited >= .milliseconds(300) && waited < .seconds(30))")

            let idle = try await world.connect()
            start = clock.now
            try await idle.send("GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
            for line in ParityHTTP.lines(of: try await readResponse(idle) ?? []) { world.client.add(line) }
            try await readToEnd(idle, world.client)
            waited = start.duration(to: clock.now)
            world.client.add("ended after the idle timeout, within 30 s: \(waited >= .milliseconds(500) && waited < .seconds(30))")
        }
    }
}
