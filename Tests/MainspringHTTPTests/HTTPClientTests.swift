import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringCore
@testable import MainspringHTTP
import MainspringTLS
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("HTTP client", .serialized)
struct HTTPClientTests {
    /// An HTTPServer of a one-loop group with the routes the tests use, and a client on another loop.
    final class Fixture: @unchecked Sendable {
        let group: EventLoopGroup
        let server: HTTPServer
        var base: String { "http://127.0.0.1:\(server.port)" }

        init() async throws {
            group = try EventLoopGroup(loopCount: 2)
            var routes = HTTPRoutes()
            routes.on([.get, .post, .put, .delete], "/echo") { request in
                .text("\(request.method) \(request.text) \(request.headers["x-test"] ?? "-")", headers: ["X-Reply": "yes"])
            }
            routes.get("/hello") { _ in .text("hello\n") }
            routes.get("/peer") { request in .text(request.remoteAddress) }
            routes.get("/slow-peer") { request async throws in
                try await request.loop.sleep(for: .milliseconds(100))
                return .text(request.remoteAddress)
            }
            routes.get("/big") { _ in HTTPResponse(body: [UInt8](repeating: 120, count: 1 << 20)) }
            routes.on([.get], "/count", streaming: { _, writer in
                for index in 0..<100 { writer.write("line \(index)\n") }
                writer.finish()
            })
            routes.get("/a") { _ in .status(302, headers: ["Location": "/b"]) }
            routes.get("/b") { _ in .text("final") }
            routes.get("/loop") { _ in .status(301, headers: ["Location": "/loop"]) }
            routes.post("/see-other") { _ in .status(303, headers: ["Location": "/echo"]) }
            server = try await HTTPServer(loop: group.loops[0], routes: routes)
        }

        let clients = Locked<[HTTPClient]>([])

        func client(_ configuration: HTTPClient.Configuration = .init()) -> HTTPClient {
            let client = HTTPClient(loop: group.loops[1], configuration: configuration)
            clients.withLock { $0.append(client) }
            return client
        }

        func stop() async {
            for client in clients.value { client.shutdown() }
            await server.closeAndWait()
            await group.shutdown(gracePeriod: .seconds(2))
        }
    }

