import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// What a request ended with — its status and body text, or its error — and when, on the
/// simulation's clock (the deadline and retry tests').
func requestOutcome(_ client: HTTPClient, _ request: HTTPClientRequest, _ simulation: Simulation) async -> (String, Duration) {
    do throws(HTTPClientError) {
        let response = try await client.execute(request)
        return ("\(response.status) \(response.text)", simulation.now)
    } catch {
        return ("\(error)", simulation.now)
    }
}

/// One deadline per request (`HTTPClient.Configuration.requestTimeout`, a request's own
/// `timeout` or `deadline`): it covers the wait for a pooled connection, resolving, connecting,
/// sending and the whole response, and its error names where the request was — each to the
/// instant, in virtual time.
@Suite struct HTTPClientDeadlineTests {
    /// An upstream on 10.0.0.2:80 that reads requests and answers each after `delay` (never, if nil).
    static func slowUpstream(_ simulation: Simulation, answerAfter delay: Duration?) throws -> Listener {
        let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        return try Listener(.tcp(host: "0.0.0.0", port: 80), on: upstream.loops[0]) { connection in
            connection.readLines { event in
                guard case .line("") = event, let delay else { return }
                _ = connection.loop.schedule(after: delay) { connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") }
            }
        }
    }

    /// The user's case: 10 requests at once to an upstream that takes 5 s, 8 connections, a 2 s
    /// request timeout. Before, 8 failed at 2 s and the other 2 — who waited 2 s for a connection
    /// first — at 4 s. Now all 10 fail at 2 s: 8 waiting for the response, 2 for a connection.
    @Test func theDeadlineCoversTheWaitForAPooledConnection() async throws {
        let simulation = try Simulation(seed: 1)
        simulation.network.latency = .milliseconds(1)
        let listener = try Self.slowUpstream(simulation, answerAfter: .seconds(5))
        let client = HTTPClient(loop: simulation.loop, configuration: .init(requestTimeout: .seconds(2)))
        let outcomes = try await simulation.run { () async -> [(String, Duration)] in
            await withTaskGroup(of: (String, Duration).self) { group in
                for _ in 0..<10 {
                    group.addTask { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation) }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
        }
        let waiting = HTTPClientError.requestTimeout(.seconds(2), phase: .waitingForConnection)
        let answering = HTTPClientError.requestTimeout(.seconds(2), phase: .awaitingResponse)
        #expect(outcomes.filter { $0.0 == "\(answering)" }.count == 8)
        #expect(outcomes.filter { $0.0 == "\(waiting)" }.count == 2)
        #expect(outcomes.allSatisfy { $0.1 == .seconds(2) }, "\(outcomes)")
        #expect("\(waiting)" == "the request's 2.0 seconds ran out while waiting for a connection of the pool")
        client.shutdown()
        listener.close()
    }

    /// A partition before the first connect: the 10 s connect timeout no longer outlasts a 2 s
    /// request — it fails at 2 s, connecting.
    @Test func theDeadlineCutsAConnectShort() async throws {
        let simulation = try Simulation(seed: 2)
        simulation.network.latency = .milliseconds(1)
        let listener = try Self.slowUpstream(simulation, answerAfter: .zero)
        simulation.network.partition("127.0.0.1", "10.0.0.2")  // the simulation's own loop is 127.0.0.1
        let client = HTTPClient(loop: simulation.loop, configuration: .init(requestTimeout: .seconds(2)))
        let (failure, at) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation) }
        #expect(failure == "\(HTTPClientError.requestTimeout(.seconds(2), phase: .connecting))")
        #expect(at == .seconds(2))
        // A connect timeout shorter than what is left of the request still has its own error.
        let short = HTTPClient(loop: simulation.loop, configuration: .init(requestTimeout: .seconds(2), connectTimeout: .milliseconds(500)))
        let (own, ownAt) = try await simulation.run { await requestOutcome(short, HTTPClientRequest(url: "http://10.0.0.2/"), simulation) }
        #expect(own == "\(HTTPClientError.connectTimeout(host: "10.0.0.2", port: 80, .milliseconds(500)))")
        #expect(ownAt == .seconds(2) + .milliseconds(500))
        client.shutdown()
        short.shutdown()
        listener.close()
    }

