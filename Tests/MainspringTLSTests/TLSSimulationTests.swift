import Mainspring
import MainspringHTTP
import MainspringTLS
import MainspringTestSupport
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A host (10.0.0.2) whose port 443 accepts and never answers a handshake: a plain listener
/// that holds its connections and reads nothing. 5 ms latency.
private struct SilentServer {
    let simulation: Simulation
    private let listener: Listener
    private let held = Box<[Connection]>([])

    init(seed: UInt64) throws {
        simulation = try Simulation(seed: seed)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let held = self.held
        listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0]) { held.value.append($0) }
    }

    func close() {
        for connection in held.value { connection.abort() }
        listener.close()
    }
}

/// Values the tests' handlers write on the simulation's driving thread and the test reads
/// between steps.
private final class Box<Value>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}

/// TLS over a simulation's network: real OpenSSL sessions over simulated bytes, on virtual time
/// — handshakes, certificate checks, timeouts, resets and the end of a peer, exactly.
@Suite("TLS over the simulated network (MainspringTesting)",
       .enabled(if: TestCertificates.shared != nil, "the openssl command is not installed (Debian: apt-get install openssl)"))
struct TLSSimulationTests {
    private static func serverContext() throws -> TLSServerContext {
        let certs = try #require(TestCertificates.shared)
        return try TLSServerContext(configuration: .init(certificateFile: certs.serverCertificate, keyFile: certs.serverKey))
    }

    private static func clientContext(trusting ca: String? = nil, handshakeTimeout: Duration = .seconds(10)) throws
        -> TLSClientContext
    {
        let certs = try #require(TestCertificates.shared)
        return try TLSClientContext(configuration: .init(trustRoots: .file(ca ?? certs.caCertificate),
                                                         handshakeTimeout: handshakeTimeout))
    }

