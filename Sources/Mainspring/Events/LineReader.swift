#if canImport(Glibc)
import Glibc
#endif

/// `readLines(from:maxLineLength:_:)`: reads an fd as it becomes readable and reports lines.
final class LineReaderSource: DescriptorSource {
    private var handler: ((LineEvent) -> Void)?
    private var splitter: LineSplitter
    private var buffer: [UInt8]
    private var events: [LineEvent] = []

    /// Bytes read per readiness event. Level-triggered polling brings the reader back for more,
    /// so one read per turn keeps other sources interleaved and never blocks a blocking fd.
    static let readSize = 65_536

    init(loop: EventLoop, fd: Int32, maxLineLength: Int, handler: @escaping (LineEvent) -> Void)
        throws(EventLoopError)
    {
        self.handler = handler
        self.splitter = LineSplitter(maxLineLength: maxLineLength)
        self.buffer = [UInt8](repeating: 0, count: Self.readSize)
        try super.init(loop: loop, fd: fd, events: .read, priority: .input)
    }

    /// Whether reading is paused (`pause()`): the fd is not polled meanwhile.
    private(set) var isPaused = false
    /// Runs once when the reader closes (end of input, error, cancel, the loop going away).
    var onClosed: (() -> Void)?
    /// Async operations suspended on this reader (the task iterating `EventLoop.lines(from:)`).
    var suspendedTasks: () -> Int = { 0 }

    /// Stops reading until `resume()`: for a consumer that has not taken what was read.
    func pause() {
        guard !isPaused, !isClosed else { return }
        isPaused = true
        native?.delete()
    }

    func resume() {
        guard isPaused, !isClosed else { return }
        isPaused = false
        if isAlwaysReady { loop.enqueueNextTurn(source: self) } else { resumeNative() }
    }

    /// The loop refused to poll the fd again: the reader reports `.error(errno)` and ends.
    override func failed(_ error: EventLoopError) {
        events.append(.error(error.errnoCode))
        deliver()
        close()
    }

    override func didRun() {
        if !isPaused { super.didRun() }
    }

    override func perform(_ readiness: Readiness) {
        guard !isPaused else { return }
        switch readOnce(fd, into: &buffer) {
        case .bytes(0):
            splitter.finish { events.append($0) }
        case .bytes(let n):
            splitter.append(buffer[0..<n]) { events.append($0) }
        case .wouldBlock:
            return
        case .failure(let code):
            events.append(.error(code))
        }
        deliver()
    }

    /// Hands the collected events to the handler, stopping if it cancels the reader; ends the
    /// reader after `.endOfFile` or `.error`.
    private func deliver() {
        var index = 0
        while index < events.count, !isClosed, let handler {
            let event = events[index]
            index += 1
            handler(event)
            switch event {
            case .endOfFile, .error: close()
            default: break
            }
        }
        events.removeAll(keepingCapacity: true)
    }

    override func endStale() {
        // The fd was closed behind the reader's back and its number reused.
        events.append(.error(EBADF))
        deliver()
    }

    override func didClose() {
        handler = nil
        let closed = onClosed
        onClosed = nil
        closed?()
    }
}

extension EventLoop {
    /// Reads `fd` on this loop and calls `handler` with each line and each problem, in order,
    /// following the `LineEvent` rules: LF or CRLF endings, a final line without newline
    /// delivered before `.endOfFile`, overlong lines reported as `.tooLong` and skipped up to the
    /// next newline, invalid UTF-8 as `.invalidUTF8`, NUL bytes kept. `.endOfFile` or `.error`
    /// comes once; the reader then cancels itself. Memory stays within `maxLineLength` plus a
    /// 64 KiB read buffer, however long the input lines are.
    ///
    /// Reads at `.input` priority, one `read(2)` of up to 64 KiB per turn, so the fd may stay
    /// blocking (stdin is left as it is). Regular files and `/dev/null` work too. The reader
    /// does not close `fd`. Loop thread only.
    /// - Throws: `EventLoopError.badDescriptor` when `fd` is not open, `.wrongThread` off the
    ///   loop's thread.
    @available(*, noasync, message: "loop thread only; in async code iterate `lines(from:)`")
    public func readLines(from fd: Int32, maxLineLength: Int = 65_536,
                          _ handler: @escaping (LineEvent) -> Void) throws(EventLoopError) -> Watcher
    {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.readLines(from:maxLineLength:_:)") }
        let source = try LineReaderSource(loop: self, fd: fd, maxLineLength: maxLineLength, handler: handler)
        return Watcher(source: source)
    }
}
