// The header fields of an HTTP/1.x head, read by one set of rules for requests (the server's
// engine) and responses (the client): how a field line must look, and how a message's body is
// framed — the rules that refuse request smuggling and response splitting (RFC 9112 §5, §6.3),
// in one place. Two readers that disagree on where a message ends are the whole of those
// attacks, so what either side cannot read one way only, it refuses.

/// The header fields of a head and what they say about its body. Loop thread.
struct HeadFields {
    /// The fields, in order, their values without the whitespace around them.
    var fields: [(name: String, value: String)] = []
    /// How the body is framed, by `Content-Length` and `Transfer-Encoding` alone.
    var framing = DeclaredFraming.none
    /// `Host` fields seen.
    var hostFields = 0
    /// The first `Connection` and `Proxy-Connection` values and the first `Expect` value, as
    /// ranges of the head (read with its `HeadBytes`).
    var firstConnection: Range<Int>?
    var firstProxyConnection: Range<Int>?
    var expectation: Range<Int>?
    /// The first line without a colon (or with nothing before it), if any: a reader refuses it
    /// (`MalformedLine.noColon`) once it has judged what it judges first (a request's line and
    /// `Host`). Not among `fields`.
    var lineWithoutColon: Range<Int>?

    /// What the length fields say: no body field, a length (0 included), or chunked.
    enum DeclaredFraming: Equatable {
        case none
        case length(Int)
        case chunked
    }

    /// Why a head's fields are refused. The first malformed line wins over a framing problem.
    enum Problem: Error, Equatable {
        /// A field line is malformed (`line` is its range in the head).
        case malformed(MalformedLine, line: Range<Int>)
        /// A `Content-Length` value is not one number of digits (`value`: its range).
        case lengthNotANumber(value: Range<Int>)
        /// Two `Content-Length` fields with different values.
        case lengthsDiffer
        /// `Transfer-Encoding` beside `Content-Length`.
        case lengthAndEncoding
        /// A transfer coding other than exactly `chunked` (`value`: its range).
        case codingNotChunked(value: Range<Int>)
        /// `Transfer-Encoding: chunked` in more than one field.
        case chunkedTwice

        /// The sentence a refusal says it with.
        var reason: String {
            switch self {
            case .malformed(let why, _): why.reason
            case .lengthNotANumber: "Content-Length is not a number (digits only)"
            case .lengthsDiffer: "two Content-Length header fields with different values"
            case .lengthAndEncoding: "a message has Transfer-Encoding or Content-Length, not both"
            case .codingNotChunked: "only Transfer-Encoding: chunked is supported"
            case .chunkedTwice: "Transfer-Encoding: chunked more than once"
            }
        }
    }

    /// How a field line can be malformed.
    enum MalformedLine: Equatable {
        case controlCharacter, bareCR, folded, spaceInName, noColon

        var reason: String {
            switch self {
            case .controlCharacter: "a header field holds a control character"
            case .bareCR: "a header line holds a CR that is not followed by LF"
            case .folded: "a header line starts with whitespace (obsolete line folding)"
            case .spaceInName: "a header field name holds whitespace"
            case .noColon: "a header line has no field name and colon"
            }
        }
    }

    /// Reads field lines from `head` up to the blank line that ends them (a line of nothing but
    /// CRs) or the end of the buffer. Every line is read whatever is found: a malformed line
    /// (a control character but tab, a CR not right before the LF, whitespace before the colon
    /// or at the start of the line) is reported before the framing (`Content-Length` all
    /// digits, two only if equal, never beside `Transfer-Encoding`, which must be exactly
    /// `chunked`, once); a line without a colon is left to the caller (`lineWithoutColon`).
    static func read(_ head: inout HeadBytes) -> Result<HeadFields, Problem> {
        var result = HeadFields()
        var malformed: Problem?
        var lengthFields = 0
        var length = 0
        var lengthProblem: Problem?
        var codingFields = 0
        var codingProblem: Problem?
        let buffer = head.buffer
        while let line = head.nextLine() {
            if line.allSatisfy({ buffer[$0] == 0x0D }) { break }  // the blank line
            // The bytes of the line in order: the first malformed thing of the head wins.
            var colon: Int?
            for index in line where malformed == nil {
                let byte = buffer[index]
                if byte == 0x0D {
                    malformed = .malformed(.bareCR, line: line)  // a CR left inside the line
                } else if byte < 0x20 && byte != 0x09 || byte == 0x7F {
                    malformed = .malformed(.controlCharacter, line: line)
                } else if colon == nil {
                    if byte == 0x3A {
                        colon = index
                    } else if byte == 0x20 || byte == 0x09 {
                        malformed = .malformed(index == line.lowerBound ? .folded : .spaceInName, line: line)
                    }
                }
            }
            if malformed == nil, colon == nil { colon = head.firstIndex(of: 0x3A, in: line) }
            guard let colon, colon > line.lowerBound else {
                if result.lineWithoutColon == nil { result.lineWithoutColon = line }
                continue
            }
            let name = line.lowerBound..<colon
            let value = head.value(of: line, after: colon)
            switch name.count {
            case 4 where head.matches(name, "host"):
                result.hostFields += 1
            case 14 where head.matches(name, "content-length"):
                if let number = head.decimal(value) {
                    if lengthFields == 0 {
                        length = number
                    } else if number != length, lengthProblem == nil {
                        lengthProblem = .lengthsDiffer
                    }
                } else if lengthProblem == nil || lengthProblem == .lengthsDiffer {
                    lengthProblem = .lengthNotANumber(value: value)
                }
                lengthFields += 1
            case 17 where head.matches(name, "transfer-encoding"):
                // Leading spaces (not tabs) and trailing whitespace aside, exactly `chunked`.
                var start = colon + 1
                while start < line.upperBound, buffer[start] == 0x20 { start += 1 }
                var end = line.upperBound
                while end > start, buffer[end - 1] == 0x20 || buffer[end - 1] == 0x09 { end -= 1 }
                if !head.matches(start..<end, "chunked"), codingProblem == nil {
                    codingProblem = .codingNotChunked(value: value)
                }
                codingFields += 1
            case 10 where head.matches(name, "connection"):
                if result.firstConnection == nil { result.firstConnection = value }
            case 16 where head.matches(name, "proxy-connection"):
                if result.firstProxyConnection == nil { result.firstProxyConnection = value }
            case 6 where head.matches(name, "expect"):
                result.expectation = value
            default:
                break
            }
            result.fields.append((head.string(name), head.string(value)))
        }
        if let malformed { return .failure(malformed) }
        if let lengthProblem { return .failure(lengthProblem) }
        if codingFields > 0 {
            if lengthFields > 0 { return .failure(.lengthAndEncoding) }
            if let codingProblem { return .failure(codingProblem) }
            if codingFields > 1 { return .failure(.chunkedTwice) }
            result.framing = .chunked
        } else if lengthFields > 0 {
            result.framing = .length(length)
        }
        return .success(result)
    }
}
