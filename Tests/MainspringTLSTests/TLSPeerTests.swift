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

/// Mainspring's TLS against other implementations — `openssl s_client`, Python's `ssl`,
/// testssl.sh — and what a peer sees when the other end leaves or a reply is large (the
/// library against itself, configurations and bad input are TLSTests.swift).
@Suite("TLS against other implementations: openssl, Python's ssl, testssl.sh; peers that leave; direct writes", .serialized,
       .enabled(if: hasOpenSSL, "the openssl command is not installed (Debian: apt-get install openssl)"))
struct TLSPeerTests {
    @Test("TLS on a Unix path: openssl s_client -unix gets the echo over a verified session")
    func unixPath() async throws {
        let certs = try #require(certificates)
        let path = NSTemporaryDirectory() + "mainspring-tls-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        let configuration = TLSServerConfiguration(
            certificates: [TLSCertificate(certificateFile: certs.serverCertificate, keyFile: certs.serverKey)])
        let server = try await TLSEchoServer(configuration: configuration, endpoint: .unix(path: path))
        let result = try await runProgram("openssl", arguments: [
            "s_client", "-unix", path, "-servername", "localhost", "-CAfile", certs.caCertificate,
            "-verify_return_error", "-verify_hostname", "localhost", "-quiet",
        ], stdin: "over a unix socket\nquit\n", timeout: .seconds(30))
        #expect(result.stdout.contains("echo: over a unix socket"), "\(result.summary)")
        #expect(server.sessions.value.first?.peerCertificate == nil && server.sessions.value.count == 1)
        await server.stop()
        #expect(!FileManager.default.fileExists(atPath: path), "the socket file goes with the listener")
    }

    @Test("openssl s_client against a Mainspring server: protocol, ALPN, verification with the CA, SNI choosing the certificate")
    func sClient() async throws {
        let certs = try #require(certificates)
        let configuration = TLSServerConfiguration(
            certificates: [TLSCertificate(certificateFile: certs.serverCertificate, keyFile: certs.serverKey),
                           TLSCertificate(certificateFile: certs.otherHostCertificate, keyFile: certs.otherHostKey,
                                          serverNames: ["elsewhere.example"])],
            applicationProtocols: ["mainspring/1"])
        let server = try await TLSEchoServer(configuration: configuration)
        let port = server.port
        let plain = try await runProgram("openssl", arguments: [
            "s_client", "-connect", "127.0.0.1:\(port)", "-servername", "localhost", "-CAfile", certs.caCertificate,
            "-verify_return_error", "-alpn", "mainspring/1", "-verify_hostname", "localhost", "-quiet",
        ], stdin: "hello from s_client\nquit\n", timeout: .seconds(30))
        #expect(plain.stdout.contains("echo: hello from s_client"), "\(plain.summary)")
        let details = try await runProgram("openssl", arguments: [
            "s_client", "-connect", "127.0.0.1:\(port)", "-servername", "elsewhere.example", "-CAfile", certs.caCertificate,
            "-alpn", "mainspring/1",
        ], stdin: "", timeout: .seconds(30))
        let output = details.stdout + details.stderr
        #expect(output.contains("TLSv1.3"), "\(output)")
        #expect(output.contains("CN = elsewhere.example") || output.contains("CN=elsewhere.example"),
                "SNI picked the second certificate: \(output)")
        #expect(output.contains("ALPN protocol: mainspring/1"), "ALPN: \(output)")
        #expect(output.contains("Verify return code: 0 (ok)"), "verified with the CA: \(output)")
        await server.stop()
    }

    @Test("close() sends close_notify: Python's ssl module sees a clean end, not an unexpected EOF")
    func closeNotify() async throws {
        let certs = try #require(certificates)
        let group = try EventLoopGroup(loopCount: 1)
        let context = try TLSServerContext(configuration: serverConfiguration(certs))
        let loop = group.loops[0]
        let port = try await loop.submit {
            let listener = try Listener(.tcp(), on: loop, tls: context) { connection in
                connection.writeLine("bye")
                connection.close()
            }
            return listener.port
        }
        let script = """
        import socket, ssl, sys
        context = ssl.create_default_context(cafile=sys.argv[2])
        with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as raw:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                data = b""
                try:
                    while True:
                        chunk = tls.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    print("clean", data.decode().strip())
                except ssl.SSLEOFError:
                    print("unexpected EOF", data.decode().strip())
        """
        let result = try await runProgram("python3", arguments: ["-c", script, "\(port)", certs.caCertificate], timeout: .seconds(30))
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "clean bye", "\(result.summary)")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a peer that leaves mid-stream reads the same over TLS as over plain TCP (closed without close_notify: the end of input; reset: ECONNRESET); mid-handshake: the error in words, never OpenSSL's 'reason(N)'")
    func peerLeavesErrorsInWords() async throws {
        let certs = try #require(certificates)
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let context = try TLSServerContext(configuration: serverConfiguration(certs, handshakeTimeout: .seconds(30)))
        // What each server saw: its line events' end, then the close reason. At the end of the
        // input it closes the connection itself, as a line service does.
        let seen = Locked<[String]>([])
        let serve: @Sendable (Connection) -> Void = { connection in
            connection.onClose { reason in seen.withLock { $0.append("close: \(reason)") } }
            connection.readLines { event in
                switch event {
                case .line: connection.writeLine("ok")
                case .endOfFile:
                    seen.withLock { $0.append("end of input") }
                    connection.close()
                default: break
                }
            }
        }
        let (plainPort, port) = try await loop.submit {
            (try Listener(.tcp(), on: loop, accept: serve).port, try Listener(.tcp(), on: loop, tls: context, accept: serve).port)
        }
        // A client that talks, reads the answer (and the TLS 1.3 session tickets before it: unread,
        // they would make the close a reset), then closes its socket without close_notify — or,
        // with SO_LINGER 0, resets it; or one that sends the start of a ClientHello and closes.
        let script = """
        import os, socket, ssl, struct, sys
        port, cafile, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        sock = socket.create_connection(("127.0.0.1", port))
        if mode == "mid-handshake":
            sock.sendall(bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]))
        else:
            if sys.argv[4] == "tls":
                sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname="localhost")
            sock.sendall(b"hello\\n")
            data = b""
            while not data.endswith(b"ok\\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            if mode == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        os.close(sock.fileno())
        os._exit(0)
        """
        for (mode, expected) in [("no close_notify", ["end of input", "close: closed"]),
                                 ("reset", ["close: \(Connection.CloseReason.error(ECONNRESET))"])]
        {
            for (transport, target) in [("plain", plainPort), ("tls", port)] {
                seen.withLock { $0 = [] }
                let result = try await runProgram("python3", arguments: ["-c", script, "\(target)", certs.caCertificate, mode, transport],
                                                  timeout: .seconds(30))
                #expect(result.status == 0, "\(mode) \(transport): \(result.summary)")
                #expect(await eventually { seen.value.contains { $0.hasPrefix("close:") } },
                        "\(mode) \(transport): the server's connection never closed")
                #expect(seen.value == expected, "\(mode) over \(transport)")
            }
        }
        let result = try await runProgram("python3", arguments: ["-c", script, "\(port)", certs.caCertificate, "mid-handshake", "tls"],
                                          timeout: .seconds(30))
        #expect(result.status == 0, "mid-handshake: \(result.summary)")
        #expect(await eventually { context.statistics.failedHandshakes >= 1 }, "the half handshake was never counted")
        #expect(context.statistics.lastFailure == "the peer closed the connection during the handshake")

        // The client's side: a server that reads the ClientHello and closes.
        let server = """
        import os, socket, sys
        with socket.create_server(("127.0.0.1", 0)) as listener:
            print(listener.getsockname()[1], flush=True)
            raw, _ = listener.accept()
            head = b""
            while len(head) < 5:
                head += raw.recv(5 - len(head))
            body = 0
            while body < int.from_bytes(head[3:5], "big"):
                body += len(raw.recv(int.from_bytes(head[3:5], "big") - body))
            os.close(raw.detach())
        """
        let python = try startProgram("/usr/bin/python3", arguments: ["-c", server])
        defer { python.send(SIGKILL) }
        let serverPort = try #require(await python.readLine(timeout: .seconds(30)).flatMap { UInt16($0) }, "python printed no port")
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        do {
            let connection = try await Connection.connect(to: "127.0.0.1", port: serverPort, on: loop, tls: client)
            connection.close()
            Issue.record("a server that said nothing was connected to")
        } catch {
            #expect(!"\(error)".contains("reason("), "\(error)")
            #expect("\(error)" == "TLS handshake failed: the peer closed the connection during the handshake")
        }
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("replies go straight to the socket (one SSL_write) while nothing waits in libevent's buffer: a 32 MB reply the socket cannot take is finished from that buffer, the lines behind it follow in order, the next reply goes straight out again; a reset in the middle closes with ECONNRESET (or EPIPE), as over plain TCP")
    func directWrites() async throws {
        let certs = try #require(certificates)
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let context = try TLSServerContext(configuration: serverConfiguration(certs))
        let reasons = Locked<[String]>([])
        let port = try await loop.submit {
            let listener = try Listener(.tcp(), on: loop, tls: context) { connection in
                connection.onClose { reason in reasons.withLock { $0.append("\(reason)") } }
                connection.readLines { event in
                    if case .endOfFile = event { connection.close() }
                    guard case .line(let text) = event else { return }
                    if text.hasPrefix("blob "), let count = Int(text.dropFirst(5)) {
                        // Bytes 0, 1, … 250, 0, 1, … (Python makes the same to compare).
                        let cycle = (0..<251).map { UInt8($0) }
                        var blob: [UInt8] = []
                        blob.reserveCapacity(count)
                        while blob.count + cycle.count <= count { blob += cycle }
                        blob += cycle.prefix(count - blob.count)
                        connection.write(blob)
                        connection.writeLine("")
                    } else if text.hasPrefix("line ") {
                        connection.writeLine(String(text.dropFirst(5)))
                    }
                }
            }
            return listener.port
        }
        // The client asks for the blob and a line behind it, then does not read for half a
        // second: the server's first write fills the socket and blocks mid-record. Then it
        // reads and checks everything and asks for one more line — or resets the connection.
        let script = """
        import os, socket, ssl, struct, sys, time
        port, cafile, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        size = 32 * 1024 * 1024
        sock = ssl.create_default_context(cafile=cafile).wrap_socket(
            socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
        sock.sendall(b"blob %d\\nline after\\n" % size)
        time.sleep(0.5)
        if mode == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            os.close(sock.fileno())
            os._exit(0)
        tail = b"\\nafter\\n"
        data = bytearray()
        while len(data) < size + len(tail):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        expected = bytes(range(251)) * (size // 251) + bytes(range(size % 251))
        sock.sendall(b"line again\\n")
        rest = b""
        while not rest.endswith(b"\\n"):
            chunk = sock.recv(100)
            if not chunk:
                break
            rest += chunk
        if data[:size] == expected and data[size:] == tail and rest == b"again\\n":
            print("ok")
        else:
            print("bad", len(data), data[size:size + 20], rest)
        """
        let result = try await runProgram("python3", arguments: ["-c", script, "\(port)", certs.caCertificate, "read"],
                                          timeout: .seconds(60))
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "\(result.summary)")

        #expect(await eventually { reasons.value.count == 1 }, "the first connection never closed")
        let reset = try await runProgram("python3", arguments: ["-c", script, "\(port)", certs.caCertificate, "reset"],
                                         timeout: .seconds(60))
        #expect(reset.status == 0, "\(reset.summary)")
        #expect(await eventually { reasons.value.count == 2 }, "the server's connection never closed after the reset")
        let reason = reasons.value.last ?? ""
        #expect(!reason.contains("reason("), "\(reason)")
        #expect(reason == "\(Connection.CloseReason.error(ECONNRESET))" || reason == "\(Connection.CloseReason.error(EPIPE))",
                "a reset reads as it does over plain TCP: \(reason)")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("TLS 1.2 offers AEAD suites with forward secrecy only: openssl s_client with a CBC suite is refused, with AES-GCM or ChaCha20 served; .insecureLegacyCompatibility offers CBC again")
    func cipherPolicy() async throws {
        let certs = try #require(certificates)
        /// Whether `openssl s_client -tls1_2 -cipher <cipher>` agrees on `cipher`.
        func agrees(on cipher: String, port: UInt16) async throws -> (Bool, String) {
            let result = try await runProgram("openssl", arguments: [
                "s_client", "-connect", "127.0.0.1:\(port)", "-servername", "localhost", "-CAfile", certs.caCertificate,
                "-tls1_2", "-cipher", cipher,
            ], stdin: "", timeout: .seconds(30))
            let output = result.stdout + result.stderr
            return (result.status == 0 && output.contains("Cipher is \(cipher)"), output)
        }
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs))
        #expect(server.context.configuration.cipherPolicy == .intermediate)
        // The test certificates are EC: the ECDSA suites are the ones a key can sign for.
        for cipher in ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305"] {
            let (agreed, output) = try await agrees(on: cipher, port: server.port)
            #expect(agreed, "\(cipher) was refused: \(output)")
        }
        // CBC: with ECDHE (Lucky Thirteen) and with RSA key exchange (no forward secrecy either).
        for cipher in ["ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384", "AES128-SHA"] {
            let (agreed, output) = try await agrees(on: cipher, port: server.port)
            #expect(!agreed, "\(cipher) was agreed: \(output)")
        }
        #expect(server.context.statistics.lastFailure == "handshake failed: no shared cipher")
        await server.stop()
        var legacy = serverConfiguration(certs)
        legacy.cipherPolicy = .insecureLegacyCompatibility
        let old = try await TLSEchoServer(configuration: legacy)
        let (agreed, output) = try await agrees(on: "ECDHE-ECDSA-AES128-SHA", port: old.port)
        #expect(agreed, "the legacy policy refused a CBC suite: \(output)")
        await old.stop()
    }

    @Test("testssl.sh: no finding of LOW severity or above against a Mainspring TLS listener's protocols, ciphers and vulnerabilities",
          .enabled(if: testssl != nil, "testssl.sh is not installed (Debian: apt-get install testssl.sh; `make test-tools` installs it)"))
    func testsslScan() async throws {
        let certs = try #require(certificates)
        let tool = try #require(testssl)
        // A TLS listener (the line protocol), not an HTTPServer: see the note on HTTPS below.
        let server = try await TLSEchoServer(configuration: serverConfiguration(certs))
        let json = uniqueTestPath("testssl") + ".json"
        defer { try? FileManager.default.removeItem(atPath: json) }
        // -p protocols, -s cipher categories, -U every vulnerability check; no DNS (a local address).
        let result = try await runProgram(tool, arguments: [
            "--quiet", "--color", "0", "--warnings", "off", "--nodns", "none", "--jsonfile", json,
            "-p", "-s", "-U", "127.0.0.1:\(server.port)",
        ], timeout: .seconds(600))
        await server.stop()
        #expect(!result.timedOut, "\(result.summary)")
        let data = try #require(FileManager.default.contents(atPath: json), "no JSON: \(result.summary)")
        let findings = try #require(try JSONSerialization.jsonObject(with: data) as? [[String: Any]])
        let ids = Set(findings.compactMap { $0["id"] as? String })
        #expect(ids.isSuperset(of: ["TLS1_2", "cipherlist_AVERAGE", "LUCKY13", "SWEET32", "BEAST"]), "the scan was cut short: \(ids)")
        // Findings the test certificates cause, not the server's configuration — none is expected
        // from -p -s -U, but a testssl.sh that checks more must not fail the test for them:
        // the test CA is in no trust store (cert_chain_of_trust, cert_trust), and a throwaway
        // certificate names no OCSP responder, CRL, CA issuer URL or CT log (cert_ocspURL,
        // OCSP_stapling, cert_crlDistributionPoints, cert_caIssuers,
        // cert_certificateTransparency, cert_mustStapleExtension), and 127.0.0.1 has no CAA
        // record (DNS_CAArecord).
        let certificateCaused = ["cert_chain_of_trust", "cert_trust", "cert_ocspURL", "OCSP_stapling", "cert_crlDistributionPoints",
                                 "cert_caIssuers", "cert_certificateTransparency", "cert_mustStapleExtension", "DNS_CAArecord"]
        let serious = findings.filter { finding in
            guard let id = finding["id"] as? String, let severity = finding["severity"] as? String else { return false }
            if certificateCaused.contains(where: { id.hasPrefix($0) }) { return false }
            return ["LOW", "MEDIUM", "HIGH", "CRITICAL"].contains(severity) || id == "scanProblem"
        }
        let described = serious.map { "\($0["id"] ?? "?") \($0["severity"] ?? "?"): \($0["finding"] ?? "")" }
        #expect(described.isEmpty, "\(described.joined(separator: "\n"))")
    }
    // HTTPS (HTTPServer over MainspringTLS) is not scanned here: it shares the server context, so
    // the same suites, but testssl.sh 3.0.8 reports "pre_128cipher MEDIUM: 128 cipher limit bug"
    // there and cannot tell it is HTTP — its service probe, a TLS 1.3 client that sends its
    // request right behind its Finished, gets no answer from evhttp's OpenSSL bufferevent (one
    // sent half a second later, or over TLS 1.2, does). A defect of the HTTPS layer, open.

    @Test("Python's ssl module as the server: a Mainspring client connects, verifies and talks; a forged record closes it with TLSError.protocolError")
    func pythonServer() async throws {
        let certs = try #require(certificates)
        let script = """
        import os, socket, ssl, sys
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[1], sys.argv[2])
        with socket.create_server(("127.0.0.1", 0)) as server:
            print(server.getsockname()[1], flush=True)
            raw, _ = server.accept()
            with context.wrap_socket(raw, server_side=True) as tls:
                line = tls.recv(4096)
                tls.sendall(b"python says " + line)
                # Then an application-data record that no key made, straight to the socket.
                os.write(tls.fileno(), bytes([0x17, 0x03, 0x03, 0x00, 0x20]) + bytes(32))
                try:
                    tls.recv(4096)
                except (ssl.SSLError, OSError):
                    pass
        """
        let python = try startProgram("/usr/bin/python3", arguments: ["-c", script, certs.serverCertificate, certs.serverKey])
        defer { python.send(SIGKILL) }
        let port = try #require(await python.readLine(timeout: .seconds(30)).flatMap { UInt16($0) }, "python printed no port")
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let client = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let connection = try await Connection.connect(to: "localhost", port: port, on: loop, tls: client)
        #expect(connection.tls?.peerCertificate?.subject == "CN=localhost")
        let (reply, forged) = try await Task(executorPreference: loop) { () async throws -> (LineEvent?, Connection.CloseReason?) in
            try await connection.send(line: "hi")
            defer { connection.close() }
            let reply = try await connection.readLine()
            do throws(Connection.CloseReason) {
                _ = try await connection.readLine()
                return (reply, nil)
            } catch {
                return (reply, error)
            }
        }.value
        #expect(reply == .line("python says hi"))
        // The one TLS error, in the close reason: OpenSSL's account of the record it refused.
        guard case .tlsFailed(.protocolError(let reason))? = forged else {
            Issue.record("the forged record was not a TLS failure: \(String(describing: forged))")
            return
        }
        #expect(reason.contains("bad record mac") || reason.contains("decrypt"), "\(reason)")
        #expect(await connection.closed == forged)
        #expect(forged?.description == "TLS: \(reason)")
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
