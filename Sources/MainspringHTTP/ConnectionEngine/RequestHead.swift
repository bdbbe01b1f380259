import MainspringCore

/// A request head the connection engine read, parsed: request line and header fields. The head
/// guard's scan has already refused what it refuses (control characters, bare CRs, folded lines,
/// ambiguous framing, `Host`); this reads what is left.
struct RequestHead {
    var method: HTTPMethod
    /// The request target as sent.
    var target: String
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    var minorVersion: Int
    var fields: [(name: String, value: String)]
    var framing: Framing
    /// Whether the connection stays open after the response (HTTP/1.1 unless `Connection:
    /// close`; HTTP/1.0 only with `Connection: keep-alive`).
    var keepsAlive: Bool
    /// Whether the (first) `Connection` field is exactly `close`: the response then says
    /// `Connection: close` too.
    var asksToClose: Bool
    /// An absolute target (`http://host/path`), taken for a proxy request: its close is
    /// `Proxy-Connection`'s, and the response does not echo it.
    var isProxyRequest: Bool
    /// Whether the first `Connection` field starts with `keep-alive` (an HTTP/1.0 response
    /// then says `Connection: keep-alive`).
    var asksKeepAlive: Bool
    /// The `Expect` field's value, in HTTP/1.1 (nil without one, or in HTTP/1.0).
    var expectation: String?
    var expectsContinue: Bool { expectation?.caseInsensitiveEquals("100-continue") == true }

    enum Framing: Equatable {
        case none
        case length(Int)
        case chunked
    }

    struct Failure: Error {
        let status: Int
        let reason: String
    }

    static func parse(_ bytes: ArraySlice<UInt8>) -> Result<RequestHead, Failure> {
        bytes.withUnsafeBufferPointer { parse(HeadBytes($0)) }
    }

    /// The method named by `range`, or nil for one the server does not know.
    private static func method(_ head: HeadBytes, _ range: Range<Int>) -> HTTPMethod? {
        // Methods are case-sensitive (RFC 9110 §9.1): compared as they are.
        func named(_ name: StaticString) -> Bool {
            range.count == name.utf8CodeUnitCount
                && (0..<range.count).allSatisfy { head.buffer[range.lowerBound + $0] == name.utf8Start[$0] }
        }
        switch range.count {
        case 3: return named("GET") ? .get : named("PUT") ? .put : nil
        case 4: return named("POST") ? .post : named("HEAD") ? .head : nil
        case 5: return named("PATCH") ? .patch : named("TRACE") ? .trace : nil
        case 6: return named("DELETE") ? .delete : nil
        case 7: return named("OPTIONS") ? .options : named("CONNECT") ? .connect : nil
        default: return nil
        }
    }

    /// The refusal a complete head meets before its request line is read — its field lines,
    /// its framing, `Host` — if any (the fuzz harness's guard verdict).
    static func guardRefusal(_ bytes: ArraySlice<UInt8>) -> Failure? {
        bytes.withUnsafeBufferPointer { buffer in
            var head = HeadBytes(buffer)
            if case .failure(let failure) = readGuarded(&head) { return failure }
            return nil
        }
    }

    /// The request line and the fields, and the checks made before the request line is read:
    /// the field lines and framing (`HeadFields`: 400, or 501 for a transfer coding other than
    /// `chunked`), then exactly one `Host` in a request that says HTTP/1.1 at the end of its
    /// line (RFC 9112 §3.2).
    private static func readGuarded(_ head: inout HeadBytes) -> Result<(line: Range<Int>?, fields: HeadFields), Failure> {
        // Blank lines before the request line are allowed (RFC 9112 §2.2).
        var requestLine: Range<Int>?
        while let line = head.nextLine() {
            if !line.isEmpty {
                requestLine = line
                break
            }
        }
        guard let requestLine else { return .success((nil, HeadFields())) }
        let fields: HeadFields
        switch HeadFields.read(&head) {
        case .failure(let problem):
            if case .codingNotChunked = problem { return .failure(Failure(status: 501, reason: problem.reason)) }
            return .failure(Failure(status: 400, reason: problem.reason))
        case .success(let read):
            fields = read
        }
        // Whether the line's last eight bytes other than CR are "HTTP/1.1".
        let expected: StaticString = "HTTP/1.1"
        var matched = 0
        var index = requestLine.upperBound
        while index > requestLine.lowerBound, matched < 8 {
            index -= 1
            let byte = head.buffer[index]
            if byte == 0x0D { continue }
            if byte != expected.utf8Start[7 - matched] { break }
            matched += 1
        }
        if matched == 8 {
            if fields.hostFields == 0 {
                return .failure(Failure(status: 400, reason: "an HTTP/1.1 request needs a Host header field"))
            }
            if fields.hostFields > 1 {
                return .failure(Failure(status: 400, reason: "an HTTP/1.1 request has exactly one Host header field, not \(fields.hostFields)"))
            }
        }
        return .success((requestLine, fields))
    }

