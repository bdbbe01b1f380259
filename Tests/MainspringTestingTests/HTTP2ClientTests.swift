import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// `HTTPClient` over HTTP/2 against Mainspring's own server, in a simulation: one connection a
/// host carries the requests side by side, with the same deadlines, retries and streaming as
/// HTTP/1.1 — to the instant, in virtual time.
@Suite struct HTTP2ClientTests {
    /// A server on 10.0.0.2:80 (HTTP/1.1 and h2c) that counts its requests.
    final class Upstream: @unchecked Sendable {
        let server: HTTPServer
        let hits = Locked(0)

        init(_ simulation: Simulation) async throws {
            let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
            var routes = HTTPRoutes()
            let hits = hits
            routes.get("/version") { request in .text("\(request.version) \(request.headers["Host"] ?? "-")") }
            routes.get("/slow") { request async throws in
                try await request.loop.sleep(for: .seconds(1))
                return .text("slow")
            }
            routes.get("/stall") { request async throws in
                try await request.loop.sleep(for: .seconds(5))
                return .text("late")
            }
            routes.post("/echo") { request in HTTPResponse(headers: ["X-Length": "\(request.body.count)"], body: request.body) }
            routes.get("/flaky") { _ in
                let hit = hits.withLock { count -> Int in
                    count += 1
                    return count
                }
                return hit == 1 ? .status(503, headers: ["Retry-After": "1"]) : .text("second time")
            }
            routes.on([.get], "/download", streaming: { request, writer in
                writer.start(headers: ["Content-Type": "application/octet-stream"])
                var sent = 0
                func more() {
                    while writer.isWritable, sent < 64 {
                        writer.write([UInt8](repeating: UInt8(sent), count: 16 * 1024))
                        sent += 1
                    }
                    if sent == 64 { writer.finish() } else { writer.onWritable(more) }
                }
                more()
            })
            server = try await HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80), routes: routes)
        }
    }

    static func client(_ simulation: Simulation, _ configure: (inout HTTPClient.Configuration) -> Void = { _ in })
        -> HTTPClient
    {
        var configuration = HTTPClient.Configuration()
        configuration.http2PriorKnowledge = true
        configure(&configuration)
        return HTTPClient(loop: simulation.loop, configuration: configuration)
    }

    @Test func tenRequestsAtOnceShareOneConnection() async throws {
        let simulation = try Simulation(seed: 1)
        simulation.network.latency = .milliseconds(1)
        let upstream = try await Upstream(simulation)
        let client = Self.client(simulation)
        let outcomes = try await simulation.run { () async -> [(String, Duration)] in
            await withTaskGroup(of: (String, Duration).self) { group in
                for _ in 0..<10 { group.addTask { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/slow"), simulation) } }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        // All ten side by side: each answered one second (and the round trips) after the start.
        #expect(outcomes.map(\.0) == Array(repeating: "200 slow", count: 10))
        #expect(Set(outcomes.map(\.1)).count == 1, "\(outcomes)")
        #expect(outcomes[0].1 < .milliseconds(1_010))
        #expect(upstream.server.statistics.snapshot.connectionsAccepted == 1)
        let version = try await simulation.run { try await client.get("http://10.0.0.2/version").text }
        #expect(version == "HTTP/2 10.0.0.2")
        client.shutdown()
        _ = try await simulation.run { await upstream.server.shutdown(gracePeriod: .seconds(1)) }
    }

    @Test func aRequestTimeoutResetsItsStreamExactlyAndTheConnectionServesOn() async throws {
        let simulation = try Simulation(seed: 2)
        simulation.network.latency = .milliseconds(1)
        let upstream = try await Upstream(simulation)
        let client = Self.client(simulation) { $0.requestTimeout = .seconds(2) }
        let (stalled, at) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/stall"), simulation) }
        #expect(stalled == "\(HTTPClientError.requestTimeout(.seconds(2), phase: .awaitingResponse))")
        #expect(at == .seconds(2))
        let next = try await simulation.run { try await client.get("http://10.0.0.2/version").text }
        #expect(next == "HTTP/2 10.0.0.2")
        #expect(upstream.server.statistics.snapshot.connectionsAccepted == 1)
        client.shutdown()
        _ = try await simulation.run { await upstream.server.shutdown(gracePeriod: .seconds(10)) }
    }

    @Test func aRetryHonoursRetryAfterOverHTTP2() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(1)
        let upstream = try await Upstream(simulation)
        let client = Self.client(simulation) { $0.retryPolicy = .init(maxRetries: 2) }
        let (answer, at) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/flaky"), simulation) }
        #expect(answer == "200 second time")
        #expect(at >= .seconds(1) && at < .milliseconds(1_100), "\(at)")
        #expect(upstream.hits.value == 2)
        #expect(upstream.server.statistics.snapshot.connectionsAccepted == 1)
        client.shutdown()
        _ = try await simulation.run { await upstream.server.shutdown(gracePeriod: .seconds(1)) }
    }

    @Test func bodiesBothWaysAndAStreamedDownload() async throws {
        let simulation = try Simulation(seed: 4)
        simulation.network.latency = .milliseconds(1)
        let upstream = try await Upstream(simulation)
        let client = Self.client(simulation)
        let payload = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let (echoed, length, downloaded) = try await simulation.run { () async throws -> ([UInt8], String?, [UInt8]) in
            let echo = try await client.post("http://10.0.0.2/echo", body: payload)
            let stream = try await client.stream(HTTPClientRequest(url: "http://10.0.0.2/download"))
            var downloaded: [UInt8] = []
            for try await piece in stream.body { downloaded += piece }
            return (echo.body, echo.headers["x-length"], downloaded)
        }
        #expect(echoed == payload)
        #expect(length == "300000")
        #expect(downloaded == (0..<64).flatMap { [UInt8](repeating: UInt8($0), count: 16 * 1024) })
        client.shutdown()
        _ = try await simulation.run { await upstream.server.shutdown(gracePeriod: .seconds(1)) }
    }

    @Test func aServerThatShutsDownGracefullyLetsTheRequestInFlightFinish() async throws {
        let simulation = try Simulation(seed: 5)
        simulation.network.latency = .milliseconds(1)
        let upstream = try await Upstream(simulation)
        let client = Self.client(simulation)
        let first = try await simulation.run { () async throws -> (String, HTTPServer.ShutdownReport) in
            async let answer = client.get("http://10.0.0.2/slow")
            try await simulation.loop.sleep(for: .milliseconds(100))
            let report = await upstream.server.shutdown(gracePeriod: .seconds(5))
            return (try await answer.text, report)
        }
        #expect(first.0 == "slow")
        #expect(first.1.finished == 1 && first.1.aborted == 0)
        client.shutdown()
    }
}
