/// Input that lines can be split from where it lies: libevent's `evbuffer` (a connection's
/// input), or an array in the tests. The splitter reads it in place and removes only what a
/// reader has taken, so a reader that stops leaves the rest — whole — for the next one.
protocol SplittableInput {
    /// Bytes buffered.
    var count: Int { get }
    /// Calls `body` with the first `limit` buffered bytes (or all, if fewer), piece by piece, in
    /// order, until it returns false. The pieces are valid only during the call.
    func forEachExtent(upTo limit: Int, _ body: (UnsafeBufferPointer<UInt8>) -> Bool)
    /// A copy of `count` bytes starting `offset` bytes in (a line that spans two pieces).
    func copyBytes(from offset: Int, count: Int) -> [UInt8]
    /// Removes the first `count` bytes.
    func drain(_ count: Int)
}

/// A line split from the input, and how many input bytes it stands for (its terminator
/// included, nothing for `.endOfFile`): what a reader consumes by taking it.
struct SplitLine {
    let event: LineEvent
    let length: Int
}

/// The `LineEvent` rules of `LineSplitter`, applied to input that stays in its buffer: lines are
/// found and copied out (as the `String`s of their events), but the input is only drained as
/// lines are taken (`LineQueue.settle`), so that what was split and not taken is still there,
/// byte for byte, for another kind of reader.
///
/// Same rules as `LineSplitter`: LF ends a line, a CR before it is dropped, a line over
/// `maxLineLength` is `.tooLong` (never buffered whole: once an unfinished line passes
/// `maxLineLength` + 1 bytes it is drained as it arrives, counted, and reported when its end
/// comes), invalid UTF-8 is `.invalidUTF8`, NUL bytes are kept, a final line without LF comes
/// before `.endOfFile`. One difference, which only a reader switch can see: a line being
/// skipped as too long when another reader takes over is abandoned where it stands (the new
/// reader gets its rest).
///
/// State is a few words: where the unfinished line at the front stands.
struct InPlaceLineSplitter {
    let maxLineLength: Int
    /// Bytes at the front of the input known to hold no LF (the unfinished line's, searched
    /// already), so that a long line arriving in pieces is searched once.
    private(set) var scanned = 0
    /// Bytes already drained of a line that is too long and being skipped.
    private(set) var skipped: Int?
    /// Whether the last skipped byte was a CR (the LF may come in the next piece).
    private var skippedEndsWithCR = false

    init(maxLineLength: Int) {
        self.maxLineLength = max(1, maxLineLength)
    }

    /// Another reader consumed the input: the front is no longer the unfinished line.
    mutating func reset() {
        scanned = 0
        skipped = nil
        skippedEndsWithCR = false
    }

    /// Splits lines from the front of `input` — which must hold nothing already split — into
    /// `queue`, until about `slice` bytes are split or the input has no complete line left.
    /// An unfinished line stays in the input (or, past `maxLineLength` + 1 bytes with nothing
    /// queued before it, is drained and counted as skipped). With `atEnd` (the peer closed and
    /// nothing more can come), what is left becomes the final line, then `.endOfFile` is
    /// queued. Returns the bytes looked at.
    /// - Complexity: O(bytes split), plus O(pieces) to reach the unsearched part.
    mutating func split(_ input: some SplittableInput, slice: Int, atEnd: Bool, into queue: inout LineQueue) -> Int {
        let available = input.count
        let limit = slice >= available - scanned ? available : scanned + slice
        var position = 0  // where the current piece starts
        var lineStart = 0  // where the current line starts
        var lastByte: UInt8 = 0
        var stoppedEarly = false
        assert(queue.isEmpty && queue.taken == 0, "split with lines already split in the input")
        input.forEachExtent(upTo: limit) { piece in
            guard let base = piece.baseAddress, piece.count > 0 else { return true }
            var local = max(0, scanned &+ lineStart - position)
            while local < piece.count {
                guard let found = findNewline(base + local, count: piece.count - local) else { break }
                let newline = position + (found - base)
                emitLine(from: input, start: lineStart, newline: newline, piece: piece, piecePosition: position,
                         into: &queue)
                lineStart = newline + 1
                local = newline + 1 - position
                scanned = 0
                if lineStart >= slice {
                    stoppedEarly = true
                    return false
                }
            }
            lastByte = piece[piece.count - 1]
            position += piece.count
            return true
        }
        if stoppedEarly { return lineStart }
        // The input walked ends in an unfinished line of `partial` bytes, none of them a LF.
        let partial = position - lineStart
        if position < available {
            // Only part of the input was looked at (the slice): the rest is searched next time.
            scanned = partial
            return position
        }
        if atEnd {
            finishLine(input, start: lineStart, count: partial, into: &queue)
            return position
        }
        scanned = partial
        if partial > 0 && queue.isEmpty && (skipped != nil || partial > maxLineLength + 1) {
            // Too long already, and at the front of the input: skip what has arrived of it.
            skipped = (skipped ?? 0) + partial
            skippedEndsWithCR = lastByte == 0x0D
            input.drain(partial)
            scanned = 0
        }
        return position
    }

