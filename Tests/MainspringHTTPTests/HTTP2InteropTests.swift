import Foundation
import Mainspring
import MainspringHTTP
import MainspringTLS
import MainspringTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A server with HTTP/2 beside HTTP/1.1 on one loop, with routes that show what a handler sees.
private final class HTTP2TestServer: @unchecked Sendable {
    let group: EventLoopGroup
    let server: HTTPServer
    var base: String { "http://127.0.0.1:\(server.port)" }

    init(configuration: HTTPServer.Configuration = .init(), tls: TLSServerContext? = nil) async throws {
        group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        routes.get("/version") { request in
            .text("\(request.version) host=\(request.headers["Host"] ?? "-") ua=\(request.headers["user-agent"] != nil)\n")
        }
        routes.post("/echo") { request in HTTPResponse(status: 201, headers: ["X-Length": "\(request.body.count)"], body: request.body) }
        routes.get("/big") { request in
            let size = Int(request.query("bytes") ?? "") ?? 0
            return HTTPResponse(headers: ["Content-Type": "application/octet-stream"],
                                body: (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        }
        routes.get("/query") { request in .text(request.queryItems.map { "\($0.name)=\($0.value)" }.joined(separator: "&") + "\n") }
        routes.on([.get], "/count", streaming: { request, writer in
            writer.start(headers: ["Content-Type": "text/plain", "Connection": "keep-alive"])
            for line in 1...5 { writer.write("line \(line)\n") }
            writer.finish()
        })
        routes.get("/later") { request async throws in
            try await request.loop.sleep(for: .milliseconds(20))
            return .text("later\n")
        }
        if let tls {
            server = try await HTTPServer(group: group, configuration: configuration, routes: routes, tls: tls)
        } else {
            server = try await HTTPServer(group: group, configuration: configuration, routes: routes)
        }
    }

    func stop() {
        server.close()
        group.shutdownBlocking(gracePeriod: .seconds(2))
    }
}

private func curl(_ arguments: [String]) async throws -> FixtureResult {
    try await runProgram("curl", arguments: ["-sS"] + arguments, timeout: .seconds(30))
}

private func hasProgram(_ name: String) -> Bool {
    ["/usr/bin/", "/usr/sbin/", "/usr/local/bin/"].contains { FileManager.default.isExecutableFile(atPath: $0 + name) }
}

@Suite("HTTP/2 with real peers (curl, nghttp, h2load)", .serialized)
struct HTTP2InteropTests {
    @Test("h2c with prior knowledge: curl's requests get the handlers' answers over HTTP/2")
    func priorKnowledge() async throws {
        let server = try await HTTP2TestServer()
        defer { server.stop() }
        // One URL per curl: curl 7.88 fails a second request on a prior-knowledge connection it
        // reuses (against nghttpd too); nghttp below reuses one connection.
        let expected: [(String, String)] = [
            ("/hello", "hello\n[2 200]"),
            ("/version", "HTTP/2 host=127.0.0.1:\(server.server.port) ua=true\n[2 200]"),
            ("/query?a=1&b=x%20y", "a=1&b=x y\n[2 200]"),
            ("/missing", "Not Found\n[2 404]"),
            ("/count", "line 1\nline 2\nline 3\nline 4\nline 5\n[2 200]"),
            ("/later", "later\n[2 200]"),
        ]
        for (path, answer) in expected {
            let result = try await curl(["--http2-prior-knowledge", "-w", "[%{http_version} %{response_code}]",
                                         server.base + path])
            #expect(result.status == 0, "\(path): \(result.summary)")
            #expect(result.stdout == answer, "\(path)")
        }
    }

    @Test("nghttp sends its requests side by side on one connection; the server's SETTINGS announce its limits")
    func oneConnection() async throws {
        guard hasProgram("nghttp") else { return }
        var configuration = HTTPServer.Configuration()
        configuration.http2?.maxConcurrentStreams = 7
        let server = try await HTTP2TestServer(configuration: configuration)
        defer { server.stop() }
        let result = try await runProgram("nghttp", arguments: ["-v", "\(server.base)/hello", "\(server.base)/later",
                                                                "\(server.base)/count"], timeout: .seconds(30))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stdout.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):7]"), "\(result.stdout)")
        #expect(result.stdout.contains("[SETTINGS_MAX_HEADER_LIST_SIZE(0x06):8192]"))
        #expect(result.stdout.contains("hello\n"))
        #expect(result.stdout.contains("later\n"))
        #expect(result.stdout.contains("line 5\n"))
        #expect(server.server.statistics.snapshot.connectionsAccepted == 1)
        #expect(server.server.statistics.snapshot.responses["2xx"] == 3)
    }

