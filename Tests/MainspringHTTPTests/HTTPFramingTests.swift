import Foundation
import Mainspring
import MainspringTestSupport
import MainspringHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A server whose routes say who answered: `POST /healthz` and `POST /echo` (the body back), and
/// `GET /metrics`, which a smuggled request would reach. `body` runs with its port; each request
/// goes over a raw socket of its own.
private func withFramingServer(_ body: (UInt16) async throws -> Void) async throws {
    let group = try EventLoopGroup(loopCount: 1)
    var routes = HTTPRoutes()
    routes.post("/healthz") { _ in .text("healthz\n") }
    routes.post("/echo") { request in .text("echo [\(request.text)]\n") }
    routes.get("/metrics") { _ in .text("metrics, which the front end never allows\n") }
    let server = try await HTTPServer(group: group, routes: routes)
    let port = server.port
    do {
        try await body(port)
    } catch {
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
        throw error
    }
    await server.closeAndWait()
    await group.shutdown(gracePeriod: .seconds(2))
}

/// Sends `request` on a new connection and reads until the server closes it (or 10 s pass), on
/// a plain thread.
private func exchange(_ port: UInt16, _ request: String) async throws -> String {
    try await onPlainThread {
        let client = try TestClient(port: port)
        client.send(request)
        return client.readToEnd()
    }
}

/// The status lines in `reply`, in order ("HTTP/1.1 400", …): one per response (the bodies here
/// end in a newline, so each status line starts a line).
private func statuses(_ reply: String) -> [String] {
    reply.components(separatedBy: "\n").filter { $0.hasPrefix("HTTP/1.") }.map { String($0.prefix(12)) }
}

/// Checks that `reply` is one response of `status`, with `Connection: close`, and nothing after it.
private func expectRefused(_ reply: String, _ status: Int, _ what: String,
                           sourceLocation: SourceLocation = #_sourceLocation)
{
    #expect(statuses(reply) == ["HTTP/1.1 \(status)"], "\(what): \(reply.debugDescription)", sourceLocation: sourceLocation)
    #expect(reply.contains("Connection: close"), "\(what): \(reply.debugDescription)", sourceLocation: sourceLocation)
    #expect(!reply.contains("metrics") && !reply.contains("echo ["), "\(what): \(reply.debugDescription)",
            sourceLocation: sourceLocation)
}

