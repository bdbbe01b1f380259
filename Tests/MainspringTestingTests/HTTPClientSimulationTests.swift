import Mainspring
import MainspringHTTP
import MainspringTesting
import Testing

/// `HTTPClient` against upstreams on the simulation's network: its timeouts and its recovery
/// after a partition, to the instant, in no real time. These two tests are the DocC article
/// "Testing with virtual time"'s, word for word.
@Suite struct HTTPClientSimulationTests {
    @Test func anUpstreamThatNeverAnswersFailsAfterTheClientsResponseTimeout() async throws {
        let simulation = try Simulation(seed: 1)
        simulation.network.latency = .milliseconds(1)
        let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        simulation.network.register(name: "upstream.test", address: "10.0.0.2")
        // Reads every request, answers nothing.
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: upstream.loops[0]) { connection in
            connection.readLines { event in
                if case .line = event { return }
                connection.close()
            }
        }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(responseTimeout: .seconds(2)))

        let failure = try await simulation.run { () async -> HTTPClientError? in
            do throws(HTTPClientError) {
                _ = try await client.get("http://upstream.test/slow")
                return nil
            } catch {
                return error
            }
        }
        #expect(failure == .responseTimeout(.seconds(2)))
        // Connected after one round trip (2 ms), the request sent then, no answer for 2 s.
        #expect(simulation.now == .milliseconds(2) + .seconds(2))
        client.shutdown()
        listener.close()
    }

    @Test func aPartitionHealsAndTheClientRecovers() async throws {
        let simulation = try Simulation(seed: 2)
        simulation.network.latency = .milliseconds(1)
        let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        simulation.network.register(name: "upstream.test", address: "10.0.0.2")
        // Answers each request's head with 200.
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: upstream.loops[0]) { connection in
            connection.readLines { event in
                guard case .line(let line) = event else { return connection.close() }
                if line.isEmpty { connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") }
            }
        }
        let client = HTTPClient(loop: simulation.loop, configuration: .init(responseTimeout: .seconds(1)))
        let network = simulation.network

        let outcomes = try await simulation.run { () async -> [String] in
            var outcomes: [String] = []
            func fetch() async {
                do throws(HTTPClientError) {
                    let response = try await client.get("http://upstream.test/")
                    outcomes.append("\(response.status) at \(simulation.now)")
                } catch {
                    outcomes.append("\(error) at \(simulation.now)")
                }
            }
            await fetch()
            network.partition("127.0.0.1", "10.0.0.2")
            await fetch()
            network.heal("127.0.0.1", "10.0.0.2")
            await fetch()
            return outcomes
        }
        #expect(outcomes == [
            "200 at 0.004 seconds",
            "no response within 1.0 seconds at 1.004 seconds",
            "200 at 1.008 seconds",
        ])
        client.shutdown()
        listener.close()
    }
}
