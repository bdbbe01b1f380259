import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// `HTTPClient.RetryPolicy` and `RetryBudget`, on virtual time: when a request is tried again,
/// how long it waits, and how many retries a client makes in all.
@Suite struct HTTPClientRetryTests {
    /// An upstream on 10.0.0.2:80 that answers the n-th request (from 1) with `answer(n)`, and
    /// counts them.
    final class Upstream: Sendable {
        let requests = Locked(0)
        let listener: Listener

        init(_ simulation: Simulation, answer: @escaping @Sendable (Int) -> String) throws {
            let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
            let requests = self.requests
            listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: group.loops[0]) { connection in
                connection.readLines { event in
                    guard case .line("") = event else { return }
                    let number = requests.withLock { count in
                        count += 1
                        return count
                    }
                    connection.write(answer(number))
                }
            }
        }

        static func response(_ status: Int, _ extra: String = "", body: String = "") -> String {
            "HTTP/1.1 \(status) X\r\n\(extra)Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
        }
    }

    /// Exact backoff (no jitter): 100 ms, then 200 ms.
    static let exact = HTTPClient.RetryPolicy(maxRetries: 3, initialBackoff: .milliseconds(100), jitter: 0)

    /// A refused connect never left: retried after 100 ms, then 200 ms, until the upstream
    /// listens — even for a POST.
    @Test func aRefusedConnectIsTriedAgainWithBackoff() async throws {
        let simulation = try Simulation(seed: 1)
        simulation.network.latency = .milliseconds(1)
        let upstreamGroup = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let client = HTTPClient(loop: simulation.loop, configuration: .init(retryPolicy: Self.exact))
        let held = Locked<Listener?>(nil)
        // The upstream starts listening at 250 ms.
        _ = upstreamGroup.loops[0].execute(after: .milliseconds(250)) {
            held.withLock {
                $0 = try? Listener(.tcp(host: "0.0.0.0", port: 80), on: upstreamGroup.loops[0]) { connection in
                    connection.readLines { event in
                        if case .line("") = event { connection.write(Upstream.response(200, body: "up")) }
                    }
                }
            }
        }
        let (result, at) = try await simulation.run {
            await requestOutcome(client, HTTPClientRequest(method: .post, url: "http://10.0.0.2/", body: [1]), simulation)
        }
        #expect(result == "200 up")
        // Refused at 2 ms (a round trip), again at 104 ms; the third connect, at 304 ms, is
        // accepted a round trip later, and the answer comes a round trip after that.
        #expect(at == .milliseconds(308))
        client.shutdown()
        held.withLock { $0?.close() }
    }

    /// A 503 with `Retry-After: 1` waits a second (more than the backoff), then succeeds.
    @Test func retryAfterIsHonoured() async throws {
        let simulation = try Simulation(seed: 2)
        simulation.network.latency = .milliseconds(1)
        let upstream = try Upstream(simulation) { n in
            n == 1 ? Upstream.response(503, "Retry-After: 1\r\n", body: "busy") : Upstream.response(200, body: "fine")
        }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(retryPolicy: Self.exact))
        let (result, at) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation) }
        #expect(result == "200 fine")
        // The 503 at 4 ms; one second; the retry reuses the connection: a round trip.
        #expect(at == .milliseconds(1_006))
        #expect(upstream.requests.value == 2)
        client.shutdown()
        upstream.listener.close()
    }

    /// A `Retry-After` past the request's deadline is not waited for: the 503 is the answer, at once.
    @Test func aRetryAfterPastTheDeadlineReturnsTheResponse() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(1)
        let upstream = try Upstream(simulation) { _ in Upstream.response(503, "Retry-After: 10\r\n", body: "later") }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(requestTimeout: .seconds(2), retryPolicy: Self.exact))
        let (result, at) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation) }
        #expect(result == "503 later")
        #expect(at == .milliseconds(4))
        #expect(upstream.requests.value == 1)
        client.shutdown()
        upstream.listener.close()
    }

    /// A POST that may have reached the server (its response timed out) is not tried again; a
    /// GET is, and so is a POST when the policy says so.
    @Test func onlyIdempotentRequestsAreRetriedOnceSent() async throws {
        let simulation = try Simulation(seed: 4)
        simulation.network.latency = .milliseconds(1)
        // Silent the first time; answers afterwards.
        let upstream = try Upstream(simulation) { n in n == 1 ? "" : Upstream.response(200, body: "late") }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(responseTimeout: .milliseconds(500), retryPolicy: Self.exact))
        let (post, _) = try await simulation.run {
            await requestOutcome(client, HTTPClientRequest(method: .post, url: "http://10.0.0.2/", body: [1]), simulation)
        }
        #expect(post == "\(HTTPClientError.responseTimeout(.milliseconds(500)))")
        #expect(upstream.requests.value == 1)
        let (get, _) = try await simulation.run { await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation) }
        #expect(get == "200 late")
        var policy = Self.exact
        policy.retriesNonIdempotentRequests = true
        let allowing = policy
        upstream.requests.withLock { $0 = 0 }
        let (allowed, _) = try await simulation.run {
            await requestOutcome(client, HTTPClientRequest(method: .post, url: "http://10.0.0.2/", body: [1], retryPolicy: allowing), simulation)
        }
        #expect(allowed == "200 late")
        #expect(upstream.requests.value == 2)
        client.shutdown()
        upstream.listener.close()
    }

    /// An upstream that fails everything: with a budget of 10% and no reserve, 105 requests
    /// make 10 retries, not the 315 their policy would allow. (105, not 100: what the 100th
    /// earned has faded a hair below one retry by then; the 101st makes up for it.)
    @Test func theBudgetCapsRetries() async throws {
        let simulation = try Simulation(seed: 5)
        simulation.network.latency = .milliseconds(1)
        let upstream = try Upstream(simulation) { _ in Upstream.response(503, body: "down") }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(
            retryPolicy: Self.exact, retryBudget: .init(ratio: 0.1, minimumPerSecond: 0, window: .seconds(3_600))))
        let statuses = try await simulation.run { () async -> [String] in
            var statuses: [String] = []
            for _ in 0..<105 { statuses.append(await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation).0) }
            return statuses
        }
        #expect(statuses.allSatisfy { $0 == "503 down" })
        #expect(statuses.count == 105)
        #expect(upstream.requests.value == 115)
        client.shutdown()
        upstream.listener.close()
    }

    /// Full jitter draws from the simulation's seed: one seed, one set of waits — each within
    /// its backoff — and another seed, others.
    @Test func jitterReplaysFromTheSeed() async throws {
        func finishTimes(seed: UInt64) async throws -> [Duration] {
            let simulation = try Simulation(seed: seed)
            simulation.network.latency = .milliseconds(1)
            let upstream = try Upstream(simulation) { n in n % 3 == 0 ? Upstream.response(200) : Upstream.response(502) }
            let policy = HTTPClient.RetryPolicy(maxRetries: 2, initialBackoff: .milliseconds(100))
            let client = HTTPClient(loop: simulation.loop, configuration: .init(retryPolicy: policy))
            let times = try await simulation.run { () async -> [Duration] in
                var times: [Duration] = []
                for _ in 0..<5 {
                    let start = simulation.now
                    _ = await requestOutcome(client, HTTPClientRequest(url: "http://10.0.0.2/"), simulation)
                    times.append(simulation.now - start)
                }
                return times
            }
            client.shutdown()
            upstream.listener.close()
            return times
        }
        let first = try await finishTimes(seed: 7)
        #expect(try await finishTimes(seed: 7) == first)
        #expect(try await finishTimes(seed: 8) != first)
        // Three attempts, each a round trip (2 ms; the first 4 ms with its connect), and two
        // waits of at most 100 and 200 ms.
        #expect(first.allSatisfy { $0 >= .milliseconds(6) && $0 <= .milliseconds(308) }, "\(first)")
    }
}