    @Test("GET, POST, PUT, DELETE, HEAD with headers and a body: status, headers, body")
    func methods() async throws {
        let fixture = try await Fixture()
        let client = fixture.client()
        let get = try await client.get(fixture.base + "/echo", headers: ["X-Test": "one"])
        #expect(get.status == 200 && get.reason == "OK")
        #expect(get.text == "GET  one" && get.headers["x-reply"] == "yes")
        #expect(try await client.post(fixture.base + "/echo", body: Array("posted".utf8)).text == "POST posted -")
        #expect(try await client.put(fixture.base + "/echo", headers: ["X-Test": "2"], body: Array("put".utf8)).text
            == "PUT put 2")
        #expect(try await client.delete(fixture.base + "/echo").text == "DELETE  -")
        let head = try await client.head(fixture.base + "/hello")
        #expect(head.status == 200 && head.body.isEmpty && head.headers["content-length"] == "6")
        #expect(try await client.get(fixture.base + "/nowhere").status == 404)
        await fixture.stop()
    }

    @Test("keep-alive: sequential requests reuse one connection; the pool holds at most its maximum")
    func keepAliveAndPool() async throws {
        let fixture = try await Fixture()
        let client = fixture.client()
        var peers = Set<String>()
        for _ in 0..<5 { peers.insert(try await client.get(fixture.base + "/peer").text) }
        #expect(peers.count == 1, "one connection for five requests: \(peers)")
        #expect(client.connectionCount(for: fixture.base) == (busy: 0, idle: 1))

        let limited = fixture.client(.init(maxConnectionsPerHost: 2))
        let answers = try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<8 { group.addTask { try await limited.get(fixture.base + "/slow-peer").text } }
            return try await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(answers.count == 8)
        #expect(Set(answers).count <= 2, "at most two connections: \(Set(answers))")
        let counts = limited.connectionCount(for: fixture.base)
        #expect(counts.busy == 0 && counts.idle <= 2)
        limited.shutdown()
        #expect(await clientError { _ = try await limited.get(fixture.base + "/hello") } == .clientClosed)
        await fixture.stop()
    }

    @Test("chunked responses whole and streamed; the body limit; a streamed body has none")
    func chunkedAndLimits() async throws {
        let fixture = try await Fixture()
        let client = fixture.client(.init(maxBodyBytes: 100_000))
        let counted = try await client.get(fixture.base + "/count")
        #expect(counted.headers["transfer-encoding"]?.lowercased() == "chunked")
        #expect(counted.text == (0..<100).map { "line \($0)\n" }.joined())
        #expect(await clientError { _ = try await client.get(fixture.base + "/big") } == .bodyTooLarge(limit: 100_000))

        let streamed = try await client.stream(HTTPClientRequest(url: fixture.base + "/big"))
        #expect(streamed.status == 200)
        var total = 0
        var pieces = 0
        for try await piece in streamed.body {
            total += piece.count
            pieces += 1
        }
        #expect(total == 1 << 20 && pieces > 1)
        // The connection went back: the next request reuses it.
        #expect(try await client.get(fixture.base + "/hello").text == "hello\n")
        await fixture.stop()
    }

    @Test("redirects only when asked, up to the limit; 303 turns a POST into a GET")
    func redirects() async throws {
        let fixture = try await Fixture()
        let client = fixture.client()
        let unfollowed = try await client.get(fixture.base + "/a")
        #expect(unfollowed.status == 302 && unfollowed.headers["location"] == "/b")
        let followed = try await client.execute(HTTPClientRequest(url: fixture.base + "/a", redirectLimit: 3))
        #expect(followed.status == 200 && followed.text == "final" && followed.url == fixture.base + "/b")
        #expect(await clientError {
            _ = try await client.execute(HTTPClientRequest(url: fixture.base + "/loop", redirectLimit: 3))
        } == .tooManyRedirects(limit: 3))
        let configured = fixture.client(.init(redirectLimit: 2))
        let seeOther = try await configured.post(fixture.base + "/see-other", body: Array("x".utf8))
        #expect(seeOther.text == "GET  -")
        await fixture.stop()
    }

    @Test("errors name what failed: refused, bad URL, scheme, host name")
    func addressErrors() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: group.loops[0])
        let refusing = try RefusingPort()
        let refused = await clientError { _ = try await client.get("http://127.0.0.1:\(refusing.port)/") }
        guard case .connectFailed(let host, let port, _) = refused else {
            Issue.record("\(String(describing: refused))")
            return
        }
        #expect(host == "127.0.0.1" && port == refusing.port)
        #expect(refused?.description.contains("127.0.0.1:\(refusing.port)") == true)
        #expect(await clientError { _ = try await client.get("not a url") } == .invalidURL("not a url"))
        #expect(await clientError { _ = try await client.get("ftp://127.0.0.1/") } == .unsupportedScheme("ftp"))
        #expect(await clientError { _ = try await client.get("https://127.0.0.1/") } == .unsupportedScheme("https"))
        #expect(await clientError { _ = try await client.get("http://example.invalid/") } == .unresolvedHost("example.invalid"))
        await group.shutdown(gracePeriod: .seconds(2))
    }

    /// A refused connect says where and why once each: it read "connect to 127.0.0.1:P
    /// failed: connect 127.0.0.1:P failed: Connection refused", the client's words around the
    /// core's.
    @Test("a refused connect's error names the address and the reason once")
    func refusedConnectSaysItOnce() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: group.loops[0])
        let refusing = try RefusingPort()
        let text = await clientError { _ = try await client.get("http://127.0.0.1:\(refusing.port)/") }?.description ?? ""
        #expect(text == "connect to 127.0.0.1:\(refusing.port) failed: \(String(cString: strerror(ECONNREFUSED))) (errno \(ECONNREFUSED))",
                "\(text)")
        #expect(text.components(separatedBy: "127.0.0.1:\(refusing.port)").count == 2, "\(text)")
        withExtendedLifetime(refusing) {}
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("host names by default: localhost and an /etc/hosts name reach the server; an unknown or stalled name is unresolvedHost; literalsAndLocalhost refuses names")
    func hostNames() async throws {
        let fixture = try await Fixture()
        let client = fixture.client()
        let port = fixture.server.port
        let names = ["localhost"] + (hostsFileName().map { [$0] } ?? [])
        for name in names {
            let base = "http://\(name):\(port)"
            let response = try await client.get(base + "/hello")
            #expect(response.status == 200 && response.text == "hello\n", "\(name)")
            #expect(response.url == base + "/hello")
            // Pooled under the name: the second request reuses the connection.
            let first = try await client.get(base + "/peer").text
            let second = try await client.get(base + "/peer").text
            #expect(first == second, "\(name): one connection for both")
            #expect(client.connectionCount(for: base) == (busy: 0, idle: 1), "\(name)")
        }

        let unknown = await clientError { _ = try await client.get("http://no-such-host.invalid:\(port)/hello") }
        #expect(unknown == .unresolvedHost("no-such-host.invalid"))
        #expect(unknown?.description.contains("\"no-such-host.invalid\"") == true, "\(String(describing: unknown))")
        #expect(client.connectionCount(for: "http://no-such-host.invalid:\(port)/") == (busy: 0, idle: 0))

        // A resolver that never answers: unresolvedHost once the resolve timeout has passed,
        // well before the connect timeout.
        let stalled = "stalled-http-\(getpid()).test"
        let release = DispatchSemaphore(value: 0)
        HostResolver.overrides.withLock { $0[stalled] = { _, _ in release.wait(); return .success([]) } }
        defer {
            release.signal()
            HostResolver.overrides.withLock { $0[stalled] = nil }
        }
        let impatient = fixture.client(.init(connectTimeout: .seconds(60),
                                             connectionOptions: .init(resolveTimeout: .milliseconds(200))))
        let started = ContinuousClock.now
        #expect(await clientError { _ = try await impatient.get("http://\(stalled):\(port)/hello") }
            == .unresolvedHost(stalled))
        #expect(ContinuousClock.now - started < .seconds(30))

        let literalOnly = fixture.client(.init(resolver: .literalsAndLocalhost))
        #expect(try await literalOnly.get("http://localhost:\(port)/hello").text == "hello\n")
        if let name = names.dropFirst().first {
            #expect(await clientError { _ = try await literalOnly.get("http://\(name):\(port)/hello") }
                == .unresolvedHost(name))
        }
        await fixture.stop()
    }

    @Test("against Python's http.server (HTTP/1.0, a connection per request): GET, HEAD, 404, in parallel")
    func pythonServer() async throws {
        let directory = freshDirectory("www")
        try "served by python\n".write(toFile: directory + "/hello.txt", atomically: true, encoding: .utf8)
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        var configuration = Subprocess.Configuration(
            executable: "python3", arguments: ["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", directory])
        configuration.standardError = .null
        let python = try await Subprocess.launch(configuration, on: loop)
        guard case .line(let banner)? = try await python.standardOutput?.readLine(),
              let portText = banner.split(separator: " ").dropFirst(5).first, let port = UInt16(portText)
        else {
            Issue.record("no banner from python's http.server")
            _ = await python.terminate(grace: .seconds(2))
            return
        }
        let client = HTTPClient(loop: loop)
        let base = "http://127.0.0.1:\(port)"
        let answers = try await withThrowingTaskGroup(of: HTTPClientResponse.self) { group in
            for _ in 0..<4 { group.addTask { try await client.get(base + "/hello.txt") } }
            return try await group.reduce(into: [HTTPClientResponse]()) { $0.append($1) }
        }
        #expect(answers.allSatisfy { $0.status == 200 && $0.text == "served by python\n" })
        let head = try await client.head(base + "/hello.txt")
        #expect(head.status == 200 && head.headers["content-length"] == "17" && head.body.isEmpty)
        #expect(try await client.get(base + "/missing").status == 404)
        #expect(await python.terminate(grace: .seconds(5)) == .signaled(SIGTERM))
        client.shutdown()
        await group.shutdown(gracePeriod: .milliseconds(200))  // python's stdout pipe, unread to its end
    }
}
