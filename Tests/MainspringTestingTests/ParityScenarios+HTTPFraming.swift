import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// Every framing the server refuses (request smuggling, RFC 9112 §6.3; the list of
/// `HTTPFramingTests` and `HeadFields.Problem`), each variant as raw bytes on a connection of
/// its own: the refusal's status, header fields (but `Date`) and body to the byte, and how the
/// connection ended — on both worlds alike.
extension ParityScenario {
    /// A scenario that sends each of `requests` (label, bytes) on a connection of its own.
    static func refusals(_ name: String, _ requests: [(String, String)]) -> ParityScenario {
        ParityScenario(name) { world in
            try await world.withHTTPServer { world in
                for (label, request) in requests { try await exchange(world, request, label: label) }
            }
        }
    }

    private static let post = "POST /echo HTTP/1.1\r\nHost: x\r\n"
    private static let smuggled = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8\r\n\r\n"
    private static let chunked = post + "Transfer-Encoding: chunked\r\n\r\n"

    static let framing: [ParityScenario] = [
        refusals("refused framing: Content-Length beside Transfer-Encoding (CL.TE, TE.CL, an obfuscated TE): 400", [
            ("CL.TE", post + "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG"),
            ("TE.CL", post + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n2c\r\n" + smuggled + "\r\n0\r\n\r\n"),
            ("CL with xchunked", post + "Content-Length: 4\r\nTransfer-Encoding: xchunked\r\n\r\nbody"),
        ]),
        refusals("refused framing: two Content-Length fields that differ: 400, the body not served as a request", [
            ("0 then 44", "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n" + smuggled),
            ("44 then 0", post + "Content-Length: 44\r\ncontent-length: 0\r\n\r\n" + smuggled),
        ]),
        refusals("refused framing: a Content-Length that is not all digits: 400",
                 ["+4", "-4", "0x4", "4 4", "4,4", "", "99999999999999999999"].map { value in
                     ("Content-Length: \(value.debugDescription)", post + "Content-Length: \(value)\r\n\r\nbody")
                 }),
        refusals("refused framing: a Transfer-Encoding other than chunked: 501",
                 ["xchunked", "chunked, identity", "identity, chunked", "gzip", "\tchunked", "chunked;q=1", ""].map { coding in
                     ("Transfer-Encoding: \(coding.debugDescription)", post + "Transfer-Encoding: \(coding)\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
                 } + [("chunked, then identity in a second field",
                       post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n")]),
        refusals("refused framing: Transfer-Encoding: chunked twice: 400", [
            ("chunked twice", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
        ]),
        refusals("refused framing: bad chunk sizes (+4, 0x4, a leading space, 4x, 16 digits, a control character, an empty line): 400",
                 ["+4\r\nabcd\r\n0\r\n\r\n", "0x4\r\nabcd\r\n0\r\n\r\n", " 4\r\nabcd\r\n0\r\n\r\n", "4x\r\nabcd\r\n0\r\n\r\n",
                  "0000000000000004\r\nabcd\r\n0\r\n\r\n", "4;a\u{1}b\r\nabcd\r\n0\r\n\r\n", "4\r\nabcd\r\n\r\n0\r\n\r\n"].map { body in
                     (body.debugDescription, chunked + body)
                 }),
        refusals("refused framing: chunk data not followed by CR LF: 400",
                 ["4\r\nabcdXY0\r\n\r\n", "4\r\nabcd0\r\n\r\n"].map { body in (body.debugDescription, chunked + body) }),
        refusals("refused framing: a header line without a colon: 400", [
            ("no colon", post + "Content-Length 4\r\n\r\nbody"),
            ("a bare word", post + "Oops\r\nContent-Length: 4\r\n\r\nbody"),
        ]),
        refusals("refused framing: obsolete line folding: 400", [
            ("a folded value", post + "X-Note: a\r\n b\r\n\r\nbody"),
            ("a folded Transfer-Encoding", post + "X-Note: a\r\n\tTransfer-Encoding: chunked\r\n\r\nbody"),
        ]),
        refusals("refused framing: a bare CR in a header line: 400", [
            ("CR inside a value", post + "X-Note: a\rb\r\n\r\nbody"),
            ("CR CR", post + "X-Note: a\r\r\n\r\nbody"),
        ]),
        refusals("refused framing: a control character in a field (NUL, SOH, DEL, NUL in a length): 400", [
            ("NUL", post + "X-Note: a\u{0}b\r\n\r\nbody"),
            ("SOH", post + "X-Note: a\u{1}b\r\n\r\nbody"),
            ("DEL", post + "X-Note: a\u{7F}b\r\n\r\nbody"),
            ("NUL in Content-Length", post + "Content-Length: 4\u{0}4\r\n\r\nbody"),
        ]),
        refusals("refused framing: whitespace in a field name: 400", [
            ("space before the colon", post + "Transfer-Encoding : chunked\r\n\r\nbody"),
            ("tab before the colon", post + "Content-Length\t: 4\r\n\r\nbody"),
        ]),
        refusals("refused framing, pipelined: a good request answered, the conflicting one behind it 400, nothing after", [
            ("good then conflicting", post + "Content-Length: 2\r\n\r\nok"
                + "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n" + smuggled),
        ]),
        refusals("refused request lines and hosts: an unknown method 501, HTTP/2.0 400, no Host 400, two Hosts 400, no version 400", [
            ("BREW", "BREW /pot HTTP/1.1\r\nHost: a\r\n\r\n"),
            ("HTTP/2.0", "GET /hello HTTP/2.0\r\nHost: a\r\n\r\n"),
            ("no Host", "GET /hello HTTP/1.1\r\n\r\n"),
            ("two Hosts", "GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            ("no version", "GET /hello\r\n\r\n"),
        ]),
        ParityScenario("refused by limits: a head over maxHeaderBytes 431, a body over maxBodyBytes 413, Expect: 200-ok 417") { world in
            try await world.withHTTPServer(configuration: .init(maxHeaderBytes: 1_024, maxBodyBytes: 64)) { world in
                try await exchange(world, "GET /hello HTTP/1.1\r\nHost: a\r\nX-Long: \(String(repeating: "x", count: 2_000))\r\n\r\n",
                                   label: "a 2 KB header field")
                try await exchange(world, post + "Content-Length: 99\r\n\r\n" + String(repeating: "b", count: 99), label: "99 bytes of body")
                try await exchange(world, post + "Transfer-Encoding: chunked\r\n\r\n" + String(repeating: "9\r\n123456789\r\n", count: 8)
                    + "0\r\n\r\n", label: "72 bytes of chunks")
                try await exchange(world, post + "Expect: 200-ok\r\nContent-Length: 2\r\n\r\nhi", label: "Expect: 200-ok")
            }
        },
    ]
}
