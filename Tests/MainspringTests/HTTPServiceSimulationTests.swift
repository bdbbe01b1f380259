import ExampleServices
import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// The HTTP service of `mainspring-daemon` (`HTTPService.routes`) on the simulation's network:
/// its real routes, feeders and metrics, an `HTTPClient` and raw connections as its clients,
/// every `/work` chunk charged 50 µs of modelled CPU — so its answers and their timing are exact.
@Suite struct HTTPServiceSimulationTests {
    /// The service on a simulated group of two loops at `10.0.0.2` ("http.test", port 8080),
    /// its `/work` chunks costing `chunkCost` of modelled CPU each and counted in `chunksRun`.
    struct Service {
        let simulation: Simulation
        let server: HTTPServer
        let chunksRun = Guarded(0)

        init(seed: UInt64, chunkCost: Duration = .microseconds(50)) throws {
            let simulation = try Simulation(seed: seed)
            self.simulation = simulation
            simulation.network.latency = .milliseconds(1)
            let group = try simulation.makeGroup(loopCount: 2, host: "10.0.0.2")
            simulation.network.register(name: "http.test", address: "10.0.0.2")
            let chunksRun = self.chunksRun
            let routes = HTTPService.routes(group: group, exporter: LoopMetricsExporter(group: group)) { seed, checksum in
                simulation.consume(chunkCost)
                chunksRun.withLock { $0 += 1 }
                return WorkUnit.run(seed: seed, into: checksum)
            }
            server = try HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 8080), routes: routes)
        }
    }

    /// Echo, health, metrics and a fed `/work` job through `HTTPClient`: the right answers,
    /// `/work`'s progress by tenths and its checksum, and `/work`'s time exactly its modelled
    /// CPU (200 chunks × 50 µs) plus the request's and the response's trip.
    @Test func theHTTPServiceAnswersEchoHealthMetricsAndWork() async throws {
        let service = try Service(seed: 31)
        let simulation = service.simulation
        let client = HTTPClient(loop: simulation.loop)
        let (answers, workTime) = try await simulation.run { () async throws -> ([HTTPClientResponse], Duration) in
            var answers: [HTTPClientResponse] = []
            answers.append(try await client.post("http://http.test:8080/echo", headers: ["Content-Type": "text/x-test"],
                                                 body: Array("héllo".utf8)))
            answers.append(try await client.get("http://http.test:8080/healthz"))
            answers.append(try await client.get("http://http.test:8080/work?n=0"))
            let sent = simulation.now
            answers.append(try await client.get("http://http.test:8080/work?n=200"))
            let workTime = simulation.now - sent
            answers.append(try await client.get("http://http.test:8080/metrics"))
            return (answers, workTime)
        }
        #expect(answers.map(\.status) == [200, 200, 400, 200, 200])
        #expect(answers[0].text == "héllo")
        #expect(answers[0].headers["Content-Type"] == "text/x-test")
        #expect(answers[1].text == "ok\n")
        #expect(answers[2].text.contains("n must be a number in 1...1000000"))
        let progress = (1...9).map { "progress \($0 * 10)% (\($0 * 20)/200)\n" }.joined()
        #expect(answers[3].text == progress + "result 200 \(WorkUnit.checksum(chunks: 200))\n")
        #expect(service.chunksRun.withLock { $0 } == 200)
        #expect(workTime == .milliseconds(12), "10 ms of modelled CPU, one latency each way")
        #expect(answers[4].text.contains("mainspring_loop_"), "the loops' metrics")
        #expect(answers[4].headers["Content-Type"]?.hasPrefix("text/plain; version=0.0.4") == true)
        client.shutdown()
        try await simulation.run { await service.server.closeAndWait() }
        simulation.advance(by: .seconds(1))
        #expect(service.server.isClosed)
        #expect(simulation.network.openStreamEnds == 0, "no stream leaked")
    }

    /// A client reset in the middle of a long `/work` stream: the server meets the reset, its
    /// writer's cancel handler cancels the fed job, and the loops go idle long before the job's
    /// 5 s of modelled CPU would have run.
    @Test func aResetMidStreamCancelsTheWorkJob() async throws {
        let service = try Service(seed: 32)
        let simulation = service.simulation
        let network = simulation.network
        let (firstLine, outcome, resetAt) = try await simulation.run { () async throws -> (String, String, Duration) in
            let connection = try await Connection.connect(to: "http.test", port: 8080, on: simulation.loop)
            try await connection.send("GET /work?n=100000 HTTP/1.1\r\nHost: http.test\r\n\r\n")
            // The head, then the first chunk: its size line and "progress 10% (10000/100000)".
            while case .line(let line)? = try await connection.readLine(), !line.isEmpty, line != "\r" {}
            _ = try await connection.readLine()
            guard case .line(let first)? = try await connection.readLine() else { throw TestFailure("no progress line") }
            let resetAt = simulation.now
            network.reset("127.0.0.1", "10.0.0.2")
            var outcome = "no error"
            do {
                while try await connection.readLine() != nil {}
            } catch {
                outcome = "\(error)"
            }
            return (first, outcome, resetAt)
        }
        #expect(firstLine == "progress 10% (10000/100000)")
        #expect(outcome == "error 104 (Connection reset by peer)")
        simulation.runUntilIdle()
        // The server is not reading while its request is in flight, so — as with a real
        // socket — it meets the reset at its next write: the 20 % progress line, after the 20,000th
        // chunk. The write fails, the writer's cancel handler cancels the job, and the other
        // 80,000 chunks never run.
        #expect(resetAt < .milliseconds(600), "the 10 % line arrives after 10,000 chunks of 50 µs")
        #expect(service.chunksRun.withLock { $0 } == 20_000)
        #expect(simulation.now < .milliseconds(1100), "the loops went idle at the cancel")
        #expect(service.server.statistics.snapshot.requestsInFlight == 0)
        try await simulation.run { await service.server.closeAndWait() }
        simulation.advance(by: .seconds(1))
        #expect(simulation.network.openStreamEnds == 0, "no stream leaked")
    }

    /// `/ws/echo` through the library's own WebSocket client over the simulated network, its
    /// frames split into 7-byte segments: text and binary messages come back whole.
    @Test func theWebSocketEchoAnswersOverSplitSegments() async throws {
        let service = try Service(seed: 33)
        let simulation = service.simulation
        simulation.network.maxSegmentSize = 7
        let echoed = try await simulation.run { () async throws -> [WebSocket.Message] in
            let socket = try await WebSocket.connect(to: "ws://http.test:8080/ws/echo", on: simulation.loop)
            var echoed: [WebSocket.Message] = []
            for message in [WebSocket.Message.text("héllo"), .binary(Array(0..<200)), .text(String(repeating: "z", count: 70_000))] {
                try await socket.send(message)
                guard let answer = await socket.receive() else { throw TestFailure("the socket ended") }
                echoed.append(answer)
            }
            await socket.closeAndWait()
            return echoed
        }
        #expect(echoed == [.text("héllo"), .binary(Array(0..<200)), .text(String(repeating: "z", count: 70_000))])
        try await simulation.run { await service.server.closeAndWait() }
        simulation.advance(by: .seconds(5))
        #expect(simulation.network.openStreamEnds == 0, "no stream leaked")
    }
}
