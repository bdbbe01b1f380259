import Mainspring
import MainspringTestSupport
import MainspringTesting
import Testing

/// What one side of a scenario saw, in order.
final class Transcript: Sendable {
    private let lines = Locked<[String]>([])
    func add(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
}

/// Where a parity scenario runs: real loops over loopback (real sockets), or a `Simulation`.
struct ParityWorld: Sendable {
    /// The loop the client side runs on.
    let clientLoop: EventLoop
    /// What the client connects to, the server's port, and a port where a connect is refused.
    let serverHost: String
    let port: UInt16
    let refusedPort: UInt16
    /// Runs `body` on the client loop's thread (a loop-thread-only call), and returns its result.
    let onClientLoop: @Sendable (_ body: @escaping @Sendable () throws -> Void) async throws -> Void
}

/// A scenario written once and run twice — on real loops and in a simulation — whose
/// transcripts (what each side read, in order, and how each connection ended) must be equal.
struct ParityScenario: Sendable, CustomStringConvertible {
    let name: String
    /// The server's side, for each connection its listener accepts (on the server's loop).
    let server: @Sendable (Connection, Transcript) -> Void
    /// The client's side; returns when it is done.
    let client: @Sendable (ParityWorld, Transcript) async throws -> Void
    /// Whether the server's transcript is complete.
    let serverDone: @Sendable ([String]) -> Bool
    var description: String { name }

    /// Records a connection's end on `transcript`.
    static func recordingClose(_ connection: Connection, _ transcript: Transcript) {
        connection.onClose { reason in transcript.add("closed: \(reason)") }
    }

    /// Reads `connection`'s lines into `transcript`: each line (then `onLine`), the end of its
    /// input (then `atEnd`), and any other event.
    static func readingLines(_ connection: Connection, _ transcript: Transcript,
                             onLine: @escaping (String) -> Void = { _ in }, atEnd: @escaping () -> Void = {})
    {
        connection.readLines { event in
            switch event {
            case .line(let text):
                transcript.add("line \(text)")
                onLine(text)
            case .endOfFile:
                transcript.add("end of input")
                atEnd()
            default: transcript.add("\(event)")
            }
        }
    }

    static let all: [ParityScenario] = [
        ParityScenario(name: "echo: a line, its echo read with readLine(), then close", server: { connection, transcript in
            recordingClose(connection, transcript)
            readingLines(connection, transcript, onLine: { connection.writeLine($0) }, atEnd: { connection.close() })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "hello")
            transcript.add("read \(String(describing: try await connection.readLine()))")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }),

        ParityScenario(name: "a send after shutdownOutput(): refused (EPIPE), never seen by the peer", server: { connection, transcript in
            readingLines(connection, transcript, atEnd: { connection.writeLine("got your end") })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "first")
            connection.shutdownOutput()
            // The server's answer to the end: the write side is shut by now.
            transcript.add("read \(String(describing: try await connection.readLine()))")
            try? await connection.send(line: "late")
            do {
                transcript.add("read \(String(describing: try await connection.readLine()))")
            } catch {
                transcript.add("read threw \(error)")
            }
            connection.close()
        }, serverDone: { $0.contains("end of input") }),

        ParityScenario(name: "half-close: the client's end arrives after its line; the server answers and closes", server: { connection, transcript in
            recordingClose(connection, transcript)
            readingLines(connection, transcript, atEnd: {
                connection.writeLine("bye")
                connection.close()
            })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "last words")
            connection.shutdownOutput()
            while let event = try await connection.readLine() { transcript.add("read \(event)") }
            transcript.add("read the end")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }),

        ParityScenario(name: "bytes and lines: read(exactly:), read(until:) and readLine() over one stream", server: { connection, _ in
            connection.write(Array("0123456789abc\r\nline two\npartial".utf8))
            connection.close()
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            transcript.add("exactly \(String(decoding: try await connection.read(exactly: 4) ?? [], as: UTF8.self))")
            transcript.add("until \(String(describing: try await connection.read(until: [0x0D, 0x0A], limit: 64)))")
            transcript.add("line \(String(describing: try await connection.readLine()))")
            transcript.add("line \(String(describing: try await connection.readLine()))")
            transcript.add("line \(String(describing: try await connection.readLine()))")
            connection.close()
        }, serverDone: { _ in true }),

        ParityScenario(name: "startConnecting to a port nobody listens on: closed with ECONNREFUSED", server: { _, _ in
        }, client: { world, transcript in
            let ended = AsyncStream<Void>.makeStream()
            try await world.onClientLoop {
                let connection = try Connection.startConnecting(to: world.serverHost, port: world.refusedPort, on: world.clientLoop)
                connection.onClose { reason in
                    transcript.add("closed: \(reason)")
                    ended.continuation.finish()
                }
            }
            for await _ in ended.stream {}
        }, serverDone: { _ in true }),
    ]
}

/// The parity suite: each scenario on real loops over loopback and in a simulation, their
/// transcripts compared.
@Suite(.serialized) struct ParityTests {
    static func real(_ scenario: ParityScenario) async throws -> (client: [String], server: [String]) {
        let group = try EventLoopGroup(loopCount: 2)
        let serverLoop = group.loops[0]
        let server = Transcript()
        let client = Transcript()
        let refusing = try RefusingPort()
        let listener = try await serverLoop.submit {
            try Listener(.tcp(host: "127.0.0.1", port: 0), on: serverLoop) { connection in scenario.server(connection, server) }
        }
        let clientLoop = group.loops[1]
        let world = ParityWorld(clientLoop: clientLoop, serverHost: "127.0.0.1", port: listener.port,
                                refusedPort: refusing.port,
                                onClientLoop: { body in try await clientLoop.submit { try body() } })
        try await scenario.client(world, client)
        let deadline = ContinuousClock.now + .seconds(10)
        while !scenario.serverDone(server.all) && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(2)) }
        listener.close()
        await group.shutdown(gracePeriod: .seconds(2))
        withExtendedLifetime(refusing) {}
        return (client.all, server.all)
    }

    static func simulated(_ scenario: ParityScenario) async throws -> (client: [String], server: [String]) {
        let simulation = try Simulation(seed: 77)
        simulation.network.latency = .milliseconds(1)
        let serverGroup = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverLoop = serverGroup.loops[0]
        let server = Transcript()
        let client = Transcript()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 7000), on: serverLoop) { connection in scenario.server(connection, server) }
        let world = ParityWorld(clientLoop: simulation.loop, serverHost: "10.0.0.2", port: 7000, refusedPort: 7999,
                                onClientLoop: { body in try body() })
        try await simulation.run { try await scenario.client(world, client) }
        simulation.advance(by: .seconds(10))
        #expect(scenario.serverDone(server.all), "the simulated server's side did not finish: \(server.all)")
        listener.close()
        simulation.advance(by: .seconds(1))
        return (client.all, server.all)
    }

    @Test(arguments: ParityScenario.all)
    func realAndSimulatedAgree(_ scenario: ParityScenario) async throws {
        let real = try await Self.real(scenario)
        let simulated = try await Self.simulated(scenario)
        #expect(simulated.client == real.client, "client side")
        #expect(simulated.server == real.server, "server side")
    }
}
