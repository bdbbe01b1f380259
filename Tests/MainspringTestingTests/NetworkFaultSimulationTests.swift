import Foundation
import Mainspring
import MainspringTesting
import Testing

/// The simulation's network under faults and limits: partitions, resets, a reader that stops,
/// idle timeouts, closes with unread input, junk bytes, seeded replays, Unix paths (the basic
/// exchanges are NetworkSimulationTests.swift).
@Suite struct NetworkFaultSimulationTests {
    /// A partition holds the bytes — neither delivered nor failed — and healing delivers them
    /// one latency later, in order.
    @Test func aPartitionHoldsBytesUntilItHeals() throws {
        let simulation = try Simulation(seed: 6)
        simulation.network.latency = .milliseconds(1)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let received = Recorder<String>()
        let arrivals = Recorder<Duration>()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: server.loops[0]) { connection in
            connection.readLines { event in
                if case .line(let text) = event {
                    received.append(text)
                    arrivals.append(simulation.now)
                }
            }
        }
        let connection = try Connection.startConnecting(to: "10.0.0.2", port: 80, on: simulation.loop)
        simulation.advance(by: .milliseconds(2))
        connection.writeLine("before")
        simulation.advance(by: .milliseconds(5))
        #expect(received.items == ["before"])

        simulation.network.partition("127.0.0.1", "10.0.0.2")
        connection.writeLine("during 1")
        connection.writeLine("during 2")
        simulation.advance(by: .seconds(30))
        #expect(received.items == ["before"], "held, not delivered")
        #expect(connection.isOpen, "held, not failed")

