import ExampleServices
import Foundation
import KVService
import Mainspring
import MainspringTestSupport
import MainspringTesting
import Testing

/// mainspring-kv's server (`KVServer`, the very code the executable runs) on the simulation's
/// network: RESP split into one-byte segments, a reset in the middle of a sliced reply, the
/// output soft limit counted in virtual seconds, and the random fault schedule over a few seeds.
@Suite struct KVSimulationTests {
    static func server(on simulation: Simulation, loops: Int, host: String) throws -> KVServer {
        let group = try simulation.makeGroup(loopCount: loops, host: host)
        var options = KVServerOptions()
        options.host = "0.0.0.0"
        options.port = 6379
        return try KVServer(group: group, options: options)
    }

    /// Every byte its own segment: commands split anywhere (inside a length, between `\r` and
    /// `\n`, inside a two-byte character) are parsed whole, by a client on the keyspace's loop
    /// and by one on the other loop (whose batches are posted to the keyspace's), replies in
    /// order.
    @Test func itAnswersRESPSentOneByteAtATime() async throws {
        let simulation = try Simulation(seed: 21)
        simulation.network.latency = .milliseconds(1)
        simulation.network.maxSegmentSize = 1
        let server = try Self.server(on: simulation, loops: 2, host: "10.0.0.2")
        let loop = simulation.loop
        let transcripts = try await simulation.run { () async throws -> [[String]] in
            var transcripts: [[String]] = []
            for client in 0..<2 {
                let connection = try await Connection.connect(to: "10.0.0.2", port: 6379, on: loop)
                try await connection.send(FaultSoak.resp(["SET", "k\(client)", "hé \(client)"]) + FaultSoak.resp(["GET", "k\(client)"])
                                          + "PING\r\n" + FaultSoak.resp(["INCRBY", "n", "5"]))
                var lines: [String] = []
                while lines.count < 5, case .line(let text)? = try await connection.readLine() { lines.append(text) }
                transcripts.append(lines)
                connection.close()
            }
            return transcripts
        }
        #expect(transcripts == [["+OK", "$5", "hé 0", "+PONG", ":5"], ["+OK", "$5", "hé 1", "+PONG", ":10"]])
        simulation.advance(by: .seconds(1))
        #expect(server.counters.accepted.load(ordering: .relaxed) == 2)
        #expect(server.counters.connected.load(ordering: .relaxed) == 0)
        server.close()
        simulation.advance(by: .seconds(3))
        #expect(simulation.network.openStreamEnds == 0, "no stream leaked")
        let dispatched = simulation.trace.count
        simulation.advance(by: .seconds(10))
        #expect(simulation.trace.count == dispatched,
                "nothing runs once the server is closed (its timers on both loops stopped): \(simulation.trace.suffix(3))")
    }

    /// Key expiry reads the loop's calendar: in a simulation, virtual time. A key set with
    /// `PX 1500` is there 1,499 ms later and gone at 1,500 ms — exactly, whatever the real time.
    @Test func keysExpireOnVirtualTime() async throws {
        let simulation = try Simulation(seed: 24)
        simulation.network.latency = .milliseconds(1)
        let server = try Self.server(on: simulation, loops: 1, host: "10.0.0.2")
        let loop = simulation.loop
        let connection = try await simulation.run { () async throws -> Connection in
            let connection = try await Connection.connect(to: "10.0.0.2", port: 6379, on: loop)
            try await connection.send(FaultSoak.resp(["SET", "k", "v", "PX", "1500"]))
            _ = try await connection.readLine()  // +OK, set at 3 ms (connect 2 ms, the command 1 ms)
            return connection
        }
        func get(at instant: Duration) async throws -> [String] {
            simulation.advance(by: instant - simulation.now - .milliseconds(1))  // it arrives 1 ms after it is sent
            return try await simulation.run { () async throws -> [String] in
                try await connection.send(FaultSoak.resp(["PTTL", "k"]) + FaultSoak.resp(["GET", "k"]))
                var lines: [String] = []
                while lines.count < 3, lines.last != "$-1", case .line(let text)? = try await connection.readLine() {
                    lines.append(text)
                }
                return lines
            }
        }
        #expect(try await get(at: .milliseconds(1_502)) == [":1", "$1", "v"])
        #expect(try await get(at: .milliseconds(1_503)) == [":-2", "$-1"])
        connection.close()
        server.close()
        simulation.advance(by: .seconds(3))
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A reset while a sliced reply (`KEYS *` over 20,000 keys, held back by a 4 KiB window) is
    /// on its way: the client's read fails with ECONNRESET, the server drops the rest of the reply
    /// (its feeder job ends, nothing is left in flight), and a new client is served.
    @Test func aResetMidReplyLeavesTheServerServing() async throws {
        let simulation = try Simulation(seed: 22)
        simulation.network.window = 4_096
        let server = try Self.server(on: simulation, loops: 1, host: "10.0.0.3")
        let loop = simulation.loop
        let network = simulation.network
        let (firstBytes, outcome, info) = try await simulation.run { () async throws -> (Int, String, String) in
            let setup = try await Connection.connect(to: "10.0.0.3", port: 6379, on: loop)
            try await setup.send(FaultSoak.resp(["DEBUG", "POPULATE", "20000"]))
            #expect(try await setup.readLine() == .line("+OK"))
            setup.close()

            let reader = try await Connection.connect(to: "10.0.0.3", port: 6379, on: loop)
            try await reader.send(FaultSoak.resp(["KEYS", "*"]))
            let first = try await reader.read(upTo: 1_024) ?? []
            network.reset("127.0.0.1", "10.0.0.3")
            var outcome = "no error"
            do {
                while try await reader.read(upTo: 65_536) != nil {}
            } catch {
                outcome = "\(error)"
            }
            let again = try await Connection.connect(to: "10.0.0.3", port: 6379, on: loop)
            try await again.send(FaultSoak.resp(["INFO", "mainspring"]))
            var info = ""
            while case .line(let text)? = try await again.readLine() {
                info += text + "\n"
                if text.hasPrefix("loop0_longest_callback_ms") { break }
            }
            again.close()
            return (first.count, outcome, info)
        }
        #expect(firstBytes > 0, "part of the reply had arrived")
        #expect(outcome == "error 104 (Connection reset by peer)")
        #expect(info.contains("sliced_replies_in_flight:0"), "\(info)")
        simulation.advance(by: .seconds(1))
        #expect(server.counters.slicedCommands.load(ordering: .relaxed) == 1)
        #expect(server.counters.connected.load(ordering: .relaxed) == 0)
        server.close()
        simulation.advance(by: .seconds(3))
        #expect(network.openStreamEnds == 0, "no stream leaked")
    }

    /// `client-output-buffer-limit normal 0 1024 2`: a client over the soft limit is closed when
    /// it has been over it for 2 s — counted on the loop's clock, so exactly, in virtual time. The
    /// client reads nothing; a 4 KiB window holds the replies in the server's output.
    @Test func theSoftOutputLimitCountsVirtualSeconds() async throws {
        let simulation = try Simulation(seed: 23)
        simulation.network.window = 4_096
        let server = try Self.server(on: simulation, loops: 1, host: "10.0.0.4")
        let loop = simulation.loop
        let (closedAfter, reason) = try await simulation.run { () async throws -> (Duration, String) in
            let admin = try await Connection.connect(to: "10.0.0.4", port: 6379, on: loop)
            try await admin.send(FaultSoak.resp(["CONFIG", "SET", "client-output-buffer-limit", "normal 0 1024 2"]))
            #expect(try await admin.readLine() == .line("+OK"))
            try await admin.send(FaultSoak.resp(["SET", "big", String(repeating: "x", count: 20_000)]))
            #expect(try await admin.readLine() == .line("+OK"))

            let slow = try await Connection.connect(to: "10.0.0.4", port: 6379, on: loop)
            let start = simulation.now
            // Over the soft limit from the first reply on; a reply 1.5 s later is still within
            // the 2 s, one at 2.5 s is past them and closes the client.
            for second in [0.0, 1.5, 2.5] {
                try await loop.sleep(for: .seconds(second) - (simulation.now - start))
                try await slow.send(FaultSoak.resp(["GET", "big"]))
            }
            // The client reads nothing, so it would not see the end: watch the server's counter,
            // a millisecond at a time.
            let counters = server.counters
            while counters.outputLimitDisconnections.load(ordering: .relaxed) == 0 && simulation.now - start < .seconds(10) {
                try await loop.sleep(for: .milliseconds(1))
            }
            slow.close()
            admin.close()
            return (simulation.now - start, "\(counters.outputLimitDisconnections.load(ordering: .relaxed)) disconnections")
        }
        #expect(server.counters.outputLimitDisconnections.load(ordering: .relaxed) == 1)
        // No latency: the third GET reaches the server at 2.5 s and the client is closed then;
        // the watch sees it at its next millisecond.
        #expect(closedAfter == .milliseconds(2_501), "\(closedAfter), \(reason)")
        server.close()
        simulation.advance(by: .seconds(3))
        #expect(simulation.network.openStreamEnds == 0, "no stream leaked")
    }

    /// The KV server under random resets and partitions, a few seeds in the suite (the benchmark
    /// runs a thousand): every reply right, in order, exactly once; nothing leaked.
    @Test(arguments: [1, 2] as [UInt64]) func itSurvivesRandomFaults(seed: UInt64) async throws {
        let (result, again) = try await onPlainThread {
            (try FaultSoak.runKVService(seed: seed, clients: 50), try FaultSoak.runKVService(seed: seed, clients: 50))
        }
        #expect(result.failures.isEmpty, "\(result.failures)")
        #expect(result.lost == 0 && result.duplicated == 0 && result.reordered == 0)
        #expect(result.leakedSources == 0)
        #expect(result.requests > 1_000, "\(result.requests) requests")
        #expect(result.faults.values.reduce(0, +) > 0, "faults were injected: \(result.faults)")
        #expect(result.requests == again.requests && result.faults == again.faults, "the seed replays the run")
    }
}
