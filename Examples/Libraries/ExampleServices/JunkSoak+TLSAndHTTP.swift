import Foundation
#if canImport(Glibc)
import Glibc
#endif
import KVService
import Mainspring
@_spi(Simulation) import MainspringCore
import MainspringHTTP
import MainspringTLS
import MainspringTesting

// The junk soak's TLS and HTTP parsers (JunkSoak.swift runs them): the record layer under a line
// echo, the client's response parser, the server's connection engine.
extension JunkSoak.Run {
    // MARK: TLS (the record layer, under a line echo)

    func tls(duration: Duration, certificate: JunkSoak.Certificate) throws {
        let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.3")
        let serverContext = try TLSServerContext(configuration: .init(certificateFile: certificate.certificateFile,
                                                                      keyFile: certificate.keyFile))
        let clientContext = try TLSClientContext(configuration: .init(
            trustRoots: .file(certificate.trustedCertificateFile ?? certificate.certificateFile), handshakeTimeout: .seconds(2)))
        // Echoes each line; anything but a line (invalid UTF-8, an over-long line) would be junk
        // that got through TLS: counted, and the oracle fails the run.
        let serverSaw = ServerTally()
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 443), on: server.loops[0],
                                    options: .init(maxLineLength: 256, idleTimeout: .seconds(5)), tls: serverContext) { connection in
            connection.readLines { event in
                switch event {
                case .line(let line):
                    serverSaw.lines += 1
                    connection.writeLine(line)
                case .endOfFile, .error: connection.close()
                default:
                    serverSaw.altered += 1
                    connection.close()
                }
            }
        }
        injectJunk(for: duration, hosts: ["127.0.0.1", "10.0.0.3"])
        let loop = simulation.loop
        let stopAt = simulation.now + duration
        let simulation = self.simulation
        let outcomes = try runClients(4) { client in
            var outcomes: [String: Int] = [:]
            var round = 0
            while simulation.now < stopAt {
                let connection: Connection
                do throws(TLSError) {
                    connection = try await Connection.connect(to: "10.0.0.3", port: 443, on: loop,
                                                              options: .init(idleTimeout: .seconds(3)),
                                                              tls: clientContext, serverName: "localhost")
                } catch {
                    if case .handshakeFailed = error { outcomes["handshake failed", default: 0] += 1 } else {
                        outcomes["connect failed", default: 0] += 1
                    }
                    try? await loop.sleep(for: .milliseconds(200))  // throws only if cancelled: nothing cancels it
                    continue
                }
                do throws(Connection.CloseReason) {
                    while simulation.now < stopAt {
                        round += 1
                        let line = "client \(client) round \(round)"
                        // Two records 20 ms apart: junk lands between records and inside them.
                        let bytes = Array(line.utf8)
                        try await connection.send(Array(bytes[..<(bytes.count / 2)]))
                        try? await loop.sleep(for: .milliseconds(20))  // throws only if cancelled: nothing cancels it
                        try await connection.send(Array(bytes[(bytes.count / 2)...]) + [0x0A])
                        guard let event = try await connection.readLine() else { throw .closed }
                        switch event {
                        case .line(line): outcomes["echo", default: 0] += 1
                        case .endOfFile: throw .closed
                        default: outcomes["altered", default: 0] += 1
                        }
                        try? await loop.sleep(for: .milliseconds(200))  // throws only if cancelled: nothing cancels it
                    }
                } catch {
                    outcomes[JunkSoak.kind(of: error), default: 0] += 1
                }
                connection.close()
            }
            return outcomes
        }
        result.outcomes.merge(outcomes, uniquingKeysWith: +)
        if let altered = outcomes["altered"] { fail("\(altered) echoes were not the line sent: junk got through TLS") }
        if serverSaw.altered > 0 { fail("the server read \(serverSaw.altered) lines junk had altered through TLS") }
        for kind in outcomes.keys where kind.hasPrefix("other") { fail("an unexpected outcome: \(kind)") }
        simulation.advance(by: .seconds(6))  // the junk has stopped; idle connections have timed out
        let check = try simulation.runSynchronously { () async -> String in
            do {
                let connection = try await Connection.connect(to: "10.0.0.3", port: 443, on: loop, tls: clientContext,
                                                              serverName: "localhost")
                defer { connection.close() }
                try await connection.send(line: "after the junk")
                guard case .line(let text)? = try await connection.readLine() else { return "no line" }
                return text
            } catch {
                return "\(error)"
            }
        }
        if check == "after the junk" { result.intact += (outcomes["echo"] ?? 0) + 1 } else {
            fail("after the junk, a new connection got \(check)")
        }
        simulation.advance(by: .seconds(1))
        listener.close()
    }

    /// What the TLS run's server read (on the simulation's driving thread).
    private final class ServerTally: @unchecked Sendable {
        var lines = 0
        var altered = 0
    }

    // MARK: HTTP (the client's response parser)

    func http(duration: Duration) throws {
        let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
        // Answers each request head (up to its empty line) with one fixed response in three
        // writes 15 ms apart (status line, header, body), so that junk lands inside responses.
        let upstreamLoop = upstream.loops[0]
        let listener = try Listener(.tcp(host: "0.0.0.0", port: 80), on: upstreamLoop, options: .init(maxLineLength: 4_096)) { connection in
            connection.readLines { event in
                switch event {
                case .line(let line):
                    guard line.isEmpty else { return }
                    connection.write("HTTP/1.1 200 OK\r\n")
                    _ = upstreamLoop.schedule(after: .milliseconds(15)) { connection.write("Content-Length: 5\r\n\r\n") }
                    _ = upstreamLoop.schedule(after: .milliseconds(30)) { connection.write("hello") }
                case .invalidUTF8, .tooLong: break
                default: connection.close()
                }
            }
        }
        let loop = simulation.loop
        let client = HTTPClient(loop: loop, configuration: .init(connectTimeout: .seconds(2), responseTimeout: .seconds(2)))
        injectJunk(for: duration, hosts: ["127.0.0.1", "10.0.0.2"])
        let stopAt = simulation.now + duration
        let simulation = self.simulation
        let (outcomes, intact, requests) = try simulation.runSynchronously { () async -> ([String: Int], Int, Int) in
            var outcomes: [String: Int] = [:]
            var intact = 0
            var requests = 0
            while simulation.now < stopAt {
                requests += 1
                do throws(HTTPClientError) {
                    let response = try await client.get("http://10.0.0.2/")
                    if response.status == 200 && response.body == Array("hello".utf8) {
                        intact += 1
                        outcomes["200 hello", default: 0] += 1
                    } else {
                        outcomes["altered response", default: 0] += 1
                    }
                } catch {
                    outcomes[JunkSoak.kind(of: error), default: 0] += 1
                }
                try? await loop.sleep(for: .milliseconds(100))  // throws only if cancelled: nothing cancels it
            }
            return (outcomes, intact, requests)
        }
        result.outcomes.merge(outcomes, uniquingKeysWith: +)
        if outcomes.values.reduce(0, +) != requests { fail("\(requests) requests, \(outcomes.values.reduce(0, +)) ended") }
        for kind in outcomes.keys where kind.hasPrefix("other") { fail("an unexpected outcome: \(kind)") }
        simulation.advance(by: .seconds(3))
        let check = try simulation.runSynchronously { () async -> String in
            do throws(HTTPClientError) {
                let response = try await client.get("http://10.0.0.2/")
                return "\(response.status) \(String(decoding: response.body, as: UTF8.self))"
            } catch {
                return "\(error)"
            }
        }
        if check == "200 hello" { result.intact += intact + 1 } else { fail("after the junk, a request got \(check)") }
        client.shutdown()
        listener.close()
    }

    // MARK: HTTP requests (the server's connection engine)

    func httpServer(duration: Duration) throws {
        let group = try simulation.makeGroup(loopCount: 2, host: "10.0.0.3")
        var routes = HTTPRoutes()
        routes.post("/echo") { request in HTTPResponse(body: request.body) }
        let server = try HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80, maxHeaderBytes: 1_024,
                                                                     maxBodyBytes: 256, idleTimeout: .seconds(5),
                                                                     headerTimeout: .seconds(2), bodyTimeout: .seconds(2)),
                                    routes: routes)
        let loop = simulation.loop
        injectJunk(for: duration, hosts: ["127.0.0.1", "10.0.0.3"])
        let stopAt = simulation.now + duration
        let simulation = self.simulation
        let outcomes = try runClients(3) { client in
            let http = HTTPClient(loop: loop, configuration: .init(connectTimeout: .seconds(2), responseTimeout: .seconds(3)))
            defer { http.shutdown() }
            var outcomes: [String: Int] = [:]
            var round = 0
            while simulation.now < stopAt {
                round += 1
                let body = Array("client \(client) round \(round)".utf8)
                do throws(HTTPClientError) {
                    let response = try await http.post("http://10.0.0.3/echo", body: body)
                    let kind = response.status == 200 ? (response.body == body ? "200 exact" : "200 altered body")
                        : "\(response.status)"
                    outcomes[kind, default: 0] += 1
                } catch {
                    outcomes[JunkSoak.kind(of: error), default: 0] += 1
                }
                try? await loop.sleep(for: .milliseconds(100))  // throws only if cancelled: nothing cancels it
            }
            outcomes["requests", default: 0] += round
            return outcomes
        }
        let requests = outcomes["requests"] ?? 0
        var ended = outcomes
        ended["requests"] = nil
        result.outcomes.merge(ended, uniquingKeysWith: +)
        if ended.values.reduce(0, +) != requests { fail("\(requests) requests, \(ended.values.reduce(0, +)) ended") }
        let expected: Set<String> = ["200", "400", "404", "405", "413", "417", "431", "501"]
        for kind in ended.keys where kind.hasPrefix("other") || (Int(kind) != nil && !expected.contains(kind)) {
            fail("an unexpected outcome: \(kind)")
        }
        simulation.advance(by: .seconds(6))  // the junk has stopped, every deadline has passed
        let inFlight = server.statistics.snapshot.requestsInFlight
        if inFlight != 0 { fail("\(inFlight) requests still in flight after the junk") }
        let check = try simulation.runSynchronously { () async -> String in
            let http = HTTPClient(loop: loop)
            defer { http.shutdown() }
            do throws(HTTPClientError) {
                let response = try await http.post("http://10.0.0.3/echo", body: Array("after the junk".utf8))
                return "\(response.status) \(String(decoding: response.body, as: UTF8.self))"
            } catch {
                return "\(error)"
            }
        }
        if check == "200 after the junk" {
            result.intact += (outcomes["200 exact"] ?? 0) + 1
        } else {
            fail("after the junk, a request got \(check)")
        }
        try simulation.runSynchronously { await server.closeAndWait() }
    }
}
