import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// An input buffer in pieces, like libevent's chains: what `InPlaceLineSplitter` reads in place.
final class PieceInput: SplittableInput {
    var pieces: [[UInt8]] = []

    var count: Int { pieces.reduce(0) { $0 + $1.count } }

    func append(_ bytes: [UInt8]) { if !bytes.isEmpty { pieces.append(bytes) } }

    func forEachExtent(upTo limit: Int, _ body: (UnsafeBufferPointer<UInt8>) -> Bool) {
        var left = limit
        for piece in pieces where left > 0 {
            let take = min(left, piece.count)
            left -= take
            let more = piece.withUnsafeBufferPointer { body(UnsafeBufferPointer(rebasing: $0[0..<take])) }
            if !more { return }
        }
    }

    func copyBytes(from offset: Int, count: Int) -> [UInt8] {
        Array(pieces.joined().dropFirst(offset).prefix(count))
    }

    func drain(_ count: Int) {
        var left = count
        while left > 0, let first = pieces.first {
            if first.count <= left {
                left -= first.count
                pieces.removeFirst()
            } else {
                pieces[0].removeFirst(left)
                left = 0
            }
        }
    }

    /// Everything, as one array.
    var bytes: [UInt8] { Array(pieces.joined()) }
}

/// A deterministic generator (the tests must be reproducible).
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite("Splitting lines in place (the connection reader's framing)")
struct InPlaceLineSplitterTests {
    /// Feeds `input` in the given pieces, splitting after each, taking every line at once.
    private func splitAll(_ chunks: [[UInt8]], maxLineLength: Int, slice: Int) -> [LineEvent] {
        let input = PieceInput()
        var splitter = InPlaceLineSplitter(maxLineLength: maxLineLength)
        var queue = LineQueue()
        var events: [LineEvent] = []
        func drainQueue() {
            while let event = queue.take() { events.append(event) }
            queue.settle(input)
        }
        for chunk in chunks {
            input.append(chunk)
            while true {
                let before = input.count
                _ = splitter.split(input, slice: slice, atEnd: false, into: &queue)
                let split = !queue.isEmpty
                drainQueue()
                if !split && input.count == before { break }
            }
        }
        while events.last != .endOfFile {
            _ = splitter.split(input, slice: slice, atEnd: true, into: &queue)
            drainQueue()
        }
        return events
    }

    private func reference(_ chunks: [[UInt8]], maxLineLength: Int) -> [LineEvent] {
        var splitter = LineSplitter(maxLineLength: maxLineLength)
        var events: [LineEvent] = []
        for chunk in chunks { splitter.append(chunk[...]) { events.append($0) } }
        splitter.finish { events.append($0) }
        return events
    }

    @Test("the same events as LineSplitter, for random input in random pieces (10,000 cases)")
    func matchesLineSplitter() {
        var random = SplitMix(state: 42)
        let alphabet: [UInt8] = [0x61, 0x62, 0x0A, 0x0D, 0x00, 0xFF, 0xC3, 0xA9, 0x0A, 0x63]
        for round in 0..<10_000 {
            let maxLineLength = Int.random(in: 1...12, using: &random)
            let length = Int.random(in: 0...80, using: &random)
            let bytes = (0..<length).map { _ in alphabet.randomElement(using: &random)! }
            var chunks: [[UInt8]] = []
            var offset = 0
            while offset < bytes.count {
                let size = Int.random(in: 1...9, using: &random)
                chunks.append(Array(bytes[offset..<min(bytes.count, offset + size)]))
                offset += size
            }
            let slice = Int.random(in: 1...20, using: &random)
            let got = splitAll(chunks, maxLineLength: maxLineLength, slice: slice)
            let want = reference(chunks, maxLineLength: maxLineLength)
            #expect(got == want, "round \(round): \(bytes) in \(chunks.map(\.count)), max \(maxLineLength), slice \(slice)")
            if got != want { return }
        }
    }

    @Test("lines not taken stay in the input, byte for byte, for another reader")
    func untakenLinesStay() {
        let input = PieceInput()
        input.append(Array("one\r\ntwo\nthree\nrest without newline".utf8))
        var splitter = InPlaceLineSplitter(maxLineLength: 100)
        var queue = LineQueue()
        _ = splitter.split(input, slice: 1_000, atEnd: false, into: &queue)
        #expect(queue.count == 3)
        #expect(queue.take() == .line("one"))
        queue.abandon(input)  // another kind of reader takes over
        splitter.reset()
        #expect(input.bytes == Array("two\nthree\nrest without newline".utf8))
    }

    @Test("an unfinished line waits in the input, searched once, and a too-long one is skipped as it arrives")
    func unfinishedAndTooLong() {
        let input = PieceInput()
        var splitter = InPlaceLineSplitter(maxLineLength: 8)
        var queue = LineQueue()
        input.append(Array("abc".utf8))
        _ = splitter.split(input, slice: 100, atEnd: false, into: &queue)
        #expect(queue.isEmpty && input.count == 3 && splitter.scanned == 3)
        input.append(Array("defghijklmnop".utf8))  // now 16 bytes without a newline: too long
        _ = splitter.split(input, slice: 100, atEnd: false, into: &queue)
        #expect(queue.isEmpty && input.count == 0 && splitter.skipped == 16, "skipped, not buffered")
        input.append(Array("qr\r\nnext\n".utf8))
        _ = splitter.split(input, slice: 100, atEnd: false, into: &queue)
        #expect(queue.take() == .tooLong(18))
        #expect(queue.take() == .line("next"))
    }

    @Test("the line queue keeps its order whether a line waits inline or behind others (random appends, takes, settles and abandons against an array)")
    func queueOrderAgainstModel() {
        var generator = SplitMix(state: 24)
        for round in 0..<200 {
            let input = PieceInput()
            var queue = LineQueue()
            var model: [String] = []
            var nextLine = 0
            var takenBytes = 0
            for _ in 0..<60 {
                switch Int.random(in: 0..<10, using: &generator) {
                case 0..<4:
                    let text = "line\(nextLine)"
                    nextLine += 1
                    input.append(Array((text + "\n").utf8))
                    queue.append(SplitLine(event: .line(text), length: text.utf8.count + 1))
                    model.append(text)
                case 4..<8:
                    let got = queue.take()
                    let want = model.isEmpty ? nil : model.removeFirst()
                    #expect(got == want.map { .line($0) }, "round \(round)")
                    if let want { takenBytes += want.utf8.count + 1 }
                case 8:
                    let before = input.count
                    queue.settle(input)
                    #expect(input.count == before - takenBytes, "round \(round): settle drains what was taken")
                    takenBytes = 0
                default:
                    queue.abandon(input)
                    takenBytes = 0
                    // The lines not taken are forgotten by the queue, and still in the input.
                    let rest = model.map { (line: String) in line + "\n" }.joined()
                    #expect(input.bytes == Array(rest.utf8), "round \(round): abandon keeps what was not taken")
                    model = []
                    input.drain(input.count)
                }
                #expect(queue.count == model.count && queue.isEmpty == model.isEmpty, "round \(round)")
            }
        }
    }
}