    /// A resolver of the user's own that never answers: the deadline ends it, resolving.
    @Test func theDeadlineCoversTheResolver() async throws {
        let simulation = try Simulation(seed: 3)
        let loop = simulation.loop
        var configuration = HTTPClient.Configuration(requestTimeout: .milliseconds(750))
        configuration.resolver = HTTPClient.Resolver { _ throws(HTTPClientError) in
            try? await loop.sleep(for: .seconds(3_600))
            return "10.0.0.2"
        }
        let client = HTTPClient(loop: loop, configuration: configuration)
        let (failure, at) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://registry.test/"), simulation) }
        #expect(failure == "\(HTTPClientError.requestTimeout(.milliseconds(750), phase: .resolving))")
        #expect(at == .milliseconds(750))
        client.shutdown()
    }

    /// A request's own timeout wins over the client's, and an absolute deadline over both; the
    /// deadline holds across a streamed body whose consumer is slow.
    @Test func aRequestsOwnTimeoutAndDeadline() async throws {
        let simulation = try Simulation(seed: 4)
        simulation.network.latency = .milliseconds(1)
        let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: upstream.loops[0]) { connection in
            connection.readLines { event in
                guard case .line("") = event else { return }
                connection.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
                _ = connection.loop.schedule(after: .milliseconds(100)) { connection.write("6\r\nsecond\r\n0\r\n\r\n") }
            }
        }
        let loop = simulation.loop
        let client = HTTPClient(loop: loop, configuration: .init(requestTimeout: .seconds(60)))
        // Its own 300 ms: the head comes at 4 ms, the consumer dawdles 500 ms, the next read is late.
        let (pieces, failure, at) = try await simulation.run { () async throws -> ([String], String, Duration) in
            let response = try await client.stream(HTTPClientRequest(url: "http://10.0.0.2/", timeout: .milliseconds(300)))
            var pieces: [String] = []
            do {
                for try await piece in response.body {
                    pieces.append(String(decoding: piece, as: UTF8.self))
                    try await loop.sleep(for: .milliseconds(500))
                }
            } catch {
                return (pieces, "\(error)", simulation.now)
            }
            return (pieces, "ended", simulation.now)
        }
        #expect(pieces == ["first"])
        #expect(failure == "\(HTTPClientError.requestTimeout(.milliseconds(300), phase: .readingBody))")
        #expect(at == .milliseconds(504))
        // An absolute deadline 3 ms from now, and a timeout of 1 s that it wins over: the
        // request is sent (a round trip to connect) and its head is 2 ms away when it passes.
        let (deadlineFailure, deadlineAt) = try await simulation.run { () async -> (String, Duration) in
            let start = simulation.now
            let request = HTTPClientRequest(url: "http://10.0.0.2/", timeout: .seconds(1),
                                            deadline: loop.clock.now.advanced(by: .milliseconds(3)))
            let (failure, at) = await requestOutcome(client, request, simulation)
            return (failure, at - start)
        }
        #expect(deadlineFailure == "\(HTTPClientError.requestTimeout(.milliseconds(3), phase: .awaitingResponse))")
        #expect(deadlineAt == .milliseconds(3))
        client.shutdown()
        listener.close()
    }

    /// A body the upstream never reads (its window full) holds the request to its deadline:
    /// the request is queued whole at once, so it fails waiting for the response, at the
    /// deadline — not at the 30 s response timeout.
    @Test func theDeadlineCoversSending() async throws {
        let simulation = try Simulation(seed: 5)
        simulation.network.latency = .milliseconds(1)
        let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let held = Locked<[Connection]>([])
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: upstream.loops[0]) { connection in
            held.withLock { $0.append(connection) }  // kept open, never read
        }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(requestTimeout: .seconds(1)))
        let body = [UInt8](repeating: 0x61, count: 4 << 20)
        let (failure, at) = try await simulation.run {
            await requestOutcome(client, HTTPClientRequest(method: .post, url: "http://10.0.0.2/", body: body), simulation)
        }
        #expect(failure == "\(HTTPClientError.requestTimeout(.seconds(1), phase: .awaitingResponse))")
        #expect(at == .seconds(1))
        client.shutdown()
        listener.close()
    }
}