/// Request framing (RFC 9112 §6.3), checked by the head guard before anything is routed. evhttp
/// takes the first of two `Content-Length` fields and reads a `Transfer-Encoding` other than
/// exactly `chunked` as none, so a proxy in front that reads the other field sees a different end
/// of the request, and the rest of the body is served as a request of its own (smuggling).
@Suite("HTTP: request framing that two parsers could read two ways is refused", .serialized)
struct HTTPFramingTests {
    /// The report's example: the front end forwards 44 bytes of body by the second length; evhttp
    /// took the first (0), and answered the body as a second request, `GET /metrics`.
    @Test("two Content-Length fields that differ: 400 and closed; the body is not served as a second request")
    func conflictingLengths() async throws {
        try await withFramingServer { port in
            let smuggled = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8\r\n\r\n"
            #expect(smuggled.utf8.count == 44)
            let reply = try await exchange(port, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n" + smuggled)
            expectRefused(reply, 400, "0 then 44")
            #expect(reply.hasSuffix("two Content-Length header fields with different values\n"), "\(reply)")
            let reversed = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 44\r\ncontent-length: 0\r\n\r\n" + smuggled)
            expectRefused(reversed, 400, "44 then 0")
        }
    }

    /// RFC 9110 §8.6 lets a recipient take identical lengths as one.
    @Test("two Content-Length fields with the same value are one length: served")
    func identicalLengths() async throws {
        try await withFramingServer { port in
            let reply = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")
            #expect(reply.hasPrefix("HTTP/1.1 200") && reply.hasSuffix("echo [body]\n"), "\(reply)")
        }
    }

    /// `Content-Length = 1*DIGIT`: evhttp's `strtoll` took a sign, and a front end may not.
    @Test("a Content-Length that is not all digits (+4, -4, 0x4, 4 4, 4,4, empty): 400")
    func lengthsThatAreNotNumbers() async throws {
        try await withFramingServer { port in
            for value in ["+4", "-4", "0x4", "4 4", "4,4", "", "99999999999999999999"] {
                let reply = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \(value)\r\n\r\nbody")
                expectRefused(reply, 400, "Content-Length: \(value)")
            }
            let spaced = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: \t4 \r\nConnection: close\r\n\r\nbody")
            #expect(spaced.hasPrefix("HTTP/1.1 200") && spaced.hasSuffix("echo [body]\n"), "whitespace around it is fine: \(spaced)")
        }
    }

    /// evhttp decodes `chunked` alone; for anything else it read the body by `Content-Length`
    /// or as empty, so the chunks were served as requests.
    @Test("Transfer-Encoding other than exactly chunked (xchunked, chunked + identity, gzip, a tab, twice): 501 and closed")
    func otherTransferCodings() async throws {
        try await withFramingServer { port in
            let chunks = "5\r\nhello\r\n0\r\n\r\n"
            for coding in ["xchunked", "chunked, identity", "identity, chunked", "gzip", "gzip, chunked", "\tchunked",
                           "chunked;q=1", "chunk", ""]
            {
                let reply = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \(coding)\r\n\r\n" + chunks)
                expectRefused(reply, 501, "Transfer-Encoding: \(coding.debugDescription)")
            }
            let split = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n" + chunks)
            expectRefused(split, 501, "chunked, then identity in a second field")
            let twice = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
            expectRefused(twice, 400, "chunked twice")
            let fine = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  ChunKed \r\nConnection: close\r\n\r\n" + chunks)
            #expect(fine.hasPrefix("HTTP/1.1 200") && fine.hasSuffix("echo [hello]\n"), "chunked alone is served: \(fine)")
        }
    }

    /// A chunk size read leniently (a sign, `0x`, white space before the digits) or data not
    /// followed by its CR LF lets a front end and the server disagree on where the body ends.
    @Test("chunked bodies read strictly: +4, 0x4, a leading space, a size past 15 digits, data without its CR LF, a control character in an extension: 400 saying why; 4;ext and 4 ;ext=1 served")
    func strictChunks() async throws {
        try await withFramingServer { port in
            let head = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            let refused: [(String, String)] = [
                ("+4\r\nabcd\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
                ("0x4\r\nabcd\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
                (" 4\r\nabcd\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
                ("4x\r\nabcd\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
                ("0000000000000004\r\nabcd\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
                ("4;a\u{1}b\r\nabcd\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
                ("4\r\nabcdXY0\r\n\r\n", "a chunk's data is not followed by CR LF"),
                ("4\r\nabcd0\r\n\r\n", "a chunk's data is not followed by CR LF"),
                ("4\r\nabcd\r\n\r\n0\r\n\r\n", "a chunk size line is not hex digits"),
            ]
            for (chunks, why) in refused {
                let reply = try await exchange(port, head + chunks)
                expectRefused(reply, 400, chunks.debugDescription)
                #expect(reply.hasSuffix("\r\n\r\n\(why)\n"), "\(chunks.debugDescription): \(reply.debugDescription)")
            }
            for chunks in ["4;ext\r\nabcd\r\n0\r\n\r\n", "4 ;ext=1\r\nabcd\r\n0\r\n\r\n", "4\nabcd\n0\n\n",
                           "2\r\nab\r\n2\r\ncd\r\n0\r\nX-Trailer: 1\r\n\r\n"]
            {
                let reply = try await exchange(port, head.replacingOccurrences(of: "Host: x\r\n", with: "Host: x\r\nConnection: close\r\n")
                                                   + chunks)
                #expect(reply.hasPrefix("HTTP/1.1 200") && reply.hasSuffix("echo [abcd]\n"), "\(chunks.debugDescription): \(reply)")
            }
        }
    }

    /// CL.TE and TE.CL: which of the two a front end believes decides where the request ends.
    /// (evhttp 2.1.12 refuses both itself, as a bare "Bad Request", once it has parsed the head;
    /// the guard refuses them before, saying why.)
    @Test("Transfer-Encoding beside Content-Length, in either order: 400 saying so, and closed")
    func bothFramings() async throws {
        try await withFramingServer { port in
            let clte = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG"
            let tecl = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
                + "2c\r\nGET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8\r\n\r\n\r\n0\r\n\r\n"
            let obfuscated = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: xchunked\r\n\r\nbody"
            for (request, what) in [(clte, "CL.TE"), (tecl, "TE.CL"), (obfuscated, "CL with an obfuscated TE")] {
                let reply = try await exchange(port, request)
                expectRefused(reply, 400, what)
                #expect(reply.hasSuffix("Transfer-Encoding or Content-Length, not both\n"), "\(what): \(reply.debugDescription)")
            }
        }
    }

    /// A NUL ended evhttp's copy of a value (a C string) where a front end read on; the other
    /// tricks hide a field from one parser: `Transfer-Encoding : chunked`, a folded line.
    @Test("a NUL or other control character in a field, a bare CR, a folded line, whitespace before the colon: 400")
    func malformedFields() async throws {
        try await withFramingServer { port in
            let cases: [(field: String, reason: String)] = [
                ("X-Note: a\u{0}b", "control character"),
                ("X-Note: a\u{1}b", "control character"),
                ("X-Note: a\u{7F}b", "control character"),
                ("Content-Length: 4\u{0}4", "control character"),
                ("X-Note: a\rb", "CR that is not followed by LF"),
                ("X-Note: a\r\r", "CR that is not followed by LF"),
                ("X-Note: a\r\n b", "obsolete line folding"),
                ("X-Note: a\r\n\tTransfer-Encoding: chunked", "obsolete line folding"),
                ("Transfer-Encoding : chunked", "name holds whitespace"),
                ("Content-Length\t: 4", "name holds whitespace"),
            ]
            for (field, reason) in cases {
                let reply = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\n\(field)\r\n\r\nbody")
                expectRefused(reply, 400, field.debugDescription)
                #expect(reply.contains(reason), "\(field.debugDescription): \(reply.debugDescription)")
            }
            let tab = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nX-Note: a\tb\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")
            #expect(tab.hasPrefix("HTTP/1.1 200"), "a tab in a value is fine: \(tab)")
        }
    }

    /// The guard scans the next request's head while one is in flight: a smuggling head behind
    /// a good request is refused after the good one is answered.
    @Test("pipelined: a good request is answered, the conflicting one behind it gets 400, nothing after")
    func pipelinedConflict() async throws {
        try await withFramingServer { port in
            let reply = try await exchange(port, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"
                + "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n"
                + "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8\r\n\r\n")
            #expect(statuses(reply) == ["HTTP/1.1 200", "HTTP/1.1 400"], "\(reply.debugDescription)")
            #expect(reply.contains("echo [ok]") && !reply.contains("metrics,"), "\(reply.debugDescription)")
        }
    }
}
