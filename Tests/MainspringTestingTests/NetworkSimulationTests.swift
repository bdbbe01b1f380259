import Foundation
import Mainspring
import MainspringTesting
import Testing

/// The simulation's network: the library's own `Listener` and `Connection` over in-memory
/// streams on virtual time, each fault exactly. No descriptor, no real time.
@Suite struct NetworkSimulationTests {
    /// A line echo server on `loop`: every connection it accepts echoes lines until the end.
    private func startEcho(on loop: EventLoop, port: UInt16 = 7) throws -> Listener {
        try Listener(.tcp(host: "0.0.0.0", port: port), on: loop) { connection in
            connection.readLines { event in
                switch event {
                case .line(let text): connection.writeLine(text)
                default: connection.close()
                }
            }
        }
    }

    /// Connect (a SYN and its answer: two latencies), a line out and its echo back (two more):
    /// the reply arrives at exactly four latencies.
    @Test func anEchoTakesExactlyItsRoundTrips() async throws {
        let simulation = try Simulation(seed: 1)
        simulation.network.latency = .milliseconds(10)
        let loop = simulation.loop
        let listener = try startEcho(on: loop)
        let (reply, connectedAt, repliedAt) = try await simulation.run { () async throws -> (LineEvent?, Duration, Duration) in
            let connection = try await Connection.connect(to: "127.0.0.1", port: 7, on: loop)
            let connectedAt = simulation.now
            try await connection.send(line: "hello")
            let reply = try await connection.readLine()
            let repliedAt = simulation.now
            connection.close()
            return (reply, connectedAt, repliedAt)
        }
        #expect(reply == .line("hello"))
        #expect(connectedAt == .milliseconds(20))
        #expect(repliedAt == .milliseconds(40))
        listener.close()
        simulation.advance(by: .seconds(1))
        #expect(simulation.network.openStreamEnds == 0, "every stream closed at both ends")
    }