    private static func parse(_ headBytes: HeadBytes) -> Result<RequestHead, Failure> {
        var head = headBytes
        let requestLine: Range<Int>
        let read: HeadFields
        switch readGuarded(&head) {
        case .failure(let failure): return .failure(failure)
        case .success((nil, _)): return .failure(Failure(status: 400, reason: "no request line"))
        case .success((let line?, let fields)):
            requestLine = line
            read = fields
        }
        // The method up to the first space, the version after the last, the target between
        // them (spaces and all: "GET  /x" asks for " /x", which no route has).
        var firstSpace = -1
        var lastSpace = -1
        for index in requestLine where head.buffer[index] == 0x20 {
            if firstSpace < 0 { firstSpace = index }
            lastSpace = index
        }
        guard firstSpace >= 0, firstSpace < lastSpace else {
            return .failure(Failure(status: 400, reason: "the request line is not METHOD TARGET VERSION"))
        }
        let targetRange = (firstSpace + 1)..<lastSpace
        let version = (lastSpace + 1)..<requestLine.upperBound
        guard !targetRange.isEmpty else { return .failure(Failure(status: 400, reason: "the request line has no target")) }
        let digit = { (byte: UInt8) -> Int? in byte >= 0x30 && byte <= 0x39 ? Int(byte - 0x30) : nil }
        guard version.count == 8, head.buffer[version.lowerBound..<(version.lowerBound + 5)].elementsEqual("HTTP/".utf8),
              digit(head.buffer[version.lowerBound + 5]) == 1, head.buffer[version.lowerBound + 6] == 0x2E,
              let minor = digit(head.buffer[version.lowerBound + 7])
        else {
            return .failure(Failure(status: 400, reason: "the request line's version is not HTTP/1.x"))
        }
        let methodRange = requestLine.lowerBound..<firstSpace
        guard let method = method(head, methodRange) else {
            let name = head.string(methodRange.lowerBound..<min(methodRange.upperBound, methodRange.lowerBound + 32))
            return .failure(Failure(status: 501, reason: "unknown method \(name)"))
        }
        if read.lineWithoutColon != nil {
            return .failure(Failure(status: 400, reason: HeadFields.MalformedLine.noColon.reason))
        }
        let framing: Framing = switch read.framing {
        case .none, .length(0): .none
        case .length(let length): .length(length)
        case .chunked: .chunked
        }
        // An absolute target (`http://host/path`) is a proxy request: its close is
        // `Proxy-Connection`'s. The first `Connection` field exactly `close` ends the connection,
        // and HTTP/1.0 closes unless that field starts with `keep-alive`.
        let isProxyRequest = head.buffer[targetRange.lowerBound] != 0x2F
            && (targetRange.lowerBound..<max(targetRange.lowerBound, targetRange.upperBound - 2)).contains {
                head.buffer[$0] == 0x3A && head.buffer[$0 + 1] == 0x2F && head.buffer[$0 + 2] == 0x2F
            }
        let asksToClose = (isProxyRequest ? read.firstProxyConnection : read.firstConnection)
            .map { head.matches($0, "close") } ?? false
        let asksKeepAlive = read.firstConnection.map { head.hasPrefix($0, "keep-alive") } ?? false
        let keepsAlive = !asksToClose && (minor >= 1 || asksKeepAlive)
        return .success(RequestHead(method: method, target: head.string(targetRange), minorVersion: min(minor, 1),
                                    fields: read.fields, framing: framing, keepsAlive: keepsAlive,
                                    asksToClose: asksToClose, isProxyRequest: isProxyRequest, asksKeepAlive: asksKeepAlive,
                                    expectation: minor >= 1 ? read.expectation.map(head.string) : nil))
    }

