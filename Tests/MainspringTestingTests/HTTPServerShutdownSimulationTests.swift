import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Synchronization
import Testing

/// `HTTPServer.shutdown(gracePeriod:)` on simulated loops, each step at an exact instant: the
/// requests in flight answered, what outlasts the grace cut, WebSockets told "going away", a
/// response never read cut (the server's other behaviour is HTTPServerSimulationTests.swift).
@Suite struct HTTPServerShutdownSimulationTests {
    /// A server with `/work`, which answers 2 s after it is asked (on the loop's clock), and
    /// `/ws`, a WebSocket that echoes until it ends.
    static func drainingServer(seed: UInt64) throws -> (Simulation, HTTPServer) {
        let simulation = try Simulation(seed: seed)
        simulation.network.latency = .milliseconds(1)
        let group = try simulation.makeGroup(loopCount: 2, host: "10.0.0.1")
        var routes = HTTPRoutes()
        routes.get("/work") { request async throws in
            try await request.loop.sleep(for: .seconds(2))
            return .text("done\n")
        }
        routes.webSocket("/ws") { socket in
            for await message in socket.messages { try await socket.send(message) }
        }
        let server = try HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80), routes: routes)
        return (simulation, server)
    }

    /// The first gap of a service stopped mid-traffic: six slow requests in flight, a shutdown
    /// at 1 s with 5 s of grace — it returns only once all six are answered (at 2 s and the
    /// answers' way back), each `200` with `Connection: close`, nothing aborted.
    @Test func shutdownWaitsForTheRequestsInFlight() async throws {
        let (simulation, server) = try Self.drainingServer(seed: 61)
        let client = HTTPClient(loop: simulation.loop, configuration: .init(maxConnectionsPerHost: 8))
        let (statuses, closing, report, stoppedAt) = try await simulation.run {
            () async throws -> ([Int], [String?], HTTPServer.ShutdownReport, Duration) in
            async let answers = withThrowingTaskGroup(of: HTTPClientResponse.self) { group in
                for _ in 0..<6 { group.addTask { try await client.get("http://10.0.0.1/work") } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            try await simulation.loop.sleep(for: .seconds(1))
            let report = await server.shutdown(gracePeriod: .seconds(5))
            let stoppedAt = simulation.now
            let responses = try await answers
            return (responses.map(\.status), responses.map { $0.headers["Connection"] }, report, stoppedAt)
        }
        #expect(statuses == Array(repeating: 200, count: 6))
        #expect(closing == Array(repeating: "close", count: 6))
        #expect(report == { var r = HTTPServer.ShutdownReport(); r.finished = 6; return r }(), "\(report)")
        // Connected at 2 ms, asked at 3 ms, answered at 2.003 s: the last response written, the
        // server closed in the same instant.
        #expect(stoppedAt == .milliseconds(2_003))
        #expect(server.isClosed)
        client.shutdown()
        simulation.advance(by: .seconds(1))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A grace period shorter than the work: at its end the requests still in flight are cut
    /// (their connections closed), counted aborted, and their clients fail.
    @Test func shutdownCutsWhatOutlastsTheGracePeriod() async throws {
        let (simulation, server) = try Self.drainingServer(seed: 62)
        let client = HTTPClient(loop: simulation.loop, configuration: .init(maxConnectionsPerHost: 8))
        let (failures, report, stoppedAt) = try await simulation.run {
            () async throws -> (Int, HTTPServer.ShutdownReport, Duration) in
            async let failures = withTaskGroup(of: Bool.self) { group in
                for _ in 0..<3 {
                    group.addTask { (try? await client.get("http://10.0.0.1/work")) == nil }
                }
                return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            try await simulation.loop.sleep(for: .seconds(1))
            let report = await server.shutdown(gracePeriod: .milliseconds(500))
            let stoppedAt = simulation.now
            return (await failures, report, stoppedAt)
        }
        #expect(failures == 3)
        #expect(report.aborted == 3 && report.finished == 0, "\(report)")
        #expect(stoppedAt == .milliseconds(1_500), "the grace period ended exactly 500 ms after the shutdown began")
        client.shutdown()
        simulation.advance(by: .seconds(3))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// An open WebSocket is closed with 1001 ("going away") and the shutdown waits for its
    /// closing handshake.
    @Test func shutdownClosesWebSocketsGoingAway() async throws {
        let (simulation, server) = try Self.drainingServer(seed: 63)
        let (status, report) = try await simulation.run { () async throws -> (WebSocket.CloseStatus, HTTPServer.ShutdownReport) in
            let socket = try await WebSocket.connect(to: "ws://10.0.0.1/ws", on: simulation.loop)
            try await socket.send(text: "hi")
            _ = await socket.receive()
            async let status = socket.closed
            let report = await server.shutdown(gracePeriod: .seconds(5))
            return (await status, report)
        }
        #expect(status.code == .goingAway, "\(status)")
        #expect(report.webSocketsClosed == 1 && report.webSocketsAborted == 0, "\(report)")
        #expect(report.finished == 0 && report.aborted == 0, "the upgrade request was done before the shutdown")
        simulation.advance(by: .seconds(6))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A handler that keeps writing (ignoring backpressure) to a client that never reads: the
    /// response stops moving once the client's buffers and the window are full, and the
    /// connection is cut `idleTimeout` after output last left — the handler's own writes do not
    /// keep it alive.
    @Test func aResponseThatKeepsBeingWrittenButNeverReadIsCut() async throws {
        let simulation = try Simulation(seed: 64)
        simulation.network.latency = .milliseconds(1)
        let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        var routes = HTTPRoutes()
        routes.on([.get], "/flood", streaming: { request, writer in
            let loop = request.loop
            writer.start()
            _ = loop.schedule(every: .milliseconds(100)) { timer in
                guard !writer.isCancelled else { return timer.cancel() }
                writer.write([UInt8](repeating: 0x61, count: 64 * 1024))
            }
        })
        let server = try await HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80, idleTimeout: .seconds(1)),
                                          routes: routes)
        let connection = try await simulation.run { () async throws -> Connection in
            let connection = try await Connection.connect(to: "10.0.0.1", port: 80, on: simulation.loop)
            try await connection.send("GET /flood HTTP/1.1\r\nHost: a\r\n\r\n")
            return connection  // never read
        }
        simulation.advance(by: .seconds(30))
        #expect(server.statistics.snapshot.connectionsTimedOut == 1, "\(server.statistics.snapshot)")
        #expect(server.statistics.snapshot.connectionsOpen == 0)
        connection.close()
        _ = try await simulation.run { await server.shutdown(gracePeriod: .seconds(1)) }
        simulation.advance(by: .seconds(2))
        #expect(simulation.network.openStreamEnds == 0)
    }
}
