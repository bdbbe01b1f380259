import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// One question for every cancellation: `error.isCancellation`, whatever type reported it.
@Suite("Cancellation: one question for every error that reports it")
struct CancellationReportingTests {
    /// Three waits of three domains, each cancelled 10 ms in on virtual time — a read
    /// (`CloseReason`), a request (`HTTPClientError`), a sleep (`CancellationError`): each
    /// throws its own type's cancellation, and the one question recognizes all three, as
    /// `any Error` and as their own type.
    @Test func aCancelledReadRequestAndSleepAreAllCancellations() async throws {
        let simulation = try Simulation(seed: 61)
        simulation.network.latency = .milliseconds(1)
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        var routes = HTTPRoutes()
        routes.get("/slow") { request async throws in
            try await request.loop.sleep(for: .seconds(10))
            return .text("late\n")
        }
        let serverRoutes = routes
        let http = try await simulation.run {
            try await HTTPServer(group: server, configuration: .init(host: "0.0.0.0", port: 80), routes: serverRoutes)
        }
        // A peer that keeps the connection open and says nothing.
        let accepted = Locked<[Connection]>([])
        let silent = try Listener(.tcp(host: "0.0.0.0", port: 7), on: server.loops[0]) { connection in
            accepted.withLock { $0.append(connection) }
        }
        let loop = simulation.loop
        let client = HTTPClient(loop: loop)
        let errors = try await simulation.run { () async throws -> [any Error] in
            let connection = try await Connection.connect(to: "10.0.0.1", port: 7, on: loop)
            let waits: [Task<Void, any Error>] = [
                Task(executorPreference: loop) { _ = try await connection.readLine() },
                Task(executorPreference: loop) { _ = try await client.get("http://10.0.0.1/slow") },
                Task(executorPreference: loop) { try await loop.sleep(for: .seconds(10)) },
            ]
            try await loop.sleep(for: .milliseconds(10))
            var errors: [any Error] = []
            for wait in waits {
                wait.cancel()
                do { try await wait.value } catch { errors.append(error) }
            }
            return errors
        }
        #expect(errors.count == 3)
        #expect(errors.first as? Connection.CloseReason == .cancelled, "\(errors)")
        #expect(errors.dropFirst().first as? HTTPClientError == .cancelled, "\(errors)")
        #expect(errors.last is CancellationError, "\(errors)")
        #expect(errors.allSatisfy { $0.isCancellation }, "\(errors)")
        client.shutdown()
        try await simulation.run { await http.closeAndWait() }
        silent.close()
        for connection in accepted.value { connection.close() }
        simulation.runUntilIdle()
    }

    /// Each library type answers for its own `cancelled` and for a cancellation it carries; any
    /// other failure, and an error of another type, is not one.
    @Test func everyTypedErrorAnswersForItsOwnCancelledAndWhatItCarries() {
        let cancellations: [any Error] = [
            CancellationError(), EventLoopError.cancelled, Connection.CloseReason.cancelled,
            Connection.CloseReason.connectFailed(.cancelled), DatagramError.cancelled, DatagramError.loop(.cancelled),
            TLSError.cancelled, TLSError.connect(.cancelled), HTTPClientError.cancelled,
            HTTPClientError.sendFailed(.cancelled), HTTPClientError.connectFailed(host: "h", port: 1, .cancelled),
            WebSocketError.cancelled,
        ]
        let failures: [any Error] = [
            EventLoopError.loopClosed, Connection.CloseReason.closed, Connection.CloseReason.idleTimeout,
            Connection.CloseReason.tlsFailed(.protocolError(reason: "bad record mac")), DatagramError.closed,
            TLSError.handshakeFailed(reason: "no"), TLSError.connect(.loopClosed), HTTPClientError.clientClosed,
            HTTPClientError.sendFailed(.error(104)), WebSocketError.closed(nil), SubprocessError.cannotStart(executable: "x", path: "x", errno: 2),
        ]
        for error in cancellations { #expect(error.isCancellation, "\(error)") }
        for error in failures { #expect(!error.isCancellation, "\(error)") }
        // The protocol's own requirement answers the same.
        #expect(HTTPClientError.cancelled.reportsCancellation && !HTTPClientError.clientClosed.reportsCancellation)
        #expect(WebSocketError.tlsFailed(.cancelled).isCancellation)
    }
}