    /// The path (percent-decoded, "+" kept), the path as sent, and the query's items (values
    /// decoded, "+" as a space). A query that is not a list of `name=value` items (one item has
    /// no `=` or no name) gives no items at all, rather than a partial reading: a handler that
    /// wants it reads the target itself (`uri`). An absolute target (`http://host/path`) is read
    /// from its path.
    var pathAndQuery: (path: String, rawPath: String, query: [(name: String, value: String)]) {
        Self.pathAndQuery(of: target)
    }

    /// `pathAndQuery` of a request target (HTTP/2's `:path` too).
    static func pathAndQuery(of target: String) -> (path: String, rawPath: String, query: [(name: String, value: String)]) {
        // The usual target, a path with nothing to decode and no query: itself, three times.
        if target.utf8.first == 0x2F, !target.utf8.contains(where: { $0 == 0x25 || $0 == 0x3F || $0 == 0x23 }) {
            return (target, target, [])
        }
        var rest = Substring(target)
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        if !rest.hasPrefix("/"), let scheme = rest.range(of: "://") {
            let afterAuthority = rest[scheme.upperBound...]
            rest = afterAuthority.firstIndex(of: "/").map { afterAuthority[$0...] } ?? "/"
        }
        var rawPath = rest
        var query: Substring?
        if let mark = rest.firstIndex(of: "?") {
            rawPath = rest[..<mark]
            query = rest[rest.index(after: mark)...]
        }
        var items: [(name: String, value: String)] = []
        if let query, !query.isEmpty {
            // A single empty item at the end ("?a=1&", as scripts that join items often leave
            // it) is no item; an empty one elsewhere makes the query unreadable (no items at all).
            let all = query.split(separator: "&", omittingEmptySubsequences: false)
            for item in all.last?.isEmpty == true ? all.dropLast() : all[...] {
                guard let equals = item.firstIndex(of: "="), equals != item.startIndex else {
                    items = []
                    break
                }
                items.append((String(item[..<equals]), Self.percentDecoded(item[item.index(after: equals)...], plusAsSpace: true)))
            }
        }
        let path = Self.percentDecoded(rawPath, plusAsSpace: false)
        return (path.isEmpty ? "/" : path, String(rawPath), items)
    }