    /// Queues the line that ends at the LF at `newline` (input offsets).
    private mutating func emitLine(from input: some SplittableInput, start: Int, newline: Int,
                                   piece: UnsafeBufferPointer<UInt8>, piecePosition: Int, into queue: inout LineQueue)
    {
        let length = newline + 1 - start
        if let count = skipped {
            let endsWithCR = newline == start
                ? skippedEndsWithCR : byte(at: newline - 1, input: input, piece: piece, piecePosition: piecePosition) == 0x0D
            skipped = nil
            skippedEndsWithCR = false
            queue.append(SplitLine(event: .tooLong(count + newline - start - (endsWithCR ? 1 : 0)), length: length))
            return
        }
        var end = newline
        if end > start && byte(at: end - 1, input: input, piece: piece, piecePosition: piecePosition) == 0x0D { end -= 1 }
        let count = end - start
        if count > maxLineLength {
            queue.append(SplitLine(event: .tooLong(count), length: length))
        } else if start >= piecePosition {
            // Within the current piece: read in place.
            let bytes = UnsafeBufferPointer(rebasing: piece[(start - piecePosition)..<(end - piecePosition)])
            queue.append(SplitLine(event: Self.event(for: bytes), length: length))
        } else {
            // The line spans pieces: copy it out (rare: pieces are 4 KiB and more).
            let bytes = input.copyBytes(from: start, count: count)
            let event = bytes.withUnsafeBufferPointer { Self.event(for: $0) }
            queue.append(SplitLine(event: event, length: length))
        }
    }

    /// The input ended: `count` bytes from `start` are the final line (or the end of one being
    /// skipped); then `.endOfFile`.
    private mutating func finishLine(_ input: some SplittableInput, start: Int, count: Int, into queue: inout LineQueue) {
        if skipped != nil || count > maxLineLength + 1 {
            // Too long: only its last byte matters (a CR is not counted).
            let endsWithCR = count > 0 ? input.copyBytes(from: start + count - 1, count: 1).first == 0x0D : skippedEndsWithCR
            let total = (skipped ?? 0) + count - (endsWithCR ? 1 : 0)
            skipped = nil
            skippedEndsWithCR = false
            queue.append(SplitLine(event: .tooLong(total), length: count))
        } else if count > 0 {
            var bytes = input.copyBytes(from: start, count: count)
            if bytes.last == 0x0D { bytes.removeLast() }
            let event: LineEvent = bytes.count > maxLineLength
                ? .tooLong(bytes.count) : bytes.withUnsafeBufferPointer { Self.event(for: $0) }
            queue.append(SplitLine(event: event, length: count))
        }
        scanned = 0
        queue.append(SplitLine(event: .endOfFile, length: 0))
    }

    private func byte(at offset: Int, input: some SplittableInput, piece: UnsafeBufferPointer<UInt8>,
                      piecePosition: Int) -> UInt8
    {
        if offset >= piecePosition { return piece[offset - piecePosition] }
        return input.copyBytes(from: offset, count: 1).first ?? 0
    }

    private static func event(for bytes: UnsafeBufferPointer<UInt8>) -> LineEvent {
        if let text = utf8String(validating: bytes) { return .line(text) }
        return .invalidUTF8(bytes.count)
    }
}

/// The first LF in `count` bytes from `start`.
@inline(__always)
private func findNewline(_ start: UnsafePointer<UInt8>, count: Int) -> UnsafePointer<UInt8>? {
    UnsafeBufferPointer(start: start, count: count).withMemoryRebound(to: UInt8.self) { buffer in
        buffer.firstIndex(of: 0x0A).map { start + $0 }
    }
}

/// Lines split but not yet taken, and the bytes of those taken but not yet drained from the
/// input. Taking a line is an index step; `settle` drains what was taken, in one call.
///
/// The first line waiting is held inline: a reader that takes each line as it comes (one
/// request at a time) never needs the array, so an idle connection holds no buffer for it. The
/// array holds the lines behind that one (a pipelined burst) and keeps its capacity, up to 256
/// lines, so that bursts allocate nothing either.
struct LineQueue {
    /// The next line to take, when it is ahead of every line in `rest`.
    private var head: SplitLine?
    /// Lines behind `head`, from `next` on.
    private var rest: [SplitLine] = []
    private var next = 0
    /// Bytes of the lines taken since the last `settle`.
    private(set) var taken = 0

    var isEmpty: Bool { head == nil && next == rest.count }

    /// Lines waiting to be taken.
    var count: Int { (head == nil ? 0 : 1) + rest.count - next }

    /// The capacity of the array behind the inline line (0 until a burst needed one).
    var arrayCapacity: Int { rest.capacity }

    mutating func append(_ line: SplitLine) {
        if head == nil && next == rest.count {
            head = line
        } else {
            rest.append(line)
        }
    }

    /// The next line, if any (its bytes are drained at the next `settle`).
    mutating func take() -> LineEvent? {
        if let line = head {
            head = nil
            taken &+= line.length
            return line.event
        }
        guard next < rest.count else { return nil }
        let line = rest[next]
        next += 1
        taken &+= line.length
        return line.event
    }

    /// Drains the taken lines' bytes from `input`; once every line is taken, the queue empties
    /// (giving back a burst's capacity).
    mutating func settle(_ input: some SplittableInput) {
        if taken > 0 {
            input.drain(taken)
            taken = 0
        }
        if head == nil && next == rest.count && next > 0 {
            rest.removeAll(keepingCapacity: rest.capacity <= 256)
            next = 0
        }
    }

    /// Drains what was taken and forgets the lines not taken: their bytes are still in the
    /// input, for a reader of another kind.
    mutating func abandon(_ input: some SplittableInput) {
        settle(input)
        head = nil
        rest.removeAll(keepingCapacity: rest.capacity <= 256)
        next = 0
    }

    /// Forgets everything (the input is gone).
    mutating func clear() {
        head = nil
        rest = []
        next = 0
        taken = 0
    }
}