    @Test("h2c: a POST body is read in full, HEAD sends no body, a 1 MiB answer passes the flow-control windows")
    func bodiesBothWays() async throws {
        let server = try await HTTP2TestServer()
        defer { server.stop() }
        let payload = String(repeating: "0123456789abcdef", count: 20_000)  // 320 KB: many windows' worth
        let file = uniqueTestPath("h2-body")
        try payload.write(toFile: file, atomically: false, encoding: .utf8)
        defer { unlink(file) }
        let posted = try await curl(["--http2-prior-knowledge", "-D", "-", "--data-binary", "@" + file, "\(server.base)/echo"])
        #expect(posted.status == 0, "\(posted.summary)")
        #expect(posted.stdout.hasPrefix("HTTP/2 201"), "\(posted.stdout.prefix(200))")
        #expect(posted.stdout.contains("x-length: 320000"))
        #expect(posted.stdout.hasSuffix(payload))
        let head = try await curl(["--http2-prior-knowledge", "-I", "\(server.base)/hello"])
        #expect(head.stdout.hasPrefix("HTTP/2 200"), "\(head.summary)")
        #expect(head.stdout.contains("content-length: 6"))
        let big = try await curl(["--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{size_download} %{http_version}",
                                  "\(server.base)/big?bytes=1048576"])
        #expect(big.stdout == "1048576 2", "\(big.summary)")
    }

    @Test("a body over maxBodyBytes is answered 413 on its stream")
    func bodyTooLarge() async throws {
        var configuration = HTTPServer.Configuration()
        configuration.maxBodyBytes = 1_000
        let server = try await HTTP2TestServer(configuration: configuration)
        defer { server.stop() }
        let result = try await curl(["--http2-prior-knowledge", "-w", "[%{response_code}]",
                                     "--data-binary", String(repeating: "x", count: 5_000), "\(server.base)/echo"])
        #expect(result.stdout == "request body larger than 1000 bytes\n[413]", "\(result.summary)")
    }

    @Test("over TLS, ALPN picks h2 for a client that offers it and HTTP/1.1 for one that does not")
    func alpn() async throws {
        guard let certificates = TestCertificates.shared else { return }
        let context = try TLSServerContext(configuration: TLSServerConfiguration(
            certificates: [TLSCertificate(certificateFile: certificates.serverCertificate, keyFile: certificates.serverKey)],
            applicationProtocols: ["h2", "http/1.1"]))
        let server = try await HTTP2TestServer(tls: context)
        defer { server.stop() }
        let url = "https://localhost:\(server.server.port)/version"
        let h2 = try await curl(["--http2", "--cacert", certificates.caCertificate, url])
        #expect(h2.stdout == "HTTP/2 host=localhost:\(server.server.port) ua=true\n", "\(h2.summary)")
        let h1 = try await curl(["--http1.1", "--cacert", certificates.caCertificate, url])
        #expect(h1.stdout == "HTTP/1.1 host=localhost:\(server.server.port) ua=true\n", "\(h1.summary)")
    }

    @Test("with http2 nil the server speaks HTTP/1.1 only: HTTP/2's preface is a bad request")
    func disabled() async throws {
        var configuration = HTTPServer.Configuration()
        configuration.http2 = nil
        let server = try await HTTP2TestServer(configuration: configuration)
        defer { server.stop() }
        let refused = try await curl(["--http2-prior-knowledge", "\(server.base)/hello"])
        #expect(refused.status != 0, "\(refused.summary)")
        let plain = try await curl(["\(server.base)/hello"])
        #expect(plain.stdout == "hello\n")
    }

