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

/// A TCP server on 127.0.0.1 that runs `script` for each connection it accepts, each on a
/// thread of its own: for the answers no real server gives (malformed, endless, stalled).
final class ScriptedServer: @unchecked Sendable {
    let port: UInt16
    /// The listening socket while it is open (nil once closed). Whoever closes it does so
    /// under this lock, and `stop()` shuts it down only while it is open: a number closed
    /// twice, or accepted on after its close, may by then be another test's descriptor.
    private let listening: Locked<Int32?>
    private let accepting: Bool
    let accepted = Locked(0)

    init(backlog: Int32 = 64, accepting: Bool = true, _ script: @escaping @Sendable (_ fd: Int32, _ index: Int) -> Void) throws {
        let (fd, boundPort) = try bindLoopbackTCPSocket()
        guard listen(fd, backlog) == 0 else {
            let code = errno
            close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EADDRINUSE)
        }
        listening = Locked(fd)
        self.accepting = accepting
        port = boundPort
        guard accepting else { return }
        let accepted = self.accepted
        let listening = self.listening
        // The accept thread owns the socket's close: `stop()` only shuts it down, which makes
        // accept(2) fail, and the thread closes it as it leaves. Closed by `stop()` instead,
        // the thread's next accept(2) could take a connection meant for another listener.
        let thread = Thread {
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 {
                    if errno == EINTR { continue }
                    listening.withLock { open in
                        if open != nil { close(fd) }
                        open = nil
                    }
                    return
                }
                let index = accepted.withLock { count -> Int in
                    count += 1
                    return count
                }
                let worker = Thread {
                    script(client, index)
                    close(client)
                }
                worker.start()
            }
        }
        thread.start()
    }

    /// Stops accepting: the accept thread ends and closes the socket (a server made with
    /// `accepting: false` closes it here). Idempotent.
    func stop() {
        let accepting = accepting
        listening.withLock { open in
            guard let fd = open else { return }
            if accepting {
                shutdown(fd, Int32(SHUT_RDWR))
            } else {
                close(fd)
                open = nil
            }
        }
    }

    deinit { stop() }
}

/// Reads a request's head (to the blank line) from `fd`; nil when the client closed first.
func readRequestHead(_ fd: Int32) -> String? {
    var head: [UInt8] = []
    var byte: UInt8 = 0
    while !(head.count >= 4 && head.suffix(4) == [13, 10, 13, 10]) {
        guard recv(fd, &byte, 1, 0) == 1 else { return nil }
        head.append(byte)
    }
    return String(decoding: head, as: UTF8.self)
}

/// Writes all of `text` (false when the peer has gone).
@discardableResult
func writeAll(_ fd: Int32, _ text: String) -> Bool {
    var bytes = Array(text.utf8)
    var sent = 0
    while sent < bytes.count {
        let n = bytes[sent...].withUnsafeMutableBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if n <= 0 { return false }
        sent += n
    }
    _ = bytes
    return true
}

/// Fills the accept queue of a server that does not accept (`accepting: false`, backlog 0) with
/// four non-blocking connects, so that the kernel drops the next SYNs: a connect to it is never
/// answered. Returns the fillers' descriptors, to close.
func fillQueue(of server: ScriptedServer) -> [Int32] {
    (0..<4).map { _ in
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        address.sin_port = server.port.bigEndian
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return fd
    }
}

/// A server that reads each request's head, signals `arrived`, and never answers: it waits for
/// the client to close.
func stallingServer(signalling arrived: DispatchSemaphore) throws -> ScriptedServer {
    try ScriptedServer { fd, _ in
        _ = readRequestHead(fd)
        arrived.signal()
        var byte: UInt8 = 0
        _ = recv(fd, &byte, 1, 0)  // until the client closes
    }
}

