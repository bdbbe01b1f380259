import Mainspring

/// Fuzz harnesses: each takes arbitrary bytes, drives one parser with them, and traps (via
/// `precondition`) when an invariant breaks. libFuzzer calls them through `mainspring-fuzz`;
/// the test suite replays the committed corpus through the same functions.
public enum FuzzHarness {
    /// The line splitter must report the same events however the input is cut into chunks, and
    /// its events must add up: every byte is in exactly one line (plus its terminator), a line
    /// never holds a newline or exceeds the limit, `.endOfFile` comes once, last.
    ///
    /// The first input byte picks the maximum line length (1...64) and a chunking seed, so the
    /// fuzzer explores both.
    public static func lineSplitter(_ input: [UInt8]) {
        guard let control = input.first else { return }
        let data = Array(input.dropFirst())
        let maxLength = Int(control & 0x3F) + 1
        let reference = split(data, maxLength: maxLength, chunkSizes: [data.count + 1])
        // Cut the same input into chunks of pseudo-random sizes from the control byte.
        let sizes = pieceSizes(seed: UInt32(control), largest: 7)
        let chunked = split(data, maxLength: maxLength, chunkSizes: sizes)
        precondition(chunked == reference, "chunking changed the events: \(chunked) vs \(reference)")
        let oneByOne = split(data, maxLength: maxLength, chunkSizes: [1])
        precondition(oneByOne == reference, "byte-by-byte feeding changed the events")
        check(reference, data: data, maxLength: maxLength)
    }

    private static func split(_ data: [UInt8], maxLength: Int, chunkSizes: [Int]) -> [LineEvent] {
        var splitter = LineSplitter(maxLineLength: maxLength)
        var events: [LineEvent] = []
        var offset = 0
        var turn = 0
        while offset < data.count {
            let size = min(chunkSizes[turn % chunkSizes.count], data.count - offset)
            splitter.append(data[offset..<(offset + size)]) { events.append($0) }
            offset += size
            turn += 1
        }
        splitter.finish { events.append($0) }
        return events
    }

    private static func check(_ events: [LineEvent], data: [UInt8], maxLength: Int) {
        precondition(events.last == .endOfFile, "the last event is not .endOfFile")
        precondition(events.filter { $0 == .endOfFile }.count == 1, ".endOfFile more than once")
        let newlines = data.filter { $0 == 0x0A }.count
        let finalLine = !data.isEmpty && data.last != 0x0A ? 1 : 0
        precondition(events.count - 1 == newlines + finalLine, "\(events.count - 1) events for \(newlines + finalLine) lines")
        var accounted = 0
        for event in events {
            switch event {
            case .line(let text):
                precondition(!text.utf8.contains(0x0A), "a line holds a newline")
                precondition(text.utf8.count <= maxLength, "a delivered line exceeds the limit")
                accounted += text.utf8.count
            case .tooLong(let bytes):
                precondition(bytes > maxLength, "tooLong(\(bytes)) within the limit \(maxLength)")
                accounted += bytes
            case .invalidUTF8(let bytes):
                precondition(bytes <= maxLength, "invalidUTF8 beyond the limit")
                accounted += bytes
            case .endOfFile:
                break
            case .error:
                preconditionFailure("the splitter never reports errors")
            }
        }
        // Every byte is content, a newline, or a CR dropped before a newline or at the end.
        let crs = data.count - accounted - newlines
        precondition(crs >= 0 && crs <= newlines + finalLine, "\(crs) bytes unaccounted for")
    }
}
