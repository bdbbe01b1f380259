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

@Suite("HTTPS and the daemon over TLS (subprocess, curl, openssl)", .serialized,
       .enabled(if: hasOpenSSL, "the openssl command is not installed (Debian: apt-get install openssl)"))
struct HTTPSTests {
    @Test("one group serves HTTP and HTTPS on two ports; /metrics and /healthz answer over both; curl --cacert checks the certificate")
    func httpAndHTTPS() async throws {
        let certs = try #require(certificates)
        let group = try EventLoopGroup(loopCount: 2)
        var routes = HTTPRoutes()
        routes.serveMetrics(of: group)
        routes.serveHealth(of: group)
        routes.get("/hello") { request in .text("hello from \(request.loop === request.loop ? "a loop" : "?")\n") }
        let tls = try TLSServerContext(configuration: serverConfiguration(certs))
        let plain = try await HTTPServer(group: group, routes: routes)
        let secure = try await HTTPServer(group: group, routes: routes, tls: tls)
        for path in ["/hello", "/healthz", "/metrics"] {
            let overTLS = try await runProgram("curl", arguments: ["-sS", "--cacert", certs.caCertificate, "-w", "\n%{http_code}",
                                                                   "https://localhost:\(secure.port)\(path)"])
            #expect(overTLS.stdout.hasSuffix("\n200"), "https \(path): \(overTLS.summary)")
            let overTCP = try await runProgram("curl", arguments: ["-sS", "-w", "\n%{http_code}", "http://127.0.0.1:\(plain.port)\(path)"])
            #expect(overTCP.stdout.hasSuffix("\n200"), "http \(path): \(overTCP.summary)")
        }
        let metrics = try await runProgram("curl", arguments: ["-sS", "--cacert", certs.caCertificate, "https://localhost:\(secure.port)/metrics"])
        #expect(metrics.stdout.contains("mainspring_loop_callbacks_total"), "\(metrics.stdout.prefix(300))")
        // Keep-alive over TLS: several requests on one connection.
        let keepAlive = try await runProgram("curl", arguments: ["-sS", "--cacert", certs.caCertificate,
                                                                 "https://localhost:\(secure.port)/hello",
                                                                 "https://localhost:\(secure.port)/hello"])
        #expect(keepAlive.stdout == "hello from a loop\nhello from a loop\n", "\(keepAlive.summary)")
        // Without the CA, curl refuses the server.
        let untrusted = try await runProgram("curl", arguments: ["-sS", "https://localhost:\(secure.port)/hello"])
        #expect(untrusted.status != 0, "\(untrusted.summary)")
        // Plaintext to the HTTPS port gets no HTTP answer.
        let plaintext = try await runProgram("curl", arguments: ["-sS", "--max-time", "10", "http://127.0.0.1:\(secure.port)/hello"])
        #expect(!plaintext.stdout.contains("hello from"), "\(plaintext.summary)")
        await plain.closeAndWait()
        await secure.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("HTTPS answers requests that close their connection (Connection: close, HTTP/1.0, 1 MB to a slow reader: whole), and a closed connection's descriptor is closed once and never written after (the daemon under strace: no EBADF)")
    func httpsClosingConnections() async throws {
        // Before: curl got an empty reply to every Connection: close or HTTP/1.0 request — the
        // response waited in the TLS bufferevent for a poll while evhttp shut the socket down and
        // closed it — and the layer then wrote close_notify to, and closed, that descriptor
        // number again: EBADF, or another connection's socket once the number was reused.
        let certs = try #require(certificates)
        let trace = uniqueTestPath("daemon.strace")
        let arguments = ["--port", "0", "--http-port", "0", "--loops", "1",
                         "--tls-certificate", certs.serverCertificate, "--tls-key", certs.serverKey]
        let daemon = canStrace
            ? try startProgram("/usr/bin/strace", arguments: ["-f", "-qq", "-Z", "-e", "trace=close,write,writev,sendmsg,sendto,shutdown",
                                                              "-o", trace, try executableURL("mainspring-daemon").path] + arguments)
            : try startExecutable("mainspring-daemon", arguments: arguments)
        // The daemon itself: strace's child when traced (strace, told to stop, would let it run on).
        let daemonPID = { () -> pid_t in
            guard canStrace else { return daemon.pid }
            let children = (try? String(contentsOfFile: "/proc/\(daemon.pid)/task/\(daemon.pid)/children", encoding: .utf8)) ?? ""
            return children.split(separator: " ").first.flatMap { pid_t($0) } ?? daemon.pid
        }
        defer {
            kill(daemonPID(), SIGKILL)
            daemon.send(SIGKILL)
        }
        _ = try #require(daemon.readLine(timeout: .seconds(60)), "no banner")
        let httpsBanner = try #require(daemon.readLine(timeout: .seconds(30)), "no https banner")
        let httpsPort = try #require(httpsBanner.split(separator: ":").last.flatMap { UInt16($0) }, "\(httpsBanner)")
        let body = Data((0..<1_000_000).map { UInt8(truncatingIfNeeded: $0 % 251) })
        let bodyPath = uniqueTestPath("body.bin")
        try body.write(to: URL(fileURLWithPath: bodyPath))
        for (name, options) in [("Connection: close", ["-H", "Connection: close"]),
                                ("Connection: close, read at 2 MB/s", ["-H", "Connection: close", "--limit-rate", "2M"]),
                                ("HTTP/1.0", ["--http1.0"])]
        {
            let output = uniqueTestPath("echoed.bin")
            let result = try await runProgram("curl", arguments: ["-sS", "--cacert", certs.caCertificate, "--data-binary", "@\(bodyPath)",
                                                                  "-o", output, "-w", "%{http_code} %{size_download}"]
                                                  + options + ["https://localhost:\(httpsPort)/echo"])
            #expect(result.stdout == "200 1000000", "\(name): \(result.summary)")
            #expect(FileManager.default.contents(atPath: output) == body, "\(name): the body did not come back as sent")
        }
        for _ in 0..<30 {
            let health = try await runProgram("curl", arguments: ["-sS", "--cacert", certs.caCertificate, "-H", "Connection: close",
                                                                  "https://localhost:\(httpsPort)/healthz"])
            #expect(health.stdout == "ok\n", "\(health.summary)")
        }
        kill(daemonPID(), SIGTERM)
        let exit = await onPlainThread { daemon.waitForExit(timeout: .seconds(30)) }
        #expect(exit.status == 0, "\(exit.summary)")
        guard canStrace else {
            print("note: no strace here (or AddressSanitizer, which cannot run under it): the descriptor half of this test did not run (make test-tools installs strace)")
            return
        }
        let failed = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n").filter { $0.contains("EBADF") }
        #expect(failed.isEmpty, "system calls on a closed descriptor:\n\(failed.prefix(10).joined(separator: "\n"))")
    }

    @Test("mainspring-daemon --tls-certificate --tls-key: ECHO over TLS, HTTPS /healthz, SIGHUP reloads the files")
    func daemonOverTLS() async throws {
        let certs = try #require(certificates)
        // The daemon's files: copies, so that the test can replace them for the reload.
        let certificate = uniqueTestPath("daemon.pem")
        let key = uniqueTestPath("daemon.key")
        try FileManager.default.copyItem(atPath: certs.serverCertificate, toPath: certificate)
        try FileManager.default.copyItem(atPath: certs.serverKey, toPath: key)
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--http-port", "0", "--loops", "2",
                                                                        "--tls-certificate", certificate, "--tls-key", key])
        defer { daemon.send(SIGKILL) }
        let banner = try #require(daemon.readLine(timeout: .seconds(30)), "no banner")
        let port = try #require(banner.split(separator: " ").dropFirst(2).first?.split(separator: ":").last.flatMap { UInt16($0) },
                                "no port in '\(banner)'")
        let httpsBanner = try #require(daemon.readLine(timeout: .seconds(30)), "no https banner")
        #expect(httpsBanner.hasPrefix("https listening on"), "\(httpsBanner)")
        let httpsPort = try #require(httpsBanner.split(separator: ":").last.flatMap { UInt16($0) })
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate), verification: .chainOnly))
        let first = try await Connection.connect(to: "127.0.0.1", port: port, on: loop, tls: client)
        #expect(first.tls?.peerCertificate?.subject == "CN=localhost")
        let echoed = try await Task(executorPreference: loop) { () async throws -> LineEvent? in
            try await first.send(line: "ECHO over TLS")
            defer { first.close() }
            return try await first.readLine()
        }.value
        #expect(echoed == .line("over TLS"))
        let health = try await runProgram("curl", arguments: ["-sS", "--cacert", certs.caCertificate, "https://localhost:\(httpsPort)/healthz"])
        #expect(health.stdout == "ok\n", "\(health.summary)")
        // ALPN: a client that offers h2 speaks HTTP/2 on the HTTPS port.
        let h2 = try await runProgram("curl", arguments: ["-sS", "--http2", "-w", " %{http_version}", "--cacert", certs.caCertificate,
                                                          "https://localhost:\(httpsPort)/healthz"])
        #expect(h2.stdout == "ok\n 2", "\(h2.summary)")
        // Replace the files, SIGHUP: new handshakes present the new certificate.
        try FileManager.default.removeItem(atPath: certificate)
        try FileManager.default.removeItem(atPath: key)
        try FileManager.default.copyItem(atPath: certs.otherHostCertificate, toPath: certificate)
        try FileManager.default.copyItem(atPath: certs.otherHostKey, toPath: key)
        daemon.send(SIGHUP)
        var subject: String?
        for _ in 0..<100 {
            let probe = try await Connection.connect(to: "127.0.0.1", port: port, on: loop, tls: client)
            subject = probe.tls?.peerCertificate?.subject
            probe.close()
            if subject == "CN=elsewhere.example" { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(subject == "CN=elsewhere.example", "the reload never took effect")
        daemon.send(SIGTERM)
        let result = await onPlainThread { daemon.waitForExit(timeout: .seconds(30)) }
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stderr.contains("TLS: certificate and key reloaded"), "\(result.stderr)")
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