    /// `%XX` sequences as the bytes they name (others as they are), read as UTF-8.
    static func percentDecoded(_ text: Substring, plusAsSpace: Bool) -> String {
        guard text.utf8.contains(where: { $0 == UInt8(ascii: "%") || (plusAsSpace && $0 == UInt8(ascii: "+")) }) else {
            return String(text)
        }
        let utf8 = Array(text.utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(utf8.count)
        var index = 0
        while index < utf8.count {
            let byte = utf8[index]
            if byte == UInt8(ascii: "%"), index + 2 < utf8.count,
               let high = hexValue(utf8[index + 1]), let low = hexValue(utf8[index + 2])
            {
                bytes.append(high << 4 | low)
                index += 3
                continue
            }
            bytes.append(plusAsSpace && byte == UInt8(ascii: "+") ? 0x20 : byte)
            index += 1
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// Reads a request body off the connection's input: a declared length, or chunks.
enum RequestBodyReader {
    case length(Int)
    case chunked(ChunkedBodyDecoder)
    /// A declared body over the limit: read and dropped (this many bytes still to come), then
    /// `.tooLarge` — so that the 413 reaches a client that has sent it all, rather than a reset.
    case discarding(Int)

    enum Outcome {
        case needMore
        case done([UInt8])
        case tooLarge
        case malformed(String)
    }

    var isDiscarding: Bool {
        if case .discarding = self { true } else { false }
    }

    /// Takes what it can from `input` at `start` (advancing it).
    mutating func read(from input: [UInt8], at start: inout Int) -> Outcome {
        switch self {
        case .length(let length):
            guard input.count - start >= length else { return .needMore }
            defer { start += length }
            return .done(Array(input[start..<(start + length)]))
        case .chunked(var decoder):
            let outcome = decoder.read(from: input, at: &start)
            self = .chunked(decoder)
            return outcome
        case .discarding(let remaining):
            let taken = min(remaining, input.count - start)
            start += taken
            self = .discarding(remaining - taken)
            return remaining == taken ? .tooLarge : .needMore
        }
    }
}

/// The chunked transfer coding (RFC 9112 §7.1), decoded as it arrives and read strictly, so that
/// no front end can read the same bytes as another body: a size line of hex digits (at most 15,
/// nothing before them), optional spaces or tabs, then its end or a `;` and extensions (no
/// control characters); the data; the CR LF (or LF) that must follow it; the next size line. A
/// zero size ends it, then trailer lines (`name: value`, at most `maxTrailerBytes` in all) up to a
/// blank line. Anything else is `.malformed` (answered `400`); data past `maxBytes` is `.tooLarge`.
struct ChunkedBodyDecoder {
    let maxBytes: Int
    let maxTrailerBytes: Int
    private(set) var body: [UInt8] = []
    private var state = State.size
    /// Bytes of the chunk being read that are still to come.
    private var remaining = 0
    private var trailerBytes = 0

    private enum State { case size, data, dataEnd, trailer }

    /// The longest size line read.
    private static let maxLine = 4096

    init(maxBytes: Int, maxTrailerBytes: Int) {
        self.maxBytes = maxBytes
        self.maxTrailerBytes = maxTrailerBytes
    }

    mutating func read(from input: [UInt8], at start: inout Int) -> RequestBodyReader.Outcome {
        while true {
            switch state {
            case .size:
                guard let line = Self.line(in: input, from: &start) else {
                    return input.count - start > Self.maxLine ? .malformed("a chunk size line is too long") : .needMore
                }
                guard let size = Self.size(line) else { return .malformed("a chunk size line is not hex digits") }
                if size == 0 {
                    state = .trailer
                } else {
                    guard size <= maxBytes - body.count else { return .tooLarge }
                    remaining = size
                    state = .data
                }
            case .data:
                let available = min(remaining, input.count - start)
                guard available > 0 else { return .needMore }
                body.append(contentsOf: input[start..<(start + available)])
                start += available
                remaining -= available
                if remaining == 0 { state = .dataEnd }
            case .dataEnd:
                guard let line = Self.line(in: input, from: &start) else {
                    return input.count - start >= 2 ? .malformed("a chunk's data is not followed by CR LF") : .needMore
                }
                guard line.isEmpty else { return .malformed("a chunk's data is not followed by CR LF") }
                state = .size
            case .trailer:
                let before = start
                guard let line = Self.line(in: input, from: &start) else {
                    return trailerBytes + input.count - start > maxTrailerBytes
                        ? .malformed("the trailer is larger than \(maxTrailerBytes) bytes") : .needMore
                }
                trailerBytes += start - before
                guard trailerBytes <= maxTrailerBytes else { return .malformed("the trailer is larger than \(maxTrailerBytes) bytes") }
                if line.isEmpty { return .done(body) }
                guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon != line.startIndex,
                      !line.contains(where: { $0 < 0x20 && $0 != 0x09 || $0 == 0x7F })
                else {
                    return .malformed("a trailer line is not a header field")
                }
            }
        }
    }

    /// The size a size line gives: `1*HEXDIG [ *WSP ( ";" ext ) ]`, at most 15 digits; nil
    /// for anything else.
    private static func size(_ line: ArraySlice<UInt8>) -> Int? {
        var index = line.startIndex
        var size = 0
        while index < line.endIndex, let value = RequestHead.hexValue(line[index]) {
            guard index - line.startIndex < 15 else { return nil }
            size = size << 4 | Int(value)
            index += 1
        }
        guard index > line.startIndex else { return nil }
        while index < line.endIndex, line[index] == 0x20 || line[index] == 0x09 { index += 1 }
        guard index == line.endIndex
            || line[index] == UInt8(ascii: ";") && !line[index...].contains(where: { $0 < 0x20 && $0 != 0x09 || $0 == 0x7F })
        else { return nil }
        return size
    }

    /// The next line (without its LF and a CR before it), taken from `input` at `start`; nil
    /// until its LF arrives.
    private static func line(in input: [UInt8], from start: inout Int) -> ArraySlice<UInt8>? {
        guard let end = input[start...].firstIndex(of: 0x0A) else { return nil }
        defer { start = end + 1 }
        let line = input[start..<end]
        return line.last == 0x0D ? line.dropLast() : line
    }
}