    /// The plainest echo, as over loopback: a client sends a line, reads the echo with
    /// `readLine()` and closes — all it was sent was read, so the server reads the end of the
    /// stream and its connection ends `.closed`, not reset (the line just read used to count as
    /// unread input at the close).
    @Test func aCloseAfterReadLineIsAnEndNotAReset() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(1)
        let loop = simulation.loop
        let ended = ReasonBox()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 7), on: loop) { connection in
            connection.onClose { reason in ended.reason = reason }
            connection.readLines { event in
                if case .line(let text) = event { connection.writeLine(text) }
                if event == .endOfFile { connection.close() }
            }
        }
        let reply = try await simulation.run { () async throws -> LineEvent? in
            let connection = try await Connection.connect(to: "127.0.0.1", port: 7, on: loop)
            try await connection.send(line: "hello")
            let reply = try await connection.readLine()
            connection.close()
            return reply
        }
        simulation.advance(by: .seconds(1))
        #expect(reply == .line("hello"))
        #expect(ended.reason == .closed, "the server's connection ended \(String(describing: ended.reason))")
        listener.close()
        simulation.advance(by: .seconds(1))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// With segments of one byte, the reader sees the line one byte per delivery, and the
    /// splitter still gives the whole line.
    /// A peer that closed (its end on the wire) and then receives data answers with a reset,
    /// which arrives after the end, as over TCP: the reader sees the end of the stream at the
    /// end's instant. (The reset used to replace the end in flight and arrive in its place.)
    @Test func whatAClosedPeerSentArrivesBeforeTheResetItsLateInputEarns() async throws {
        let simulation = try Simulation(seed: 40)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverLoop = server.loops[0]
        // Accepted at 5 ms, closed at 12 ms (nothing unread: an end, arriving at 17 ms).
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 7000), on: serverLoop) { connection in
            serverLoop.schedule(after: .milliseconds(7)) { connection.close() }
        }
        let loop = simulation.loop
        let (event, at) = try await simulation.run { () async throws -> (String, Duration) in
            let client = try await Connection.connect(to: "10.0.0.2", port: 7000, on: loop)  // at 10 ms
            // Reaches the closed end at 15 ms: a reset comes back, arriving at 20 ms.
            client.writeLine("late")
            let event = try await client.readLine()
            client.close()
            return (event.map { "\($0)" } ?? "nil", simulation.now)
        }
        #expect(event == "endOfFile")
        #expect(at == .milliseconds(17))
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// The reset a closed peer sends is not held back behind what waits for a reader that does
    /// not read: a client that uploads without reading, to a server that answered and closed,
    /// learns of the reset at its arrival. (It waited behind the answer for ever.)
    @Test func aResetReachesAWriterThatDoesNotRead() async throws {
        let simulation = try Simulation(seed: 41)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        // Accepted at 5 ms: an answer and the end, arriving at 10 ms, which the client never reads.
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 7001), on: server.loops[0]) { connection in
            connection.writeLine("bye")
            connection.close()
        }
        let loop = simulation.loop
        let (reason, at) = try await simulation.run { () async throws -> (String, Duration) in
            let client = try await Connection.connect(to: "10.0.0.2", port: 7001, on: loop)  // at 10 ms
            // Reaches the closed end at 15 ms: a reset comes back, arriving at 20 ms.
            client.write([UInt8](repeating: 0x61, count: 1 << 20))
            let reason = await client.closed
            return ("\(reason)", simulation.now)
        }
        #expect(reason == "error 104 (Connection reset by peer)")
        #expect(at == .milliseconds(20))
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    @Test func oneByteSegmentsReachTheReaderOneAtATime() throws {
        let simulation = try Simulation(seed: 2)
        simulation.network.maxSegmentSize = 1
        let loop = simulation.loop
        let (writer, reader) = try Connection.makePair(on: loop)
        var chunks: [[UInt8]] = []
        reader.readBytes { input in
            if case .bytes(let bytes) = input { chunks.append(bytes) }
        }
        writer.write(Array("PING\r\n".utf8))
        simulation.runUntilIdle()
        #expect(chunks == "PING\r\n".utf8.map { [$0] })
        writer.close()
        reader.close()
        simulation.runUntilIdle()
    }

    @Test func aPortNobodyListensOnIsRefusedAfterARoundTrip() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(5)
        let loop = simulation.loop
        let outcome = try await simulation.run { () async -> (EventLoopError?, Duration) in
            do throws(EventLoopError) {
                _ = try await Connection.connect(to: "127.0.0.1", port: 9, on: loop)
                return (nil, simulation.now)
            } catch {
                return (error, simulation.now)
            }
        }
        guard case .system(_, let code)? = outcome.0 else {
            Issue.record("expected a refused connect, got \(String(describing: outcome.0))")
            return
        }
        #expect(code == ECONNREFUSED)
        #expect(outcome.1 == .milliseconds(10))
    }

    /// An address no host has answers nothing: the connect fails with ETIMEDOUT after the
    /// network's connect timeout — two minutes of virtual time, no real time.
    @Test func anAddressNobodyHasTimesOut() async throws {
        let simulation = try Simulation(seed: 4)
        let loop = simulation.loop
        let outcome = try await simulation.run { () async -> (EventLoopError?, Duration) in
            do throws(EventLoopError) {
                _ = try await Connection.connect(to: "10.9.9.9", port: 80, on: loop)
                return (nil, simulation.now)
            } catch {
                return (error, simulation.now)
            }
        }
        guard case .system(_, let code)? = outcome.0 else {
            Issue.record("expected a timed-out connect, got \(String(describing: outcome.0))")
            return
        }
        #expect(code == ETIMEDOUT)
        #expect(outcome.1 == .seconds(127))
    }

    /// Names resolve through the simulation's table; a name nobody registered is not found.
    @Test func namesResolveThroughTheSimulationsTable() async throws {
        let simulation = try Simulation(seed: 5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        simulation.network.register(name: "echo.test", address: "10.0.0.2")
        let listener = try startEcho(on: server.loops[0], port: 7000)
        let loop = simulation.loop
        let (reply, missing) = try await simulation.run { () async throws -> (LineEvent?, EventLoopError?) in
            let connection = try await Connection.connect(to: "echo.test", port: 7000, on: loop)
            #expect(connection.remoteAddress == "echo.test:7000")
            try await connection.send(line: "by name")
            let reply = try await connection.readLine()
            connection.close()
            do throws(EventLoopError) {
                _ = try await Connection.connect(to: "nobody.test", port: 7000, on: loop)
                return (reply, nil)
            } catch {
                return (reply, error)
            }
        }
        #expect(reply == .line("by name"))
        guard case .hostNotFound(let host, _)? = missing else {
            Issue.record("expected hostNotFound, got \(String(describing: missing))")
            return
        }
        #expect(host == "nobody.test")
        listener.close()
    }
}

/// A close reason set on the simulation's thread and read after it has run.
private final class ReasonBox: @unchecked Sendable {
    var reason: Connection.CloseReason?
}