    @Test("h2load: 4 connections × 16 streams, 4,000 requests, every one answered 200")
    func load() async throws {
        guard hasProgram("h2load") else { return }
        let server = try await HTTP2TestServer()
        defer { server.stop() }
        let result = try await runProgram("h2load", arguments: ["-n", "4000", "-c", "4", "-m", "16", "\(server.base)/hello"],
                                          timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stdout.contains("4000 succeeded, 0 failed, 0 errored"), "\(result.stdout)")
        #expect(result.stdout.contains("status codes: 4000 2xx"))
        #expect(server.server.statistics.snapshot.responses["2xx"] == 4000)
    }

    @Test("the client speaks h2c with prior knowledge to nghttpd: files, a missing one, several requests on one connection")
    func clientAgainstNghttpd() async throws {
        guard hasProgram("nghttpd") else { return }
        let folder = uniqueTestPath("nghttpd-www")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try "hello from nghttpd\n".write(toFile: folder + "/hello", atomically: true, encoding: .utf8)
        let big = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        try Data(big).write(to: URL(fileURLWithPath: folder + "/big"))
        // nghttpd cannot pick a free port: ports below the ephemeral range until one serves.
        var port: UInt16 = 0
        var peer: ChildProcess?
        for _ in 0..<20 {
            let candidate = UInt16.random(in: 20_000...29_999)
            let started = try startProgram("/usr/sbin/nghttpd", arguments: ["--no-tls", "-a", "127.0.0.1", "-d", folder, String(candidate)])
            if await eventually(timeout: .seconds(2), { (try? TestClient(port: candidate)) != nil }) {
                port = candidate
                peer = started
                break
            }
            started.send(SIGKILL)
        }
        let nghttpd = try #require(peer, "nghttpd did not start")
        defer { nghttpd.send(SIGKILL) }
        let group = try EventLoopGroup(loopCount: 1)
        defer { group.shutdownBlocking(gracePeriod: .seconds(1)) }
        var configuration = HTTPClient.Configuration()
        configuration.http2PriorKnowledge = true
        let client = HTTPClient(loop: group.loops[0], configuration: configuration)
        defer { client.shutdown() }
        let base = "http://127.0.0.1:\(port)"
        let hello = try await client.get(base + "/hello")
        #expect(hello.status == 200 && hello.text == "hello from nghttpd\n")
        #expect(hello.headers["server"]?.hasPrefix("nghttpd") == true, "\(hello.headers)")
        let missing = try await client.get(base + "/missing")
        #expect(missing.status == 404)
        let many = try await withThrowingTaskGroup(of: [UInt8].self) { tasks in
            for _ in 0..<8 { tasks.addTask { try await client.get(base + "/big").body } }
            return try await tasks.reduce(into: [[UInt8]]()) { $0.append($1) }
        }
        #expect(many.count == 8 && many.allSatisfy { $0 == big })
    }

    @Test("the client and server agree on h2 by ALPN over TLS; a client that offers only http/1.1 gets HTTP/1.1")
    func clientALPN() async throws {
        guard let certificates = TestCertificates.shared else { return }
        let context = try TLSServerContext(configuration: TLSServerConfiguration(
            certificates: [TLSCertificate(certificateFile: certificates.serverCertificate, keyFile: certificates.serverKey)],
            applicationProtocols: ["h2", "http/1.1"]))
        let server = try await HTTP2TestServer(tls: context)
        defer { server.stop() }
        let group = try EventLoopGroup(loopCount: 1)
        defer { group.shutdownBlocking(gracePeriod: .seconds(1)) }
        func client(offering protocols: [String]) throws -> HTTPClient {
            let tls = try TLSClientContext(configuration: .init(trustRoots: .file(certificates.caCertificate),
                                                                applicationProtocols: protocols))
            return HTTPClient(loop: group.loops[0], configuration: .init(secureConnector: .tls(tls)))
        }
        let url = "https://localhost:\(server.server.port)/version"
        let h2 = try client(offering: ["h2", "http/1.1"])
        defer { h2.shutdown() }
        let answers = try await withThrowingTaskGroup(of: String.self) { tasks in
            for _ in 0..<4 { tasks.addTask { try await h2.get(url).text } }
            return try await tasks.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(answers == Array(repeating: "HTTP/2 host=localhost:\(server.server.port) ua=true\n", count: 4))
        let h1 = try client(offering: ["http/1.1"])
        defer { h1.shutdown() }
        #expect(try await h1.get(url).text == "HTTP/1.1 host=localhost:\(server.server.port) ua=true\n")
    }
}
