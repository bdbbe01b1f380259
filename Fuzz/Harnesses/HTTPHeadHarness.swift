@_spi(Fuzzing) import MainspringHTTP

extension FuzzHarness {
    /// The HTTP server's head guard (the request framing checks before the engine parses a head):
    /// its verdict must not depend on how the bytes arrive — whole, a byte at a time, or in
    /// pseudo-random pieces — and, for a complete head, must be the status a plain reading of
    /// the head's lines gives (`plainStatus`): two different `Content-Length`s or one that is
    /// not all digits, `Transfer-Encoding` beside `Content-Length`, a control character, a
    /// bare CR, a folded line or whitespace in a name are 400; a `Transfer-Encoding` other than
    /// `chunked` 501; an HTTP/1.1 request without exactly one `Host` 400.
    public static func httpHead(_ input: [UInt8]) {
        let whole = RequestHeadCheck.verdict(input, pieces: [input.count])
        precondition(RequestHeadCheck.verdict(input, pieces: [1]) == whole, "byte-by-byte feeding changed the verdict")
        let sizes = pieceSizes(seed: UInt32(truncatingIfNeeded: input.count), mixing: input.prefix(16), largest: 11)
        let cut = RequestHeadCheck.verdict(input, pieces: sizes)
        precondition(cut == whole, "chunking changed the verdict: \(cut) vs \(whole)")
        precondition(!whole.isOversized, "a fuzz input over 1 MiB")
        let plain = plainVerdict(input)
        precondition(whole.isComplete == plain.isComplete, "the head's end: \(whole) vs \(plain)")
        precondition(whole.status == plain.status, "status \(String(describing: whole.status)), the lines say \(plain)")
        if whole.status != nil { precondition(whole.reason.map { !$0.isEmpty && $0.count < 200 } == true, "bad reason text") }
    }

    /// The guard's rules read plainly off the head's lines: whether the head is complete (a line
    /// of nothing but CRs ends it), and the status it is refused with (nil: accepted, or not
    /// complete).
    private static func plainVerdict(_ input: [UInt8]) -> (isComplete: Bool, status: Int?) {
        let cr: UInt8 = 0x0D, tab: UInt8 = 0x09, space: UInt8 = 0x20
        var lines: [ArraySlice<UInt8>] = []
        var start = 0
        var complete = false
        for index in input.indices where input[index] == 0x0A {
            let line = input[start..<index]
            if line.allSatisfy({ $0 == cr }) {
                complete = true
                break
            }
            lines.append(line)
            start = index + 1
        }
        guard complete else { return (false, nil) }
        let isHTTP11 = lines.first.map { Array($0.filter { $0 != cr }.suffix(8)) == Array("HTTP/1.1".utf8) } ?? false
        var malformed = false
        var hosts = 0
        var lengths: [Int?] = []
        var codings: [Bool] = []
        for line in lines.dropFirst() {
            let body = line.last == cr ? line.dropLast() : line
            if body.contains(cr) || body.contains(where: { ($0 < 0x20 && $0 != tab) || $0 == 0x7F }) { malformed = true }
            let name = body.prefix { $0 != 0x3A }
            if name.contains(space) || name.contains(tab) { malformed = true }
            guard name.count < body.count else { continue }  // no colon: no field the guard reads
            var value = body.dropFirst(name.count + 1)
            switch String(decoding: name.map(asciiLowercased), as: UTF8.self) {
            case "host":
                hosts += 1
            case "content-length":
                while let first = value.first, first == space || first == tab { value = value.dropFirst() }
                while let last = value.last, last == space || last == tab { value = value.dropLast() }
                let isNumber = (1...18).contains(value.count) && value.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
                lengths.append(isNumber ? Int(String(decoding: value, as: UTF8.self)) : nil)
            case "transfer-encoding":
                while value.first == space { value = value.dropFirst() }  // spaces only, as the guard
                while let last = value.last, last == space || last == tab { value = value.dropLast() }
                codings.append(value.map(asciiLowercased) == Array("chunked".utf8))
            default:
                break
            }
        }
        if malformed { return (true, 400) }
        if lengths.contains(where: { $0 == nil }) { return (true, 400) }
        if Set(lengths.compactMap { $0 }).count > 1 { return (true, 400) }
        if !codings.isEmpty {
            if !lengths.isEmpty { return (true, 400) }
            if codings.contains(false) { return (true, 501) }
            if codings.count > 1 { return (true, 400) }
        }
        if isHTTP11 && hosts != 1 { return (true, 400) }
        return (true, nil)
    }

    private static func asciiLowercased(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte }
}