        let healedAt = simulation.now
        simulation.network.heal("127.0.0.1", "10.0.0.2")
        simulation.advance(by: .milliseconds(10))
        #expect(received.items == ["before", "during 1", "during 2"])
        #expect(arrivals.items.dropFirst() == [healedAt + .milliseconds(1), healedAt + .milliseconds(1)])
        #expect(simulation.network.faults["partition"] == 1)
        connection.close()
        listener.close()
        simulation.advance(by: .seconds(1))
    }

    /// A reset between two hosts closes both ends with ECONNRESET.
    @Test func aResetFailsBothEnds() throws {
        let simulation = try Simulation(seed: 7)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.3")
        let serverReason = Recorder<Connection.CloseReason>()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: server.loops[0]) { connection in
            connection.readLines { _ in }
            connection.onClose { serverReason.append($0) }
        }
        var clientReason: Connection.CloseReason?
        let client = try Connection.startConnecting(to: "10.0.0.3", port: 80, on: simulation.loop)
        client.readLines { _ in }
        client.onClose { clientReason = $0 }
        simulation.runUntilIdle()
        #expect(client.isOpen)
        #expect(simulation.network.openStreamEnds == 2)
        simulation.network.reset("127.0.0.1", "10.0.0.3")
        simulation.runUntilIdle()
        #expect(clientReason == .error(ECONNRESET))
        #expect(serverReason.items == [.error(ECONNRESET)])
        #expect(simulation.network.faults["reset"] == 1, "one stream")
        #expect(simulation.network.openStreamEnds == 0)
        listener.close()
    }

    /// A reset that meets a connect on its way (the server has the stream, the answer is still
    /// travelling) fails the connect with ECONNRESET when the answer would have arrived — it
    /// does not leave a connection that never connects (the fault soak found that one).
    @Test func aResetWhileConnectingFailsTheConnect() async throws {
        let simulation = try Simulation(seed: 14)
        simulation.network.latency = .milliseconds(10)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.6")
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: server.loops[0]) { connection in
            connection.readLines { _ in }
        }
        let loop = simulation.loop
        let network = simulation.network
        let outcome = try await simulation.run { () async -> String in
            loop.execute(after: .milliseconds(15)) { network.reset("127.0.0.1", "10.0.0.6") }
            do throws(EventLoopError) {
                _ = try await Connection.connect(to: "10.0.0.6", port: 80, on: loop)
                return "connected"
            } catch {
                return "\(error) at \(simulation.now)"
            }
        }
        #expect(outcome == "connect 10.0.0.6:80 failed: Connection reset by peer (errno 104) at 0.02 seconds")
        #expect(network.openStreamEnds == 0)
        listener.close()
    }

    /// A reader that stops reading: the link fills to its window, then the writer's output
    /// stays in its buffer — real backpressure — until the reader reads again.
    @Test func aReaderThatStopsReadingPushesBackOnTheWriter() throws {
        let simulation = try Simulation(seed: 8)
        simulation.network.window = 4_096
        let options = Connection.Options(outputLimit: 65_536)
        let (writer, reader) = try Connection.makePair(on: simulation.loop, options: options)
        var got = 0
        let total = 400 * 1_024
        writer.write([UInt8](repeating: 0x61, count: total))
        simulation.runUntilIdle()
        // No reader: its connection does not read; the link holds one window (what the two
        // kernels' buffers would), and the rest stays with the writer.
        #expect(writer.bufferedOutputBytes == total - 4_096)
        #expect(!writer.isWritable, "over its output limit: backpressure")
        reader.readBytes { input in
            if case .bytes(let bytes) = input { got += bytes.count }
        }
        simulation.runUntilIdle()
        #expect(got == total)
        #expect(writer.bufferedOutputBytes == 0)
        #expect(writer.isWritable)
        writer.close()
        reader.close()
        simulation.runUntilIdle()
    }

    /// `Connection.Options.idleTimeout` runs on virtual time: the connection closes with
    /// `.idleTimeout` exactly that long after its last input.
    @Test func anIdleTimeoutFiresOnVirtualTime() throws {
        let simulation = try Simulation(seed: 9)
        let options = Connection.Options(idleTimeout: .seconds(5))
        let (quiet, peer) = try Connection.makePair(on: simulation.loop, options: options)
        var closedAt: (Connection.CloseReason, Duration)?
        quiet.readLines { _ in }
        quiet.onClose { closedAt = ($0, simulation.now) }
        simulation.advance(by: .seconds(3))
        peer.writeLine("still here")  // input at 3 s: the idle period starts again
        simulation.advance(by: .seconds(7))
        #expect(closedAt?.0 == .idleTimeout)
        #expect(closedAt?.1 == .seconds(8))
        peer.close()
        simulation.runUntilIdle()
    }

    /// Closing after the output: the peer reads everything, then the end; closing with input
    /// left unread resets the stream, as TCP does.
    @Test func aCloseSendsTheOutputThenTheEndAndUnreadInputResets() throws {
        let simulation = try Simulation(seed: 10)
        simulation.network.latency = .milliseconds(1)
        let (one, other) = try Connection.makePair(on: simulation.loop)
        var events: [LineEvent] = []
        other.readLines { events.append($0) }
        one.writeLine("last words")
        one.close()
        simulation.advance(by: .milliseconds(5))
        #expect(events == [.line("last words"), .endOfFile])

        let (talker, deaf) = try Connection.makePair(on: simulation.loop)
        var talkerReason: Connection.CloseReason?
        talker.readLines { _ in }
        talker.onClose { talkerReason = $0 }
        talker.writeLine("nobody reads this")
        simulation.advance(by: .milliseconds(5))
        deaf.close()  // its input was never read
        simulation.advance(by: .milliseconds(5))
        #expect(talkerReason == .error(ECONNRESET))
        other.close()
        simulation.advance(by: .milliseconds(5))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// Junk — random bytes slipped between segments of a stream split one byte at a time —
    /// reaches the line parser as clear events (lines, invalid UTF-8, over-long lines), never an
    /// error or a crash; every line the junk did not touch arrives whole and in order (a run of
    /// junk touches at most one line), and the connection stays open.
    @Test(arguments: [21, 22, 23] as [UInt64]) func junkReachesTheLineParserAsClearEvents(seed: UInt64) throws {
        let simulation = try Simulation(seed: seed)
        simulation.network.maxSegmentSize = 1
        let loop = simulation.loop
        let (writer, reader) = try Connection.makePair(on: loop, options: .init(maxLineLength: 40))
        var events: [LineEvent] = []
        reader.readLines { events.append($0) }
        writer.readBytes { _ in }  // junk the other way is read and dropped
        simulation.network.injectFaults(junkPerMinute: 60, between: ["127.0.0.1"], for: .seconds(60))
        var sent: [String] = []
        let ticks = loop.schedule(every: .milliseconds(100)) { _ in
            sent.append("line \(sent.count)")
            writer.writeLine(sent.last!)
        }
        simulation.advance(by: .seconds(60))
        ticks.cancel()
        simulation.advance(by: .seconds(1))
        let junk = simulation.network.faults["junk"] ?? 0
        #expect(junk > 20, "\(junk) runs of junk")
        for event in events {
            switch event {
            case .line, .invalidUTF8, .tooLong: continue
            default: Issue.record("seed \(seed): unexpected \(event)")
            }
        }
        let indices = Dictionary(uniqueKeysWithValues: sent.enumerated().map { ($1, $0) })
        let intact = events.compactMap { event -> Int? in if case .line(let text) = event { indices[text] } else { nil } }
        #expect(intact == intact.sorted(), "in order")
        #expect(intact.count >= sent.count - junk, "seed \(seed): \(sent.count) sent, \(intact.count) whole, \(junk) junk")
        #expect(writer.isOpen && reader.isOpen)
        writer.close()
        reader.close()
        simulation.runUntilIdle()
    }

    /// The same seed and program give the same trace, across hosts and links.
    @Test func theSameSeedReplaysTheSameTrace() throws {
        func traceOfRun(seed: UInt64) throws -> [SimulationTrace.Entry] {
            let simulation = try Simulation(seed: seed)
            simulation.network.latency = .microseconds(300)
            simulation.network.maxSegmentSize = 3
            let server = try simulation.makeGroup(loopCount: 2, host: "10.0.0.4")
            let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: server.loops[0], group: server) { connection in
                connection.readLines { event in
                    if case .line(let text) = event { connection.writeLine(text.uppercased()) } else { connection.close() }
                }
            }
            for index in 0..<4 {
                let connection = try Connection.startConnecting(to: "10.0.0.4", port: 80, on: simulation.loop)
                connection.readLines { _ in }
                connection.writeLine("client \(index)")
                connection.shutdownOutput()
            }
            simulation.advance(by: .seconds(1))
            listener.close()
            return simulation.trace
        }
        let first = try traceOfRun(seed: 42)
        #expect(first.count > 20)
        #expect(try traceOfRun(seed: 42) == first)
    }

    /// Unix stream sockets on a simulated host: a path (or an abstract `@name`) per host, no
    /// file; a connect finishes at once, as a Unix connect does; nobody at the path is ENOENT,
    /// a path in use is refused, and a closed listener frees its path.
    @Test func unixPathsAreTheHostsOwn() async throws {
        let simulation = try Simulation(seed: 31)
        simulation.network.latency = .milliseconds(3)
        let loop = simulation.loop
        var listeners: [Listener] = []
        for path in ["/run/app.sock", "@app"] {
            listeners.append(try Listener(.unix(path: path), on: loop) { connection in
                connection.readLines { event in
                    if case .line(let text) = event { connection.writeLine("\(path): \(text)") } else { connection.close() }
                }
            })
        }
        #expect(listeners.map(\.localAddress) == ["/run/app.sock", "@app"])
        #expect {
            _ = try Listener(.unix(path: "/run/app.sock"), on: loop) { _ in }
        } throws: { error in
            guard case EventLoopError.unixSocketPathInUse(let path, _) = error else { return false }
            return path == "/run/app.sock"
        }
        #expect(throws: EventLoopError.system(function: "connect /run/other.sock", errno: ENOENT)) {
            _ = try Connection.connect(unixPath: "/run/other.sock", on: loop)
        }
        // Another host has its own paths.
        let other = try simulation.makeGroup(loopCount: 1, host: "10.0.0.9").loops[0]
        #expect(throws: EventLoopError.system(function: "connect /run/app.sock", errno: ENOENT)) {
            _ = try Connection.connect(unixPath: "/run/app.sock", on: other)
        }
        let (replies, at) = try await simulation.run { () async throws -> ([LineEvent?], Duration) in
            var replies: [LineEvent?] = []
            for path in ["/run/app.sock", "@app"] {
                let connection = try await Connection.connect(unixPath: path, on: loop)
                try await connection.send(line: "hi")
                replies.append(try await connection.readLine())
                connection.close()
            }
            return (replies, simulation.now)
        }
        #expect(replies == [.line("/run/app.sock: hi"), .line("@app: hi")])
        #expect(at == .milliseconds(12), "no connect round trip: one latency there and one back, twice")
        for listener in listeners { listener.close() }
        simulation.advance(by: .seconds(1))
        #expect(throws: EventLoopError.system(function: "connect /run/app.sock", errno: ENOENT)) {
            _ = try Connection.connect(unixPath: "/run/app.sock", on: loop)
        }
        #expect(simulation.network.openStreamEnds == 0)
    }
}

/// Values recorded by handlers that must be `@Sendable` (a listener's): the simulation runs
/// them on the thread that drives it, one at a time.
final class Recorder<Value>: @unchecked Sendable {
    private(set) var items: [Value] = []
    func append(_ value: Value) { items.append(value) }
}
