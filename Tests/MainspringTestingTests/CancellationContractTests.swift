import Mainspring
import MainspringTesting
import Testing

/// The library's one cancellation rule for calls that start something and wait for it
/// (a connect, a name lookup): cancelling the waiting task ends the wait at once with
/// `EventLoopError.cancelled` and undoes what was started. In virtual time, to the instant.
@Suite struct CancellationContractTests {
    /// A connect whose answer would take 20 s (10 s each way) is cancelled at 1 s: the task has
    /// `.cancelled` at exactly 1 s, and the half-made stream is closed at both ends.
    @Test func cancellingAConnectEndsItAtOnceAndClosesTheSocket() async throws {
        let simulation = try Simulation(seed: 21)
        simulation.network.latency = .seconds(10)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.9")
        let accepted = Counter()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: server.loops[0]) { connection in
            accepted.count += 1
            connection.readLines { event in
                if case .line = event { return }
                connection.close()  // the client's end: it went away before it was connected
            }
        }
        let loop = simulation.loop
        let (outcome, endedAt) = try await simulation.run { () async throws -> (String, Duration) in
            let attempt = Task(executorPreference: loop) { () async -> String in
                do throws(EventLoopError) {
                    _ = try await Connection.connect(to: "10.0.0.9", port: 80, on: loop)
                    return "connected"
                } catch {
                    return "\(error)"
                }
            }
            try await loop.sleep(for: .seconds(1))
            attempt.cancel()
            let outcome = await attempt.value
            return (outcome, simulation.now)
        }
        #expect(outcome == EventLoopError.cancelled.description)
        #expect(endedAt == .seconds(1))
        simulation.advance(by: .seconds(60))
        // The SYN had left: the server accepted at 10 s, and its side ends when the answer
        // meets the client's closed end.
        #expect(accepted.count == 1)
        #expect(simulation.network.openStreamEnds == 0, "the cancelled connect left no stream open")
        listener.close()
        simulation.runUntilIdle()
    }

    /// A task cancelled before it calls `connect` or `resolve` gets `.cancelled` without
    /// waiting: nothing is started that it would then have to undo, in no virtual time.
    @Test func aCancelledTaskDoesNotStartAConnectOrALookup() async throws {
        let simulation = try Simulation(seed: 22)
        simulation.network.register(name: "db.internal", address: "10.0.0.7")
        let loop = simulation.loop
        let outcomes = try await simulation.run { () async -> [String] in
            let task = Task(executorPreference: loop) { () async -> [String] in
                withUnsafeCurrentTask { $0?.cancel() }
                var outcomes: [String] = []
                do throws(EventLoopError) {
                    _ = try await Connection.connect(to: "10.0.0.7", port: 5432, on: loop)
                    outcomes.append("connected")
                } catch {
                    outcomes.append("\(error)")
                }
                do throws(EventLoopError) {
                    outcomes.append("\(try await loop.resolve("db.internal"))")
                } catch {
                    outcomes.append("\(error)")
                }
                return outcomes
            }
            return await task.value
        }
        #expect(outcomes == [EventLoopError.cancelled.description, EventLoopError.cancelled.description])
        #expect(simulation.now == .zero)
        #expect(simulation.network.openStreamEnds == 0)
    }
}

/// A count kept by callbacks that all run on the simulation's driving thread.
private final class Counter: @unchecked Sendable {
    var count = 0
}
