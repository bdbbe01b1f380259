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

/// The client against servers that misbehave — malformed answers, heads that break the rules,
/// stalls, endless interim responses — and against its own shutdown and its caller's
/// cancellation (most of them `ScriptedServer`s, Support/ScriptedServer.swift).
@Suite("HTTP client: bad servers, timeouts, shutdown and cancellation", .serialized)
struct HTTPClientFailureTests {
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
}
