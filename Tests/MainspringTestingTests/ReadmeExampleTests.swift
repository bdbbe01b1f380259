import Foundation
import Mainspring
import MainspringTesting
import Testing

/// The README's "Testing your code" example, with a `Session` for it to test.
@Suite struct ReadmeExampleTests {
    /// A session that closes itself after `idleTimeout` (a loop timer: virtual in a simulation).
    final class Session: @unchecked Sendable {
        private(set) var isOpen = true

        init(loop: EventLoop, idleTimeout: Duration) {
            loop.schedule(after: idleTimeout) { [weak self] in self?.isOpen = false }
        }
    }

    @Test func theSessionTimesOutAfterThirtySeconds() async throws {
        let simulation = try Simulation(seed: 7)
        let loop = simulation.loop
        let timedOut = try await simulation.run { () async throws -> Bool in
            let session = Session(loop: loop, idleTimeout: .seconds(30))   // your type, on loop.clock
            try await loop.sleep(for: .seconds(29))
            let early = session.isOpen
            try await loop.sleep(for: .seconds(1))
            return early && !session.isOpen
        }
        #expect(timedOut)                     // in microseconds of real time, the same on every run
        #expect(simulation.now == .seconds(30))
    }

    /// The README's network example, word for word.
    @Test func aRefusedPortFailsAfterOneRoundTrip() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(5)
        let loop = simulation.loop
        let failure = try await simulation.run { () async -> EventLoopError? in
            do throws(EventLoopError) {
                _ = try await Connection.connect(to: "127.0.0.1", port: 9, on: loop)
                return nil
            } catch {
                return error
            }
        }
        #expect(failure == .system(function: "connect 127.0.0.1:9", errno: ECONNREFUSED))
        #expect(simulation.now == .milliseconds(10))   // there and back
    }
}