/// The error `body` throws (nil if none).
func clientError(_ body: () async throws -> Void) async -> HTTPClientError? {
    do {
        try await body()
        return nil
    } catch let error as HTTPClientError {
        return error
    } catch {
        Issue.record("not an HTTPClientError: \(error)")
        return nil
    }
}

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

    @Test("a malformed status line, 100 MB of headers, a body longer than its Content-Length, a server closing mid-body")
    func badServers() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: group.loops[0])
        let malformed = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            writeAll(fd, "HTPP/1.1 200 OK\r\n\r\n")
        }
        #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(malformed.port)/") }
            == .malformedStatusLine("HTPP/1.1 200 OK"))

        let written = Locked(0)
        let endless = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            guard writeAll(fd, "HTTP/1.1 200 OK\r\n") else { return }
            let line = "X-Filler: " + String(repeating: "a", count: 1_000) + "\r\n"
            while written.value < 100 << 20, writeAll(fd, line) { written.withLock { $0 += line.utf8.count } }
        }
        #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(endless.port)/") }
            == .headersTooLarge(limit: 65_536))
        #expect(written.value < 20 << 20, "refused at the limit, not read to the end: \(written.value) bytes written")

        let longer = try ScriptedServer { fd, _ in
            while readRequestHead(fd) != nil {
                writeAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA-BYTES")
            }
        }
        let url = "http://127.0.0.1:\(longer.port)/"
        #expect(try await client.get(url).text == "hello")
        #expect(try await client.get(url).text == "hello")
        #expect(longer.accepted.value == 2, "the connection with bytes after its response was not reused")

        let partial = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            writeAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        }
        #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(partial.port)/") }
            == .closedMidResponse("7 body bytes of 100"))

        let chunks = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            writeAll(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;name=value\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
            _ = readRequestHead(fd)
            writeAll(fd, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        }
        let chunked = try await client.get("http://127.0.0.1:\(chunks.port)/")
        #expect(chunked.text == "hello world" && chunked.headers["x-trailer"] == "t")
        #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(chunks.port)/") } == .malformedChunk("zz"))
        client.shutdown()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a response head is read by the server's rules for a request head: a control character, a bare CR, folding, whitespace in a name, no colon, Transfer-Encoding beside Content-Length, another coding, lengths that differ or are not numbers are each a clear error")
    func responseHeadsReadByTheSharedRules() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: group.loops[0])
        let heads: [(String, HTTPClientError)] = [
            ("X-A: a\u{1}b\r\nContent-Length: 0\r\n", .malformedHeader("X-A: a\u{1}b")),
            ("X-A: a\rb\r\nContent-Length: 0\r\n", .malformedHeader("X-A: a\rb")),
            ("X-A: a\r\n b\r\nContent-Length: 0\r\n", .malformedHeader(" b")),
            ("X A: a\r\nContent-Length: 0\r\n", .malformedHeader("X A: a")),
            ("no colon\r\nContent-Length: 0\r\n", .malformedHeader("no colon")),
            ("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", .malformedHeader("Transfer-Encoding beside Content-Length")),
            ("Transfer-Encoding: gzip, chunked\r\n", .malformedHeader("Transfer-Encoding: gzip, chunked (only chunked is read)")),
            ("Content-Length: 5\r\nContent-Length: 6\r\n", .invalidContentLength("two Content-Length fields with different values")),
            ("Content-Length: +5\r\n", .invalidContentLength("+5")),
            ("Content-Length: 5, 5\r\n", .invalidContentLength("5, 5")),
        ]
        for (fields, expected) in heads {
            let server = try ScriptedServer { fd, _ in
                _ = readRequestHead(fd)
                writeAll(fd, "HTTP/1.1 200 OK\r\n" + fields + "\r\nhello")
            }
            #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(server.port)/") } == expected,
                    "\(fields.debugDescription)")
        }
        let fine = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            writeAll(fd, "HTTP/1.1 200 OK\r\nContent-Length:\t5 \r\nContent-Length: 5\r\nX-Empty:\r\n\r\nhello")
        }
        let response = try await client.get("http://127.0.0.1:\(fine.port)/")
        #expect(response.text == "hello" && response.headers["x-empty"] == "")
        client.shutdown()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("timeouts: a server that stalls forever, a connect that is never answered")
    func timeouts() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: group.loops[0], configuration: .init(connectTimeout: .milliseconds(300),
                                                                            responseTimeout: .milliseconds(300)))
        let stalling = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            var byte: UInt8 = 0
            _ = recv(fd, &byte, 1, 0)  // until the client closes
        }
        var started = ContinuousClock.now
        #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(stalling.port)/") }
            == .responseTimeout(.milliseconds(300)))
        var waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(290) && waited < .seconds(10), "\(waited)")

        // A listener that never accepts, its queue filled: the kernel drops further SYNs.
        let full = try ScriptedServer(backlog: 0, accepting: false) { _, _ in }
        let fillers = fillQueue(of: full)
        try await Task.sleep(for: .milliseconds(100))  // the fillers' handshakes (loopback: microseconds)
        started = ContinuousClock.now
        let error = await clientError { _ = try await client.get("http://127.0.0.1:\(full.port)/") }
        waited = ContinuousClock.now - started
        #expect(error == HTTPClientError.connectTimeout(host: "127.0.0.1", port: full.port, .milliseconds(300)))
        #expect(waited >= .milliseconds(290) && waited < .seconds(10), "\(waited)")
        for fd in fillers { close(fd) }
        client.shutdown()
        await group.shutdown(gracePeriod: .milliseconds(200))  // the abandoned connect is still trying
    }

    @Test("endless 100 Continues fail (the count and the head's byte limit); up to the limit they are skipped")
    func endlessInterimResponses() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        // (The response timeout over a head trickled a line at a time is a virtual-time test:
        // HTTPClientSimulationTests.)

        // Interim responses without end: at most maxInterimResponses (10 by default) of them, and
        // they count against the head's byte limit too (the timeout is long here).
        let patient = HTTPClient(loop: group.loops[0], configuration: .init(responseTimeout: .seconds(120),
                                                                             maxHeaderBytes: 4_096))
        let interim = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            for _ in 0..<100_000 {
                guard writeAll(fd, "HTTP/1.1 100 Continue\r\n\r\n") else { return }
            }
        }
        #expect(await clientError { _ = try await patient.get("http://127.0.0.1:\(interim.port)/") }
            == .tooManyInterimResponses(limit: 10))
        let tolerant = HTTPClient(loop: group.loops[0], configuration: .init(responseTimeout: .seconds(120),
                                                                              maxHeaderBytes: 4_096,
                                                                              maxInterimResponses: 1_000_000))
        #expect(await clientError { _ = try await tolerant.get("http://127.0.0.1:\(interim.port)/") }
            == .headersTooLarge(limit: 4_096))
        // Up to the limit they are skipped: ten of them, then the response.
        let hinting = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            writeAll(fd, String(repeating: "HTTP/1.1 100 Continue\r\n\r\n", count: 8)
                + "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        }
        let hinted = try await patient.get("http://127.0.0.1:\(hinting.port)/")
        #expect(hinted.status == 200 && hinted.text == "ok" && hinted.headers["link"] == nil)
        tolerant.shutdown()
        patient.shutdown()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("shutdown() fails a request in flight at once with clientClosed; shutdown(gracePeriod:) lets one finish, then fails the rest")
    func shutdownInFlight() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        // Requests that reached the server: the server reads the head, says so, then stalls.
        let arrived = DispatchSemaphore(value: 0)
        let stalling = try stallingServer(signalling: arrived)
        let client = HTTPClient(loop: group.loops[0], configuration: .init(responseTimeout: .seconds(120)))
        let inFlight = Task { await clientError { _ = try await client.get("http://127.0.0.1:\(stalling.port)/") } }
        #expect(arrived.wait(timeout: .now() + 30) == .success, "the request reached the server")
        let started = ContinuousClock.now
        client.shutdown()
        #expect(await inFlight.value == .clientClosed)
        #expect(ContinuousClock.now - started < .seconds(30), "not the 120 s response timeout")
        #expect(await clientError { _ = try await client.get("http://127.0.0.1:\(stalling.port)/") } == .clientClosed)

        // Graceful: a response that comes 200 ms later is received; a stalled one fails when the
        // grace period ends.
        let slow = try ScriptedServer { fd, _ in
            _ = readRequestHead(fd)
            arrived.signal()
            usleep(200_000)
            writeAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            var byte: UInt8 = 0
            _ = recv(fd, &byte, 1, 0)
        }
        let patient = HTTPClient(loop: group.loops[0], configuration: .init(responseTimeout: .seconds(120)))
        let finishing = Task { try await patient.get("http://127.0.0.1:\(slow.port)/").text }
        #expect(arrived.wait(timeout: .now() + 30) == .success)
        await patient.shutdown(gracePeriod: .seconds(60))
        #expect(try await finishing.value == "late")
        #expect(await clientError { _ = try await patient.get("http://127.0.0.1:\(slow.port)/") } == .clientClosed)

        let strict = HTTPClient(loop: group.loops[0], configuration: .init(responseTimeout: .seconds(120)))
        let stuck = Task { await clientError { _ = try await strict.get("http://127.0.0.1:\(stalling.port)/") } }
        #expect(arrived.wait(timeout: .now() + 30) == .success)
        let graceStarted = ContinuousClock.now
        await strict.shutdown(gracePeriod: .milliseconds(100))
        #expect(await stuck.value == .clientClosed)
        #expect(ContinuousClock.now - graceStarted < .seconds(30))
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("cancelling the calling task: before the request, in the pool's wait, in the connect, mid-exchange — each .cancelled at once, nothing left half-used")
    func cancellation() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let arrived = DispatchSemaphore(value: 0)
        let stalling = try stallingServer(signalling: arrived)
        let url = "http://127.0.0.1:\(stalling.port)/"
        // Every wait here is far longer than the test: only the cancellation can end them.
        let client = HTTPClient(loop: group.loops[0], configuration: .init(maxConnectionsPerHost: 1,
                                                                            connectTimeout: .seconds(600),
                                                                            responseTimeout: .seconds(600)))

        // Already cancelled: fails before anything is made.
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await clientError { _ = try await client.get(url) }
        }
        #expect(await early.value == .cancelled)
        #expect(stalling.accepted.value == 0 && client.connectionCount(for: url) == (busy: 0, idle: 0))

        // Mid-exchange: the request reached the server, the response never comes.
        let inFlight = Task { await clientError { _ = try await client.get(url) } }
        #expect(arrived.wait(timeout: .now() + 30) == .success, "the request reached the server")
        #expect(client.connectionCount(for: url) == (busy: 1, idle: 0))

        // In the pool's wait: the one connection is busy.
        let waiting = Task { await clientError { _ = try await client.get(url) } }
        #expect(await eventually { client.waiterCount(for: url) == 1 })
        waiting.cancel()
        #expect(await waiting.value == .cancelled)
        #expect(client.connectionCount(for: url) == (busy: 1, idle: 0) && client.waiterCount(for: url) == 0,
                "the waiter took nothing and is gone")

        inFlight.cancel()
        #expect(await inFlight.value == .cancelled)
        #expect(await eventually { client.connectionCount(for: url) == (busy: 0, idle: 0) },
                "the interrupted connection is closed, not pooled with half a response")

        // In the connect: a listener whose queue is full never completes it.
        let full = try ScriptedServer(backlog: 0, accepting: false) { _, _ in }
        let fillers = fillQueue(of: full)
        let blackhole = "http://127.0.0.1:\(full.port)/"
        let connecting = Task { await clientError { _ = try await client.get(blackhole) } }
        #expect(await eventually { client.connectionCount(for: blackhole) == (busy: 1, idle: 0) })
        let cancelledAt = ContinuousClock.now
        connecting.cancel()
        #expect(await connecting.value == .cancelled)
        #expect(ContinuousClock.now - cancelledAt < .seconds(30), "not the 600 s connect timeout")
        #expect(client.connectionCount(for: blackhole) == (busy: 0, idle: 0), "the slot is given back")
        for fd in fillers { close(fd) }
        client.shutdown()
        await group.shutdown(gracePeriod: .milliseconds(200))  // the abandoned connect is still trying
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