    /// An echo over TLS between two simulated hosts, the bytes cut into 7-byte segments: the
    /// handshake (TLS 1.3: one round trip after the TCP connect's) and the echo take exactly
    /// their latencies, and the certificate was checked against the name.
    @Test func anEchoOverTLSTakesItsRoundTripsExactly() async throws {
        let simulation = try Simulation(seed: 31)
        simulation.network.latency = .milliseconds(5)
        simulation.network.maxSegmentSize = 7
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverContext = try Self.serverContext()
        let served = Box<[Connection]>([])
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0], tls: serverContext) { connection in
            served.value.append(connection)
            connection.readLines { event in
                guard case .line(let line) = event else { return connection.close() }
                connection.writeLine("echo: \(line)")
            }
        }
        let client = try Self.clientContext()
        let loop = simulation.loop
        let (established, reply, at, session) = try await simulation.run {
            () async throws -> (Duration, LineEvent?, Duration, TLSSession?) in
            let connection = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
            let established = simulation.now
            try await connection.send(line: "hello over TLS")
            let reply = try await connection.readLine()
            let at = simulation.now
            connection.close()
            _ = await connection.closed
            return (established, reply, at, connection.tls)
        }
        // SYN and SYN-ACK (10 ms), ClientHello and the server's flight (10 ms).
        #expect(established == .milliseconds(20))
        #expect(reply == .line("echo: hello over TLS"))
        #expect(at == .milliseconds(30))
        #expect(session?.version == "TLSv1.3")
        #expect(session?.peerCertificate?.isVerified == true)
        #expect(serverContext.statistics.completedHandshakes == 1)
        simulation.runUntilIdle()
        listener.close()
        #expect(served.value.count == 1)
    }

    /// A certificate the client does not trust fails the connect with the check that failed,
    /// when the server's flight arrives; the server counts the failed handshake.
    @Test func anUntrustedCertificateFailsTheConnectWithItsReason() async throws {
        let certs = try #require(TestCertificates.shared)
        let simulation = try Simulation(seed: 32)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverContext = try Self.serverContext()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0], tls: serverContext) { _ in }
        let client = try Self.clientContext(trusting: certs.untrustedCACertificate)
        let loop = simulation.loop
        let (failure, at) = try await simulation.run { () async -> (TLSError?, Duration) in
            do throws(TLSError) {
                _ = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
                return (nil, simulation.now)
            } catch {
                return (error, simulation.now)
            }
        }
        guard case .handshakeFailed(let reason)? = failure else {
            Issue.record("expected a TLS failure, got \(String(describing: failure))")
            return
        }
        #expect(reason.contains("the server's certificate did not verify"), "\(reason)")
        #expect(at == .milliseconds(20))
        // The client's alert reaches the server one latency later.
        simulation.advance(by: .milliseconds(10))
        #expect(serverContext.statistics.failedHandshakes == 1)
        #expect(serverContext.statistics.completedHandshakes == 0)
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A server that never answers the handshake (a plain listener that reads nothing): the
    /// client's handshake timeout ends the connect at its exact instant.
    @Test func aServerThatNeverAnswersTimesTheHandshakeOutExactly() async throws {
        let silent = try SilentServer(seed: 33)
        let simulation = silent.simulation, loop = silent.simulation.loop
        let client = try Self.clientContext(handshakeTimeout: .seconds(3))
        let (failure, at) = try await simulation.run { () async -> (TLSError?, Duration) in
            do throws(TLSError) {
                _ = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
                return (nil, simulation.now)
            } catch {
                return (error, simulation.now)
            }
        }
        #expect(failure == .handshakeFailed(reason: "the handshake did not finish within 3.0 seconds"))
        #expect(at == .milliseconds(3_010))
        silent.close()
    }

    /// The TLS connect's cancellation, as documented: the task cancelled at 1 s, mid-handshake,
    /// sees it when the handshake ends (here its 3 s timeout, at 3.010 s) with
    /// `TLSError.cancelled` — not the timeout's error — and nothing is left open.
    @Test func aCancelledTLSConnectThrowsCancelledWhenTheHandshakeEnds() async throws {
        let silent = try SilentServer(seed: 34)
        let simulation = silent.simulation, loop = silent.simulation.loop
        let client = try Self.clientContext(handshakeTimeout: .seconds(3))
        let (failure, at) = try await simulation.run { () async throws -> (TLSError?, Duration) in
            let attempt = Task(executorPreference: loop) { () async -> TLSError? in
                do throws(TLSError) {
                    _ = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
                    return nil
                } catch {
                    return error
                }
            }
            try await loop.sleep(for: .seconds(1))
            attempt.cancel()
            let failure = await attempt.value
            return (failure, simulation.now)
        }
        #expect(failure == .cancelled)
        #expect(at == .milliseconds(3_010))
        silent.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// Plain TCP's rules for a peer that goes away hold over TLS: a reset is `.error(ECONNRESET)`
    /// at both ends; a peer that closes is the end of the input.
    @Test func aResetAndAPeersCloseReadAsOverPlainTCP() async throws {
        let simulation = try Simulation(seed: 34)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverContext = try Self.serverContext()
        let serverEnds = Box<[Connection.CloseReason]>([])
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0], tls: serverContext) { connection in
            connection.readLines { event in
                switch event {
                case .line("bye"): connection.close()
                case .line(let line): connection.writeLine(line)
                default: break
                }
            }
            connection.onClose { serverEnds.value.append($0) }
        }
        let client = try Self.clientContext()
        let loop = simulation.loop
        let (resetReason, endEvent) = try await simulation.run {
            () async throws -> (Connection.CloseReason, LineEvent?) in
            let first = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
            try await first.send(line: "one")
            _ = try await first.readLine()
            simulation.network.reset("127.0.0.1", "10.0.0.2")
            let resetReason = await first.closed
            let second = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
            try await second.send(line: "bye")
            let endEvent = try await second.readLine()
            second.close()
            _ = await second.closed
            return (resetReason, endEvent)
        }
        #expect(resetReason == .error(ECONNRESET))
        #expect(endEvent == .endOfFile)
        simulation.runUntilIdle()
        #expect(serverEnds.value.first == .error(ECONNRESET))
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A TLS connection whose reader does not read pushes back on its writer, as over a socket:
    /// the layer's stream takes a receive buffer's worth, the link its window, and the rest
    /// stays in the writer's output — then, once the reader reads, every byte arrives, in order.
    /// (The stream under the layer used to take everything the writer sent.)
    @Test func aTLSReaderThatDoesNotReadPushesBackOnItsWriter() throws {
        let simulation = try Simulation(seed: 39)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverContext = try Self.serverContext()
        let accepted = Box<Connection?>(nil)
        // The connection is kept, and not read.
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0], tls: serverContext) {
            accepted.value = $0
        }
        let client = try Self.clientContext()
        let connected = Box<Connection?>(nil)
        Connection.connect(to: "10.0.0.2", port: 443, on: simulation.loop, tls: client, serverName: "localhost") {
            connected.value = try? $0.get()
        }
        simulation.advance(by: .milliseconds(100))
        let writer = try #require(connected.value)
        let reader = try #require(accepted.value)
        let sent = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        writer.write(sent)
        simulation.advance(by: .seconds(5))
        // 2 MiB sent; the link holds 256 KiB, the layer's stream 64 KiB, the layer's records add
        // a little: at least 1.5 MiB waits in the writer.
        #expect(bufferedOutput(of: writer) > 1_500_000, "\(bufferedOutput(of: writer)) bytes wait in the writer")
        let received = Box<[UInt8]>([])
        startReading(reader) { received.value += $0 }
        simulation.advance(by: .seconds(5))
        #expect(received.value.count == sent.count)
        #expect(received.value == sent)
        #expect(bufferedOutput(of: writer) == 0)
        writer.close()
        reader.close()
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// `HTTPClient` over `https://` in virtual time: the library's client, its TLS connector and
    /// a TLS listener answering HTTP, all over simulated bytes; the response body arrives one
    /// request round trip after the handshake.
    @Test func theHTTPClientSpeaksHTTPSInVirtualTime() async throws {
        let simulation = try Simulation(seed: 35)
        simulation.network.latency = .milliseconds(2)
        let loop = simulation.loop
        let serverContext = try Self.serverContext()
        let served = Box<[Connection]>([])
        // "localhost" is the client's own host; its certificate names it.
        let listener = try Listener(.tcp(host: "127.0.0.1", port: 443), on: loop, tls: serverContext) { connection in
            served.value.append(connection)
            connection.readLines { event in
                guard case .line(let line) = event else { return connection.close() }
                if line.isEmpty { connection.write("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello, https") }
            }
        }
        let client = HTTPClient(loop: loop, configuration: .init(secureConnector: .tls(try Self.clientContext())))
        let (status, body, at) = try await simulation.run { () async throws -> (Int, String, Duration) in
            let response = try await client.get("https://localhost/hello")
            return (response.status, response.text, simulation.now)
        }
        #expect(status == 200)
        #expect(body == "hello, https")
        // TCP (4 ms), the handshake (4 ms), the request and its response (4 ms).
        #expect(at == .milliseconds(12))
        client.shutdown()
        listener.close()
        for connection in served.value { connection.close() }
    }

    /// A peer that closes during the handshake is reported as on a socket: "the peer closed the
    /// connection during the handshake" (libevent's filter reports only an error; the stream's
    /// end says which).
    @Test func aPeerThatClosesDuringTheHandshakeIsNamed() async throws {
        let simulation = try Simulation(seed: 36)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        // Plain TCP: every connection is closed at once.
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0]) { $0.close() }
        let client = try Self.clientContext()
        let loop = simulation.loop
        let failure = try await simulation.run { () async -> TLSError? in
            do throws(TLSError) {
                _ = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
                return nil
            } catch {
                return error
            }
        }
        #expect(failure == .handshakeFailed(reason: "the peer closed the connection during the handshake"))
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A program that ends while a handshake it accepted is in progress takes the handshake
    /// with it, as a process's sockets close when it exits: the client's connect fails one
    /// latency after the exit, named as a peer's close — not established later by a server
    /// that no longer runs, nor left to its handshake timeout.
    @Test func aServerProgramThatEndsMidHandshakeTakesTheHandshakeWithIt() async throws {
        let simulation = try Simulation(seed: 38)
        simulation.network.latency = .milliseconds(5)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        let serverContext = try Self.serverContext()
        let accepted = Box(0)
        simulation.register(program: "tls-server") { process in
            // Listens, and ends at 12 ms: after the TCP accept (5 ms), before the client's
            // first flight arrives (15 ms).
            let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: process.loop, tls: serverContext) { _ in
                accepted.value += 1
            }
            try await process.sleep(for: .milliseconds(12))
            _ = listener
            return 0
        }
        let client = try Self.clientContext(handshakeTimeout: .seconds(3))
        let loop = simulation.loop
        let (failure, failedAt) = try await simulation.run { () async throws -> (TLSError?, Duration) in
            _ = try await Subprocess.launch(.init(executable: "tls-server"), on: server.loops[0])
            do throws(TLSError) {
                _ = try await Connection.connect(to: "10.0.0.2", port: 443, on: loop, tls: client, serverName: "localhost")
                return (nil, simulation.now)
            } catch {
                return (error, simulation.now)
            }
        }
        #expect(failure == .handshakeFailed(reason: "the peer closed the connection during the handshake"))
        #expect(failedAt == .milliseconds(17))
        #expect(accepted.value == 0)
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// HTTPS on simulated loops: `HTTPServer(group:routes:tls:)` on a simulated group and
    /// `HTTPClient` with `.tls(_:)` — real OpenSSL over the simulated network — answer with
    /// the handshake's and the requests' round trips exactly, one connection for both requests.
    @Test func anHTTPSServerOnSimulatedLoopsAnswersItsRoundTripsExactly() async throws {
        let simulation = try Simulation(seed: 34)
        simulation.network.latency = .milliseconds(5)
        simulation.network.maxSegmentSize = 100
        let group = try simulation.makeGroup(loopCount: 2)  // 127.0.0.1, as the certificate says
        let serverContext = try Self.serverContext()
        var routes = HTTPRoutes()
        routes.post("/echo") { request in HTTPResponse(body: request.body) }
        let server = try await HTTPServer(group: group, configuration: .init(port: 8443), routes: routes, tls: serverContext)
        let client = HTTPClient(loop: simulation.loop, configuration: .init(secureConnector: .tls(try Self.clientContext())))
        let (bodies, times) = try await simulation.run { () async throws -> ([String], [Duration]) in
            var bodies: [String] = []
            var times: [Duration] = []
            for text in ["first", String(repeating: "é", count: 3_000)] {
                let sent = simulation.now
                let response = try await client.post("https://127.0.0.1:8443/echo", body: Array(text.utf8))
                times.append(simulation.now - sent)
                bodies.append(response.text)
            }
            return (bodies, times)
        }
        #expect(bodies == ["first", String(repeating: "é", count: 3_000)])
        // TCP's round trip, TLS 1.3's, then the request's; the second reuses the connection.
        #expect(times == [.milliseconds(30), .milliseconds(10)])
        #expect(serverContext.statistics.completedHandshakes == 1)
        #expect(server.statistics.snapshot.connectionsAccepted == 1)
        client.shutdown()
        try await simulation.run { await server.closeAndWait() }
        simulation.advance(by: .seconds(5))
        #expect(server.isClosed)
    }

    /// A simulated program's TLS connection dies with it, as its plain ones do: the server
    /// reads the end of the stream one latency after the program's exit.
    @Test func aProgramsTLSConnectionClosesWhenItEnds() async throws {
        let simulation = try Simulation(seed: 37)
        simulation.network.latency = .milliseconds(5)
        let loop = simulation.loop
        let serverContext = try Self.serverContext()
        let events = Box<[String]>([])
        let listener = try Listener(.tcp(host: "127.0.0.1", port: 443), on: loop, tls: serverContext) { connection in
            connection.readLines { event in
                events.value.append("\(event) at \(simulation.now)")
                if case .endOfFile = event { connection.close() }
            }
            connection.onClose { events.value.append("closed: \($0) at \(simulation.now)") }
        }
        let client = try Self.clientContext()
        // The handle outlives the program (a dropped handle would close its connection itself):
        // only the program's end can close it.
        let kept = Box<[Connection]>([])
        simulation.register(program: "tls-client") { process in
            // Connected, one line sent, then it ends without closing.
            let connection = try await Connection.connect(to: "localhost", port: 443, on: process.loop, tls: client)
            kept.value.append(connection)
            try await connection.send(line: "hello")
            try await process.sleep(for: .seconds(1))
            return 0
        }
        let exitedAt = try await simulation.run { () async throws -> Duration in
            let child = try await Subprocess.launch(.init(executable: "tls-client"), on: loop)
            _ = await child.exit
            try await loop.sleep(for: .milliseconds(50))
            return simulation.now - .milliseconds(50)
        }
        // The handshake ends at 20 ms (two round trips of 10 ms), the line is read at 25 ms.
        #expect(exitedAt == .milliseconds(1_020))
        // The program never read: the server's TLS 1.3 session tickets wait unread in its
        // socket when it ends, so its close is a reset, as a kernel's is — the server learns
        // one latency after the exit.
        #expect(events.value == [#"line("hello") at 0.025 seconds"#, "closed: error 104 (Connection reset by peer) at 1.025 seconds"])
        #expect(kept.value.first?.isOpen == false)
        listener.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }
}

/// A connection's queued output, read from synchronous code (the loop's thread: the test's,
/// which drives the simulation).
private func bufferedOutput(of connection: Connection) -> Int { connection.bufferedOutputBytes }

/// Reads `connection`'s bytes into `sink` (from synchronous code, as above).
private func startReading(_ connection: Connection, _ sink: @escaping ([UInt8]) -> Void) {
    connection.readBytes { input in if case .bytes(let bytes) = input { sink(bytes) } }
}
