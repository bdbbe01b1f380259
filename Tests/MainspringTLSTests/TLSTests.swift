import Foundation
import Mainspring
import MainspringTestSupport
import MainspringHTTP
import MainspringTLS
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("TLS: connections, listeners, certificates and bad input (MainspringTLS)", .serialized,
       .enabled(if: hasOpenSSL, "the openssl command is not installed (Debian: apt-get install openssl)"))
struct TLSTests {
    @Test("a configuration that cannot work is a clear error naming the file: missing, unreadable, a key of another certificate")
    func configurationErrors() throws {
        let certs = try #require(certificates)
        #expect {
            _ = try TLSServerContext(configuration: .init(certificateFile: "/nonexistent/cert.pem", keyFile: certs.serverKey))
        } throws: { error in
            "\(error)".contains("'/nonexistent/cert.pem'") && "\(error)".contains("No such file")
        }
        #expect {
            _ = try TLSServerContext(configuration: .init(certificateFile: certs.otherHostCertificate, keyFile: certs.serverKey))
        } throws: { error in
            "\(error)".contains("does not match the certificate") && "\(error)".contains(certs.serverKey)
        }
        #expect(throws: TLSConfigurationError.self) {
            _ = try TLSServerContext(configuration: .init(certificates: [TLSCertificate(chain: .pem("not a certificate"),
                                                                                         privateKey: .file(certs.serverKey))]))
        }
        #expect {
            _ = try TLSClientContext(configuration: .init(trustRoots: .file("/nonexistent/ca.pem")))
        } throws: { error in "\(error)".contains("trust roots") && "\(error)".contains("/nonexistent/ca.pem") }
    }

    @Test("a TLS connect on a loop that has shut down fails with loopClosed instead of waiting forever")
    func tlsConnectOnAShutDownLoop() async throws {
        let certs = try #require(certificates)
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let group = try EventLoopGroup(loopCount: 1)
        await group.shutdown(gracePeriod: .zero)
        await #expect(throws: TLSError.connect(.loopClosed)) {
            _ = try await Connection.connect(to: "127.0.0.1", port: 9, on: group.loops[0], tls: client)
        }
    }

    @Test("a Mainspring TLS client and server: lines both ways, TLS 1.3, ALPN agreed, the server's certificate checked and summarised")
    func roundTrip() async throws {
        let certs = try #require(certificates)
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs, alpn: ["mainspring/1", "other"]))
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate),
                                                               applicationProtocols: ["nothing", "mainspring/1"]))
        let loop = server.group.loops[0]
        let connection = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: client)
        let session = try #require(connection.tls)
        #expect(session.version == "TLSv1.3")
        #expect(session.applicationProtocol == "mainspring/1")
        #expect(session.peerCertificate?.subject == "CN=localhost")
        #expect(session.peerCertificate?.subjectAlternativeNames == ["localhost", "127.0.0.1", "0:0:0:0:0:0:0:1"])
        #expect(session.peerCertificate?.isVerified == true)
        let replies = try await Task(executorPreference: loop) { () async throws -> [String] in
            var replies: [String] = []
            for text in ["one", "two", String(repeating: "x", count: 20_000)] {
                try await connection.send(line: text)
                if case .line(let reply)? = try await connection.readLine() { replies.append(reply) }
            }
            connection.close()
            return replies
        }.value
        #expect(replies == ["echo: one", "echo: two", "echo: " + String(repeating: "x", count: 20_000)])
        #expect(server.sessions.value.first?.serverName == "localhost", "SNI reached the server")
        #expect(server.context.statistics.completedHandshakes >= 1)
        await server.stop()
    }

    @Test("the client refuses what it should, naming the check: expired, another host, self-signed, an unknown CA, plaintext")
    func clientRefusals() async throws {
        let certs = try #require(certificates)
        let cases: [(String, String, String, String)] = [
            ("expired", certs.expiredCertificate, certs.expiredKey, "certificate has expired"),
            ("another host", certs.otherHostCertificate, certs.otherHostKey, "hostname mismatch"),
            ("self-signed", certs.selfSignedCertificate, certs.selfSignedKey, "self-signed certificate"),
        ]
        let trusting = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        for (name, certificate, key, reason) in cases {
            let server = try await TLSEchoServer(configuration: .init(certificateFile: certificate, keyFile: key))
            let loop = server.group.loops[0]
            do {
                _ = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: trusting)
                Issue.record("\(name): the client accepted it")
            } catch {
                #expect("\(error)".contains(reason), "\(name): \(error)")
            }
            #expect(server.context.statistics.failedHandshakes >= 0)
            await server.stop()
        }
        // A server whose CA the client does not know.
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs))
        let system = try TLSClientContext()
        do {
            _ = try await Connection.connect(to: "localhost", port: server.port, on: server.group.loops[0], tls: system)
            Issue.record("the client trusted the test CA without being told to")
        } catch {
            #expect("\(error)".contains("unable to get local issuer certificate") || "\(error)".contains("verify"), "\(error)")
        }
        // With verification off (loudly named) the same server is accepted.
        let insecure = try TLSClientContext(configuration: .init(verification: .insecureNoVerification))
        let accepted = try await Connection.connect(to: "localhost", port: server.port, on: server.group.loops[0], tls: insecure)
        #expect(accepted.tls?.peerCertificate?.isVerified == false)
        accepted.close()
        await server.stop()
    }

    @Test("mutual TLS: a client certificate is required, checked, and readable on the server; none or an untrusted one is refused")
    func mutualTLS() async throws {
        let certs = try #require(certificates)
        let server = try await TLSEchoServer(configuration: serverConfiguration(
            certs, clientAuthentication: .required(trustRoots: .file(certs.caCertificate))))
        let loop = server.group.loops[0]
        let withCertificate = try TLSClientContext(configuration: .init(
            trustRoots: .file(certs.caCertificate),
            certificate: TLSCertificate(certificateFile: certs.clientCertificate, keyFile: certs.clientKey)))
        let connection = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: withCertificate)
        let who = try await Task(executorPreference: loop) { () async throws -> String? in
            try await connection.send(line: "who")
            guard case .line(let reply)? = try await connection.readLine() else { return nil }
            connection.close()
            return reply
        }.value
        #expect(who == "CN=test client")
        for (name, certificate) in [("no certificate", nil as TLSCertificate?),
                                    ("an untrusted CA's", TLSCertificate(certificateFile: certs.untrustedClientCertificate,
                                                                          keyFile: certs.untrustedClientKey))]
        {
            let context = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate), certificate: certificate))
            // TLS 1.3: the client may finish its side before the server refuses the certificate, so
            // the refusal shows as the connection failing, at the handshake or at the first read.
            var outcome = ""
            do {
                let attempt = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: context)
                outcome = await Task(executorPreference: loop) { () async -> String in
                    do {
                        try await attempt.send(line: "who")
                        let reply = try await attempt.readLine()
                        return reply == nil ? "" : "answered \(reply!)"
                    } catch {
                        return ""
                    }
                }.value
            } catch {
                outcome = ""
            }
            #expect(outcome.isEmpty, "\(name) was accepted: \(outcome)")
        }
        let failures = server.context.statistics
        #expect(failures.failedHandshakes >= 2, "\(failures)")
        await server.stop()
    }

    @Test("bad input to a TLS port: plaintext HTTP, random bytes, a client that stops mid-handshake (timeout) — each closed and counted, others unaffected")
    func badInput() async throws {
        let certs = try #require(certificates)
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs, handshakeTimeout: .milliseconds(500)))
        let port = server.port
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let loop = server.group.loops[0]
        // One good connection throughout.
        let good = try await Connection.connect(to: "localhost", port: port, on: loop, tls: client)
        let replies = try await onPlainThread { () -> [String] in
            var replies: [String] = []
            let http = try TestClient(port: port)
            http.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            replies.append(http.readToEnd())
            let noise = try TestClient(port: port)
            noise.send((0..<2_000).map { _ in UInt8.random(in: 0...255) })
            replies.append(noise.readToEnd())
            let silent = try TestClient(port: port)  // connects and says nothing: times out
            let start = ContinuousClock.now
            replies.append(silent.readToEnd())
            replies.append(ContinuousClock.now - start < .seconds(9) ? "timed out" : "held")
            return replies
        }
        #expect(replies[0].isEmpty || !replies[0].contains("HTTP/1.1 200"), "plaintext got an answer: \(replies[0])")
        #expect(replies[3] == "timed out", "a silent client held its connection past the handshake timeout")
        let stats = server.context.statistics
        #expect(stats.failedHandshakes >= 3, "\(stats)")
        let echoed = try await Task(executorPreference: loop) { () async throws -> LineEvent? in
            try await good.send(line: "still here")
            defer { good.close() }
            return try await good.readLine()
        }.value
        #expect(echoed == .line("echo: still here"))
        await server.stop()
    }

    @Test("many concurrent handshakes on a 2-loop group: every one established, every echo right")
    func concurrentHandshakes() async throws {
        let certs = try #require(certificates)
        let count = ProcessInfo.processInfo.environment["MAINSPRING_SANITIZER"] == nil ? 1_000 : 200
        // The handshakes queue behind each other (1,000 at once, each about a millisecond of
        // the server's CPU, beside a whole parallel test run and maybe a second build): a
        // handshake's 10 s default deadline was missed once that way. This test is about every
        // handshake succeeding, not about their speed: a deadline no queue can reach.
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs, handshakeTimeout: .seconds(300)),
                                             loops: 2)
        // The clients' handshakes queue too (on the same two loops): the same deadline for them.
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate),
                                                               handshakeTimeout: .seconds(300)))
        let port = server.port
        let ok = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<count {
                let loop = server.group.loops[index % 2]
                group.addTask(executorPreference: loop) {
                    let connection = try await Connection.connect(to: "127.0.0.1", port: port, on: loop, tls: client)
                    try await connection.send(line: "n\(index)")
                    let reply = try await connection.readLine()
                    connection.close()
                    return reply == .line("echo: n\(index)")
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(ok == count)
        #expect(server.context.statistics.completedHandshakes == count)
        await server.stop()
    }

    @Test("reload: new handshakes get the new certificate, an established connection goes on, a bad reload keeps the old one")
    func reload() async throws {
        let certs = try #require(certificates)
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs))
        let loop = server.group.loops[0]
        let trusting = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate), verification: .chainOnly))
        let before = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: trusting)
        #expect(before.tls?.peerCertificate?.subject == "CN=localhost")
        #expect(throws: TLSConfigurationError.self) {
            try server.context.reload(configuration: .init(certificateFile: certs.otherHostCertificate, keyFile: certs.serverKey))
        }
        let unchanged = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: trusting)
        #expect(unchanged.tls?.peerCertificate?.subject == "CN=localhost", "a failed reload keeps the old certificate")
        unchanged.close()
        try server.context.reload(configuration: .init(certificateFile: certs.otherHostCertificate, keyFile: certs.otherHostKey))
        let after = try await Connection.connect(to: "localhost", port: server.port, on: loop, tls: trusting)
        #expect(after.tls?.peerCertificate?.subject == "CN=elsewhere.example")
        after.close()
        let still = try await Task(executorPreference: loop) { () async throws -> LineEvent? in
            try await before.send(line: "older")
            defer { before.close() }
            return try await before.readLine()
        }.value
        #expect(still == .line("echo: older"), "the connection made before the reload is untouched")
        await server.stop()
    }
}