@Suite("HTTP client over TLS", .enabled(if: TestCertificates.shared != nil, "the openssl command is not installed (Debian: apt-get install openssl)"))
struct HTTPClientTLSTests {
    @Test("https through MainspringTLS's connector: the certificate checked against the URL's host; keep-alive over TLS; an untrusted server named")
    func https() async throws {
        let certs = try #require(TestCertificates.shared)
        let group = try EventLoopGroup(loopCount: 2)
        var routes = HTTPRoutes()
        routes.get("/peer") { request in .text(request.remoteAddress) }
        let tls = try TLSServerContext(configuration: .init(certificates: [
            TLSCertificate(certificateFile: certs.serverCertificate, keyFile: certs.serverKey),
        ]))
        let server = try await HTTPServer(group: group, routes: routes, tls: tls)
        let trusting = try TLSClientContext(configuration: .init(trustRoots: .file(certs.caCertificate)))
        let client = HTTPClient(loop: group.loops[1], configuration: .init(secureConnector: .tls(trusting)))
        let first = try await client.get("https://localhost:\(server.port)/peer")
        let second = try await client.get("https://127.0.0.1:\(server.port)/peer")
        let third = try await client.get("https://localhost:\(server.port)/peer")
        #expect(first.status == 200 && second.status == 200)
        #expect(first.text == third.text, "one TLS connection for localhost's requests")
        let untrusting = HTTPClient(loop: group.loops[1], configuration: .init(secureConnector: .tls(try TLSClientContext())))
        let refused = await clientError { _ = try await untrusting.get("https://localhost:\(server.port)/peer") }
        guard case .tlsFailed(let host, let port, let tlsError)? = refused else {
            Issue.record("\(String(describing: refused))")
            return
        }
        #expect(host == "localhost" && port == server.port)
        #expect(tlsError == .handshakeFailed(reason: "the server's certificate did not verify: unable to get local issuer certificate"))
        #expect(refused?.description == "connect to localhost:\(server.port) failed: TLS handshake failed: "
                + "the server's certificate did not verify: unable to get local issuer certificate")
        // A TCP connect that fails under TLS is the same error as over http, not a TLS one.
        let nowhere = await clientError { _ = try await untrusting.get("https://127.0.0.1:1/peer") }
        guard case .connectFailed(_, 1, .system(_, ECONNREFUSED))? = nowhere else {
            Issue.record("\(String(describing: nowhere))")
            return
        }
        client.shutdown()
        untrusting.shutdown()
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
