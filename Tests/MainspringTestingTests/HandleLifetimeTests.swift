import Mainspring
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The library's one rule for dropping a handle, type by type: dropping the last handle ends
/// nothing that can still run (a timer, a watch, a listener or connection with a handler, a
/// child process); what nothing can reach any more — a connection with no handler, a listener
/// made for `connections` — closes as `close()` closes it. In virtual time, exactly.
/// (`DatagramSocket`'s case is in `DatagramSimulationTests`, `HTTPServer`'s in `HTTPCloseTests`,
/// `Watcher`'s in `FailureTests`, `WebSocket`'s in `WebSocketTests`, sequences' in each source's
/// tests.)
@Suite struct HandleLifetimeTests {
    /// What a callback recorded, on the simulation's driving thread.
    final class Record: @unchecked Sendable {
        var events: [String] = []
    }

    private func describe(_ event: LineEvent) -> String {
        switch event {
        case .line(let text): "line \(text)"
        case .endOfFile: "end"
        default: "\(event)"
        }
    }

    @Test func aDroppedConnectionWithoutAHandlerSendsWhatItQueuedThenCloses() throws {
        let simulation = try Simulation(seed: 41)
        simulation.network.latency = .milliseconds(1)
        let loop = simulation.loop
        let server = Record()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 7), on: loop) { connection in
            connection.readLines { event in server.events.append(self.describe(event)) }
        }
        do {
            let client = try Connection.startConnecting(to: "127.0.0.1", port: 7, on: loop)
            client.writeLine("last words")
        }  // no handler holds it: nothing could use it any more
        simulation.advance(by: .seconds(1))
        #expect(server.events == ["line last words", "end"])
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 1, "the server's side is open until it closes")
    }

    @Test func aDroppedConnectionWithAHandlerLivesOn() throws {
        let simulation = try Simulation(seed: 42)
        simulation.network.latency = .milliseconds(1)
        let loop = simulation.loop
        let client = Record()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 7), on: loop) { connection in
            connection.readLines { event in
                if case .line(let text) = event { connection.writeLine(text.uppercased()) } else { connection.close() }
            }
        }
        do {
            let connection = try Connection.startConnecting(to: "127.0.0.1", port: 7, on: loop)
            connection.readLines { event in client.events.append(self.describe(event)) }
            connection.writeLine("hello")
        }  // the handler holds it
        simulation.advance(by: .seconds(1))
        #expect(client.events == ["line HELLO"], "still open, still read")
        #expect(simulation.network.openStreamEnds == 2)
        listener.close()
    }

    @Test func aDroppedListenerMadeForConnectionsClosesOneWithAHandlerDoesNot() async throws {
        let simulation = try Simulation(seed: 43)
        simulation.network.latency = .milliseconds(1)
        let loop = simulation.loop
        let outcomes = try await simulation.run { () async -> [String] in
            do {
                _ = try await Listener(.tcp(host: "0.0.0.0", port: 81), on: loop)  // for `connections`: nobody will take them
                _ = try Listener(.tcp(host: "0.0.0.0", port: 82), on: loop) { connection in connection.writeLine("hi") }
            } catch {
                return ["listen failed: \(error)"]
            }
            try? await loop.sleep(for: .milliseconds(1))
            var outcomes: [String] = []
            for port: UInt16 in [81, 82] {
                do {
                    let connection = try await Connection.connect(to: "127.0.0.1", port: port, on: loop)
                    let line = try? await connection.readLine()
                    outcomes.append("\(port): \(line.flatMap { $0 }.map(describe) ?? "nil")")
                    connection.close()
                } catch {
                    outcomes.append("\(port): \(error)")
                }
            }
            return outcomes
        }
        #expect(outcomes == [
            "81: \(EventLoopError.system(function: "connect 127.0.0.1:81", errno: ECONNREFUSED))",
            "82: line hi",
        ])
    }

    @Test func aDroppedTimerHandleStillFires() throws {
        let simulation = try Simulation(seed: 44)
        let loop = simulation.loop
        let fired = Record()
        do {
            _ = loop.schedule(after: .seconds(2)) { fired.events.append("at \(simulation.now)") }
        }
        simulation.advance(by: .seconds(5))
        #expect(fired.events == ["at 2.0 seconds"])
    }

    @Test func aDroppedChildProcessHandleLetsTheChildRunToItsEnd() async throws {
        let simulation = try Simulation(seed: 45)
        simulation.register(program: "worker") { process in
            try await process.sleep(for: .seconds(3))
            process.write(line: "done")
            return 0
        }
        let loop = simulation.loop
        try await simulation.run { () async throws in
            _ = try await Subprocess.launch(.init(executable: "worker"), on: loop)
            try await loop.sleep(for: .seconds(10))
        }
        #expect(simulation.processes.first?.output == ["done"])
        #expect(simulation.processes.first?.exitedAt == .seconds(3))
    }
}
