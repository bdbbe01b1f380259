import Testing
import KVCore
import MainspringTestSupport

@Suite("KVCore RESP2 parser")
struct KVCoreParserTests {
    @Test("a multibulk command yields its binary-safe arguments")
    func multibulk() {
        let input = kvBytes("*3\r\n$3\r\nSET\r\n$4\r\nk\0\r\n\r\n$0\r\n\r\n")
        #expect(kvParse([input]) == [.command([kvBytes("SET"), [107, 0, 13, 10], []])])
    }

    @Test("the two bytes after a bulk are skipped unread, as Redis does")
    func bulkTerminatorNotChecked() {
        #expect(kvParse([kvBytes("*1\r\n$4\r\nPINGxx*1\r\n$4\r\nPING\r\n")]) == [kvCommand("PING"), kvCommand("PING")])
    }

    @Test("inline commands split at blanks with Redis's quoting and escapes")
    func inline() {
        let input = kvBytes("SET  k   \"a b\\x41\\n\\t\\\"\"  \r\nGET 'it\\'s' \"\"\n\r\n   \nECHO a\"b c\"\r\n")
        #expect(kvParse([input]) == [
            kvCommand("SET", "k", "a bA\n\t\""), kvCommand("GET", "it's", ""), kvCommand("ECHO", "ab c"),
        ])
    }

    @Test("an inline escape of an unknown letter is the letter; a bad \\x stays as text")
    func inlineEscapes() {
        #expect(kvParse([kvBytes("ECHO \"\\q\\xZZ\\a\\b\"\n")]) == [.command([kvBytes("ECHO"), kvBytes("qxZZ") + [7, 8]])])
    }

    @Test("empty and negative multibulk counts are skipped")
    func emptyMultibulk() {
        #expect(kvParse([kvBytes("*0\r\n*-1\r\n*-7\r\n*1\r\n$4\r\nPING\r\n")]) == [kvCommand("PING")])
    }

    static let malformed: [(String, String)] = [
        ("*1\r\n$-1\r\n", "invalid bulk length"),
        ("*1\r\n$4294967296\r\n", "invalid bulk length"),
        ("*1\r\n$536870913\r\n", "invalid bulk length"),
        ("*1\r\n$04\r\nPING\r\n", "invalid bulk length"),
        ("*1\r\n$\r\n", "invalid bulk length"),
        ("*1\r\n$+4\r\n", "invalid bulk length"),
        ("*1\r\n$4x\r\n", "invalid bulk length"),
        ("*1\r\n$99999999999999999999\r\n", "invalid bulk length"),
        ("*2147483648\r\n", "invalid multibulk length"),
        ("*\r\n", "invalid multibulk length"),
        ("*1x\r\n", "invalid multibulk length"),
        ("*01\r\n", "invalid multibulk length"),
        ("*+1\r\n", "invalid multibulk length"),
        ("*-0\r\n", "invalid multibulk length"),
        ("*1\r\n:4\r\n", "expected '$', got ':'"),
        ("*2\r\n$4\r\nECHO\r\nx\r\n", "expected '$', got 'x'"),
        ("*1\r\n\r\n\r\n", "expected '$', got '\r'"),
        ("ECHO \"abc\r\n", "unbalanced quotes in request"),
        ("ECHO 'abc\r\n", "unbalanced quotes in request"),
        ("ECHO 'a'b\r\n", "unbalanced quotes in request"),
        ("ECHO \"a\"b\r\n", "unbalanced quotes in request"),
    ]

    @Test("each malformed request gets Redis's exact error, reported once, and nothing after it")
    func malformedRequests() {
        for (input, message) in Self.malformed {
            var parser = RESPParser()
            parser.append(contentsOf: kvBytes("PING\r\n" + input + "*1\r\n$4\r\nPING\r\n"))
            #expect(parser.next() == kvCommand("PING"), "\(input)")
            #expect(parser.next() == kvProtocolError(message), "\(input)")
            #expect(parser.hasFailed)
            #expect(parser.next() == nil)
            parser.append(contentsOf: kvBytes("PING\r\n"))
            #expect(parser.next() == nil)
        }
    }

    @Test("malformed requests fail the same way fed a byte at a time")
    func malformedByteAtATime() {
        for (input, message) in Self.malformed {
            let events = kvParse(kvBytes(input).map { [$0] })
            #expect(events == [kvProtocolError(message)], "\(input)")
        }
    }

    @Test("the error reply is the message as a RESP error")
    func errorReply() {
        var output: [UInt8] = []
        RESPParser.ProtocolError(message: "ERR Protocol error: invalid bulk length").appendReply(to: &output)
        #expect(kvText(output) == "-ERR Protocol error: invalid bulk length\r\n")
        // The offending byte is shown raw, except CR and LF, which become spaces.
        var parser = RESPParser()
        parser.append(contentsOf: kvBytes("*1\r\n") + [0xE9] + kvBytes("\r\n"))
        guard case .protocolError(let error)? = parser.next() else { Issue.record("no error"); return }
        output = []
        error.appendReply(to: &output)
        #expect(output == kvBytes("-ERR Protocol error: expected '$', got '") + [0xE9] + kvBytes("'\r\n"))
        parser = RESPParser()
        parser.append(contentsOf: kvBytes("*1\r\n\r\n\r\n"))
        guard case .protocolError(let crError)? = parser.next() else { Issue.record("no error"); return }
        output = []
        crError.appendReply(to: &output)
        #expect(kvText(output) == "-ERR Protocol error: expected '$', got ' '\r\n")
    }

    @Test("an inline request over 64 KiB without its newline is too big; at 64 KiB it waits")
    func inlineLimit() {
        var parser = RESPParser()
        parser.append(contentsOf: [UInt8](repeating: 65, count: 64 * 1024))
        #expect(parser.next() == nil)
        parser.append(contentsOf: [65])
        #expect(parser.next() == kvProtocolError("too big inline request"))
    }

    @Test("a multibulk count line over 64 KiB is too big")
    func mbulkCountLimit() {
        #expect(kvParse([kvBytes("*") + [UInt8](repeating: 49, count: 64 * 1024)]) == [kvProtocolError("too big mbulk count string")])
        #expect(kvParse([kvBytes("*1\r\n$") + [UInt8](repeating: 49, count: 64 * 1024)]) == [kvProtocolError("too big bulk count string")])
    }

    @Test("limits are checked on the header, before the data comes")
    func limitsBeforeData() {
        let limits = RESPParser.Limits(maxBulkLength: 10, maxMultibulkLength: 3, maxInlineLength: 16)
        #expect(kvParse([kvBytes("*1\r\n$11\r\n")], limits: limits) == [kvProtocolError("invalid bulk length")])
        #expect(kvParse([kvBytes("*1\r\n$10\r\n0123456789\r\n")], limits: limits) == [kvCommand("0123456789")])
        #expect(kvParse([kvBytes("*4\r\n")], limits: limits) == [kvProtocolError("invalid multibulk length")])
        #expect(kvParse([kvBytes("GET 0123456789ABCDEF")], limits: limits) == [kvProtocolError("too big inline request")])
        // A declared 512 MB argument waits for its bytes without reserving them.
        var parser = RESPParser()
        parser.append(contentsOf: kvBytes("*2\r\n$3\r\nSET\r\n$536870912\r\nabc"))
        #expect(parser.next() == nil)
        #expect(parser.bufferedByteCount < 64)
    }

    @Test("a NUL byte hides the end of a line, as Redis's strchr does")
    func nulHidesLineEnd() {
        #expect(kvParse([kvBytes("PI\0NG\r\nPING\r\n")]) == [])
        #expect(kvParse([kvBytes("*1\0\r\n$4\r\nPING\r\n")]) == [])
        var parser = RESPParser(limits: RESPParser.Limits(maxInlineLength: 8))
        parser.append(contentsOf: kvBytes("PI\0NG\r\n"))
        #expect(parser.next() == nil)
        parser.append(contentsOf: kvBytes("ABCD"))
        #expect(parser.next() == kvProtocolError("too big inline request"))
    }

    static let streams: [[UInt8]] = [
        kvEncode(["SET", "key", "value"]) + kvEncode(["GET", "key"]) + kvBytes("PING\r\n"),
        kvBytes("*2\r\n$4\r\nECHO\r\n$6\r\na\r\nb\0c\r\n") + kvBytes("ECHO \"x y\" 'z'\n") + kvEncode(["DEL", ""]),
        kvBytes("\r\n*0\r\nSET a b\r\n*-1\r\n") + kvEncode(["LPUSH", String(repeating: "x", count: 300)]),
        kvEncode(["PING"]) + kvBytes("*1\r\n$4\r\nECHO\r\n*1\r\n:1\r\n"),
        kvBytes("PING\r\nECHO \"unclosed\r\nPING\r\n"),
    ]

    @Test("any split of a stream at any byte gives the same events as the whole")
    func everySplit() {
        for stream in Self.streams {
            let whole = kvParse([stream])
            #expect(!whole.isEmpty)
            for cut in 0...stream.count {
                #expect(kvParse([Array(stream[..<cut]), Array(stream[cut...])]) == whole, "cut at \(cut)")
            }
            for first in stride(from: 0, to: stream.count, by: 7) {
                for second in stride(from: first, to: stream.count, by: 11) {
                    let pieces = [Array(stream[..<first]), Array(stream[first..<second]), Array(stream[second...])]
                    #expect(kvParse(pieces) == whole)
                }
            }
        }
    }

    @Test("one byte at a time gives the same events as the whole")
    func byteAtATime() {
        for stream in Self.streams {
            #expect(kvParse(stream.map { [$0] }) == kvParse([stream]))
        }
    }

    @Test("100,000 pipelined commands in one append all come out, and the buffer empties")
    func pipelined() {
        var parser = RESPParser()
        let one = kvEncode(["PING"])
        var input: [UInt8] = []
        input.reserveCapacity(one.count * 100_000)
        for _ in 0..<100_000 { input += one }
        parser.append(contentsOf: input)
        var count = 0
        while let event = parser.next() {
            #expect(event == kvCommand("PING"))
            count += 1
        }
        #expect(count == 100_000)
        #expect(parser.bufferedByteCount == 0)
    }

    @Test("only the unparsed tail stays buffered")
    func smallTail() {
        var parser = RESPParser()
        let one = kvEncode(["SET", "k", "v"])
        for _ in 0..<1000 {
            parser.append(contentsOf: one + one[..<5])
            while parser.next() != nil {}
            #expect(parser.bufferedByteCount <= 5)  // the header already read is not kept
            parser.append(contentsOf: one[5...])
            #expect(parser.next() == kvCommand("SET", "k", "v"))
            #expect(parser.bufferedByteCount == 0)
        }
    }

    @Test("Redis's integer syntax")
    func integers() {
        let good: [(String, Int64)] = [
            ("0", 0), ("7", 7), ("-1", -1), ("9223372036854775807", .max), ("-9223372036854775808", .min), ("10", 10),
        ]
        for (text, value) in good { #expect(RedisInteger.parse(kvBytes(text)) == value, "\(text)") }
        for text in ["", "-", "-0", "+1", "01", " 1", "1 ", "1.0", "9223372036854775808", "-9223372036854775809", "abc", "0x1"] {
            #expect(RedisInteger.parse(kvBytes(text)) == nil, "\(text)")
        }
        for value: Int64 in [0, 5, -5, 10, 123_456_789, .max, .min] {
            #expect(RedisInteger.bytes(value) == kvBytes(String(value)))
        }
    }

    @Test("the reply encoder writes each RESP2 type")
    func encoder() {
        var output: [UInt8] = []
        RESP.appendOK(to: &output)
        RESP.appendSimpleString("PONG", to: &output)
        RESP.appendError("ERR bad\r\nthing", to: &output)
        RESP.appendInteger(-42, to: &output)
        RESP.appendBulkString([0, 1], to: &output)
        RESP.appendNullBulk(to: &output)
        RESP.appendArray(of: [kvBytes("a"), []], to: &output)
        RESP.appendNullArray(to: &output)
        RESP.appendEmptyArray(to: &output)
        #expect(output == kvBytes("+OK\r\n+PONG\r\n-ERR bad  thing\r\n:-42\r\n$2\r\n") + [0, 1] + kvBytes("\r\n$-1\r\n*2\r\n$1\r\na\r\n$0\r\n\r\n*-1\r\n*0\r\n"))
    }
}
