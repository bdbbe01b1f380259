import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringHTTP
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A raw request on a new connection: the whole reply, or nil when the connection is refused
/// or reset before any byte arrives.
private func exchange(port: UInt16, _ request: String) -> String? {
    guard let client = try? TestClient(port: port) else { return nil }
    client.send(request)
    let reply = client.readToEnd()
    return reply.isEmpty ? nil : reply
}

@Suite("HTTP: creation and close that block nothing; 400 without Host; one error content type", .serialized)
struct HTTPCloseTests {
    @Test("100 rounds: a request fired right after `await closeAndWait()` never gets 200 from the server that said it closed, even with a loop busy")
    func nothingAfterClose() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        var answered: [String] = []
        for round in 0..<100 {
            let token = "round \(round) \(UInt64.random(in: 0...UInt64.max))"
            var routes = HTTPRoutes()
            routes.get("/id") { _ in .text(token + "\n") }
            let server = try await HTTPServer(group: group, routes: routes)
            let port = server.port
            // A keep-alive connection, open and idle when the close begins.
            let idle = try await onPlainThread { () -> TestClient in
                let client = try TestClient(port: port)
                client.send("GET /id HTTP/1.1\r\nHost: t\r\n\r\n")
                _ = client.readLine()
                return client
            }
            // One loop busy in a long callback while the server closes.
            group.loops[round % 2].execute { busy(.milliseconds(30)) }
            await server.closeAndWait()
            let (fresh, kept) = await onPlainThread { () -> (String?, String?) in
                let fresh = exchange(port: port, "GET /id HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                idle.send("GET /id HTTP/1.1\r\nHost: t\r\n\r\n")
                return (fresh, idle.readToEnd())
            }
            for reply in [fresh, kept] {
                if let reply, reply.hasPrefix("HTTP/1.1 200"), reply.contains(token) { answered.append(reply) }
            }
            if round % 10 == 9 { _ = kept }  // keeps the idle client alive until here
        }
        #expect(answered.isEmpty, "\(answered.count) requests answered after close: \(answered.first ?? "")")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("requests on open connections after `await close()` get 503 and Connection: close")
    func lateRequestsGet503() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        let server = try await HTTPServer(group: group, routes: routes)
        let port = server.port
        let idle = try await onPlainThread { () -> TestClient in
            let client = try TestClient(port: port)
            client.send("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
            for _ in 0..<6 { _ = client.readLine() }  // the status line, the fields, the blank line, the body
            return client
        }
        // A request in flight when the close begins keeps the connection open until answered;
        // meanwhile a second request on it arrives late.
        await server.closeAndWait()
        let reply = await onPlainThread { () -> String in
            idle.send("GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
            return idle.readToEnd()
        }
        #expect(reply.isEmpty || (reply.hasPrefix("HTTP/1.1 503") && reply.contains("Connection: close")), "\(reply)")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("HTTP/1.1 without Host (or with two) is 400 with the reason; HTTP/1.0 without Host is served")
    func hostRequired() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        let server = try await HTTPServer(group: group, routes: routes)
        let port = server.port
        let (missing, twice, old, fine, lower) = await onPlainThread {
            (exchange(port: port, "GET /hello HTTP/1.1\r\nAccept: */*\r\n\r\n") ?? "",
             exchange(port: port, "GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") ?? "",
             exchange(port: port, "GET /hello HTTP/1.0\r\n\r\n") ?? "",
             exchange(port: port, "GET /hello HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n") ?? "",
             exchange(port: port, "GET /hello HTTP/1.1\r\nhOsT: a\r\nConnection: close\r\n\r\n") ?? "")
        }
        #expect(missing.hasPrefix("HTTP/1.1 400 Bad Request\r\n") && missing.hasSuffix("an HTTP/1.1 request needs a Host header field\n"),
                "\(missing)")
        #expect(missing.contains("Content-Type: text/plain; charset=utf-8"), "\(missing)")
        #expect(twice.hasPrefix("HTTP/1.1 400") && twice.contains("exactly one Host header field"), "\(twice)")
        #expect(old.hasPrefix("HTTP/1.0 200") && old.hasSuffix("hello\n"), "\(old)")
        #expect(fine.hasPrefix("HTTP/1.1 200"), "\(fine)")
        #expect(lower.hasPrefix("HTTP/1.1 200"), "field names are case-insensitive: \(lower)")
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a closed server lets go of its routes: nothing of it outlives closeAndWait and its handle")
    func closedServerIsFreed() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let watched = WeakMarker()
        do {
            let marker = Marker()
            watched.marker = marker
            var routes = HTTPRoutes()
            routes.get("/m") { [marker] _ in .text("\(ObjectIdentifier(marker))\n") }
            let server = try await HTTPServer(group: group, routes: routes)
            await server.closeAndWait()
        }
        // Each loop's last turns of closing (a loop may post the last of it to another: on a
        // loaded machine one turn each is not always enough), within a generous bound.
        let deadline = ContinuousClock.now + .seconds(10)
        repeat {
            for loop in group.loops { try await loop.submit {} }
        } while !watched.isGone && ContinuousClock.now < deadline
        #expect(watched.isGone, "the server's loops kept its routes (and themselves) after it closed")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a loop's part that closes while its server is still starting counts: the server still closes (and lets go of its parts) when the rest do, or at once when all did")
    func partClosedDuringStartCounts() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let server = try await HTTPServer(group: group, routes: HTTPRoutes())
        let parts = server.shared.endpoints  // two real parts, to count
        #expect(parts.count == 2)
        // One part reported its close before the server was made (its loop shut down meanwhile).
        let one = ServerShared(maxConnections: 1, socketFile: nil)
        one.endpointClosed()
        one.start(with: parts)
        #expect(one.openEndpoints == 1 && one.endpoints.count == 2)
        one.endpointClosed()
        #expect(one.openEndpoints == 0 && one.endpoints.isEmpty, "the last close did not close the server")
        // Both did: closed at once.
        let both = ServerShared(maxConnections: 1, socketFile: nil)
        both.endpointClosed()
        both.endpointClosed()
        both.start(with: parts)
        #expect(both.openEndpoints == 0 && both.endpoints.isEmpty)
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("The server's own refusals go out as plain text saying why, like every other error body")
    func plainTextErrors() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let server = try await HTTPServer(group: group, configuration: .init(maxBodyBytes: 16), routes: HTTPRoutes())
        let port = server.port
        let replies = await onPlainThread {
            [exchange(port: port, "GARBAGE\r\n\r\n") ?? "",
             exchange(port: port, "GET / HTTP/2.5\r\nHost: x\r\n\r\n") ?? "",
             exchange(port: port, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + String(repeating: "b", count: 100)) ?? "",
             exchange(port: port, "GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") ?? ""]
        }
        for reply in replies {
            #expect(reply.contains("Content-Type: text/plain; charset=utf-8"), "\(reply)")
            #expect(!reply.contains("text/html") && !reply.contains("<HTML>"), "\(reply)")
        }
        #expect(replies[0].hasPrefix("HTTP/1.1 400 Bad Request")
                    && replies[0].hasSuffix("\r\n\r\nthe request line is not METHOD TARGET VERSION\n"), "\(replies[0])")
        #expect(replies[1].hasPrefix("HTTP/1.1 400 Bad Request")
                    && replies[1].hasSuffix("\r\n\r\nthe request line's version is not HTTP/1.x\n"), "\(replies[1])")
        #expect(replies[2].hasPrefix("HTTP/1.1 413"), "\(replies[2])")
        #expect(replies[3].hasPrefix("HTTP/1.1 404") && replies[3].hasSuffix("Not Found\n"), "\(replies[3])")
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("At maxConnections a real loop stops accepting: the next client waits in the kernel's backlog, unanswered, and is served once a connection closes")
    func maxConnectionsPausesAccepting() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        let server = try await HTTPServer(group: group, configuration: .init(maxConnections: 2), routes: routes)
        let port = server.port
        let request = "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
        @Sendable func answered(_ client: TestClient) -> Bool {
            while let line = client.readLine() { if line == "hello" { return true } }
            return false
        }
        let clients = try await onPlainThread { () throws -> [TestClient]? in
            let one = try TestClient(port: port)
            let two = try TestClient(port: port)
            one.send(request)
            two.send(request)
            guard answered(one), answered(two) else { return nil }
            let three = try TestClient(port: port)  // completed by the kernel: the listen backlog
            three.send(request)
            // A round trip on a served connection: the loop has polled since the third
            // connected, so an accepting listener would have taken it.
            one.send(request)
            guard answered(one) else { return nil }
            return [one, two, three]
        }
        #expect(clients != nil, "the first two clients were served")
        #expect(server.acceptor.acceptedCount == 2, "accepted \(server.acceptor.acceptedCount): the third waits in the backlog")
        #expect(server.statistics.snapshot.connectionsOpen == 2)
        // Closing one (the server reads its end of file) makes room: the third is accepted and served.
        let remaining = clients ?? []
        let served = await onPlainThread { () -> Bool in
            guard remaining.count == 3 else { return false }
            remaining[1].shutdownWrite()
            remaining[2].setReceiveTimeout(seconds: 10)
            return answered(remaining[2])
        }
        #expect(served, "the third client was served once the second left")
        #expect(server.acceptor.acceptedCount == 3)
        withExtendedLifetime(remaining) {}
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("A large response read slowly but steadily is not cut by idleTimeout on a real loop: the stall deadline counts from when the kernel last took output")
    func slowReaderIsNotAStall() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let size = 8 << 20
        var routes = HTTPRoutes()
        routes.get("/big") { _ in HTTPResponse(body: [UInt8](repeating: 0x61, count: size)) }
        let server = try await HTTPServer(group: group, configuration: .init(maxBodyBytes: 16, idleTimeout: .seconds(1)),
                                          routes: routes)
        let port = server.port
        // 256 KiB every 100 ms: about 3 s for the body, the server's own buffer not empty for
        // the first 1.5 s or so (the kernel's buffers take the rest) — longer than idleTimeout.
        let (received, elapsed) = try await onPlainThread { () throws -> (Int, Duration) in
            let client = try TestClient(port: port)
            client.setReceiveTimeout(seconds: 30)
            let start = ContinuousClock.now
            client.send("GET /big HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            var total = 0
            var chunk = [UInt8](repeating: 0, count: 256 << 10)
            while true {
                var round = 0
                while round < chunk.count {
                    let n = chunk.withUnsafeMutableBytes { recv(client.fd, $0.baseAddress! + round, $0.count - round, 0) }
                    if n < 0 && errno == EINTR { continue }
                    if n <= 0 { return (total, ContinuousClock.now - start) }
                    round += n
                    total += n
                }
                usleep(100_000)
            }
        }
        #expect(received > size, "the whole response (\(size) bytes of body and its head) arrived: \(received)")
        #expect(elapsed > .seconds(1), "the transfer outlasted idleTimeout (\(elapsed)), so the test tested something")
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

/// Something a route captures, to see whether the route was let go.
private final class Marker: Sendable {}

/// A weak reference to a `Marker`.
private final class WeakMarker: @unchecked Sendable {
    weak var marker: Marker?
    var isGone: Bool { marker == nil }
}

/// Busy-waits (real CPU work, no sleep) for `duration`: a handler that takes long.
private func busy(_ duration: Duration) {
    let end = ContinuousClock.now + duration
    var x: UInt64 = 1
    while ContinuousClock.now < end { x = x &* 6364136223846793005 &+ 1 }
    if x == 0 { print("unreachable") }
}
