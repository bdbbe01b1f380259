import ExampleServices
import Foundation
import Mainspring
import MainspringTestSupport
import MainspringTesting
import Testing

/// The examples' services on the simulation's network: a client that sends one byte at a time,
/// a reset mid-reply, an idle client, a member that stops reading — each exactly, on virtual
/// time, with the services' real code.
@Suite struct ExampleSimulationTests {
    /// The line service on a simulated host, its requests split into one-byte segments: every
    /// reply is right, `SLEEP` answers exactly its time later, and an idle connection is closed
    /// exactly at its idle timeout.
    @Test func theLineServiceAnswersOneByteAtATimeAndTimesOutIdleClients() async throws {
        let simulation = try Simulation(seed: 11)
        simulation.network.latency = .milliseconds(1)
        simulation.network.maxSegmentSize = 1
        let server = try simulation.makeGroup(loopCount: 2, host: "10.0.0.1")
        simulation.network.register(name: "lines.test", address: "10.0.0.1")
        let service = try LineService(group: server, host: "0.0.0.0", port: 7000,
                                      options: .init(idleTimeout: .seconds(30)))
        let loop = simulation.loop
        let (replies, times, idleEnd) = try await simulation.run {
            () async throws -> ([LineEvent?], [Duration], (LineEvent?, Duration)) in
            let connection = try await Connection.connect(to: "lines.test", port: 7000, on: loop)
            var replies: [LineEvent?] = []
            var times: [Duration] = []
            for request in ["ECHO héllo wörld", "SLEEP 250", "NOSUCH", "ECHO again"] {
                let sent = simulation.now
                try await connection.send(line: request)
                replies.append(try await connection.readLine())
                times.append(simulation.now - sent)
            }
            // Silent from now on: the server closes the connection after its idle timeout (30 s
            // after the last request reached it), and the end reaches us one latency later.
            let lastArrival = simulation.now - .milliseconds(1)
            let end = try await connection.readLine()
            connection.close()
            return (replies, times, (end, simulation.now - lastArrival))
        }
        #expect(replies[0] == .line("héllo wörld"), "split inside its two-byte characters, whole again")
        #expect(replies[1] == .line("SLEPT 250"))
        guard case .line(let error)? = replies[2] else { throw TestFailure("no reply to NOSUCH") }
        #expect(error.hasPrefix("ERR unknown command 'NOSUCH'"))
        #expect(replies[3] == .line("again"))
        // Every byte its own segment, each delivered on its own (the loops run between two),
        // all one latency on their way: a request and its reply take exactly two latencies,
        // and SLEEP 250 exactly 250 ms more.
        #expect(times == [.milliseconds(2), .milliseconds(252), .milliseconds(2), .milliseconds(2)])
        #expect(idleEnd.0 == .endOfFile, "the end of the input")
        #expect(idleEnd.1 == .seconds(30) + .milliseconds(1))
        let stats = service.currentStats
        #expect(stats.requests == 4)
        #expect(stats.open == 0, "the idle connection was closed")
        _ = service.shutdown(gracePeriod: .seconds(1))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A reset mid-reply: the client's connection fails with ECONNRESET, the server's reply
    /// meets a reset stream, the service goes on (its counters say so) and nothing leaks.
    @Test func theLineServiceSurvivesAResetMidReply() async throws {
        let simulation = try Simulation(seed: 12)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        let service = try LineService(group: server, host: "0.0.0.0", port: 7000)
        let loop = simulation.loop
        let network = simulation.network
        let (outcome, afterwards) = try await simulation.run { () async throws -> (String, LineEvent?) in
            let connection = try await Connection.connect(to: "10.0.0.1", port: 7000, on: loop)
            try await connection.send(line: "SLEEP 1000")
            loop.execute(after: .milliseconds(500)) { network.reset("127.0.0.1", "10.0.0.1") }
            var outcome = ""
            do {
                outcome = "read \(String(describing: try await connection.readLine()))"
            } catch {
                outcome = "\(error) at \(simulation.now)"
            }
            // The service still serves a new client.
            let again = try await Connection.connect(to: "10.0.0.1", port: 7000, on: loop)
            try await again.send(line: "ECHO still here")
            let reply = try await again.readLine()
            again.close()
            return (outcome, reply)
        }
        #expect(outcome == "error 104 (Connection reset by peer) at 0.5 seconds")
        #expect(afterwards == .line("still here"))
        simulation.advance(by: .seconds(2))  // the first SLEEP's reply meets the reset stream
        #expect(service.currentStats.accepted == 2)
        #expect(service.currentStats.open == 0)
        _ = service.shutdown(gracePeriod: .seconds(1))
        #expect(network.openStreamEnds == 0, "no stream leaked")
    }

    /// The chat room: a member that stops reading fills its window and its output limit; the
    /// sender waits for it for the grace period — exactly 2 s of virtual time — and then the
    /// member is disconnected, while the member that reads gets every message, in order.
    @Test func aChatMemberThatStopsReadingIsDroppedAfterItsGrace() async throws {
        // On a thread of its own: a simulation driven synchronously must not hold one of the
        // cooperative pool's threads (two on two cores) that the other tests' tasks need.
        let seen = try await onPlainThread { () throws -> ChatObservations in
            let simulation = try Simulation(seed: 13)
            simulation.network.window = 4_096
            let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.5")
            let room = ChatRoom(policy: .disconnect, grace: .seconds(2))
            let listener = try Listener(.tcp(host: "0.0.0.0", port: 6667), on: server.loops[0],
                                        options: .init(outputLimit: 4_096)) { connection in
                Task(executorPreference: connection.loop) { await room.serve(connection) }
            }
            let loop = simulation.loop
            let reader = try Connection.startConnecting(to: "10.0.0.5", port: 6667, on: loop)
            var seen = ChatObservations()
            reader.readLines { event in
                if case .line(let text) = event { seen.received.append(text) }
            }
            let slow = try Connection.startConnecting(to: "10.0.0.5", port: 6667, on: loop)  // it reads nothing
            let sender = try Connection.startConnecting(to: "10.0.0.5", port: 6667, on: loop)
            simulation.runUntilIdle()
            seen.membersAtStart = room.statistics.members

            seen.messages = (0..<200).map { "message \($0) " + String(repeating: "x", count: 80) }
            for message in seen.messages { sender.writeLine(message) }
            simulation.advance(by: .seconds(2) - .milliseconds(1))
            seen.disconnectedWithinGrace = room.statistics.disconnected
            simulation.advance(by: .milliseconds(1))
            seen.disconnectedAtGrace = room.statistics.disconnected
            simulation.advance(by: .seconds(1))
            seen.membersAfter = room.statistics.members
            // What the slow member would find if it read now.
            slow.readLines { seen.late.append($0) }
            simulation.advance(by: .seconds(1))
            for connection in [reader, sender, slow] { connection.close() }
            listener.close()
            simulation.advance(by: .seconds(1))
            seen.openStreamEnds = simulation.network.openStreamEnds
            return seen
        }
        #expect(seen.membersAtStart == 3)
        #expect(seen.disconnectedWithinGrace == 0, "still within its grace")
        #expect(seen.disconnectedAtGrace == 1, "dropped exactly when its grace ran out")
        #expect(seen.received == seen.messages, "the reading member got every message, in order")
        #expect(seen.membersAfter == 2)
        // The slow member's messages that fitted before it was cut off (its window and its
        // output limit), in order, then the end.
        #expect(seen.late.last == .endOfFile)
        let lines = seen.late.dropLast().map { event -> String in if case .line(let text) = event { text } else { "?" } }
        #expect(!lines.isEmpty && lines == Array(seen.messages.prefix(lines.count)))
        #expect(seen.openStreamEnds == 0)
    }

    struct ChatObservations: Sendable {
        var received: [String] = []
        var messages: [String] = []
        var late: [LineEvent] = []
        var membersAtStart = 0
        var disconnectedWithinGrace = -1
        var disconnectedAtGrace = -1
        var membersAfter = 0
        var openStreamEnds = -1
    }

    /// The line service under random resets and partitions, a few seeds in the suite (the
    /// benchmark runs a thousand): no reply lost, duplicated or out of order, no stream left
    /// open — and a seed replays exactly.
    @Test(arguments: [1, 2, 3] as [UInt64]) func theLineServiceSurvivesRandomFaults(seed: UInt64) async throws {
        let (result, again) = try await onPlainThread {
            (try FaultSoak.runLineService(seed: seed, clients: 20, duration: .seconds(20)),
             try FaultSoak.runLineService(seed: seed, clients: 20, duration: .seconds(20)))
        }
        #expect(result.failures.isEmpty, "\(result.failures)")
        #expect(result.lost == 0 && result.duplicated == 0 && result.reordered == 0)
        #expect(result.leakedSources == 0)
        #expect(result.requests > 100, "\(result.requests) requests")
        #expect(result.replies + result.cutByReset == result.requests)
        #expect(result.faults.values.reduce(0, +) > 0, "faults were injected: \(result.faults)")
        #expect(again.requests == result.requests && again.faults == result.faults && again.replies == result.replies,
                "the same seed replays the same run")
    }
}
