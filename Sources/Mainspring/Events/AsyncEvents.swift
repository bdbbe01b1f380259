import Synchronization

/// The async forms of `readLines(from:)` and `onSignal`: the same sources, consumed with
/// `for await`.
extension EventLoop {
    /// The lines of `fd` as an async sequence of `LineEvent`s, following the rules of
    /// `readLines(from:maxLineLength:_:)`, ending after `.endOfFile` or `.error`.
    ///
    /// ```swift
    /// for await event in try EventLoop.main.lines(from: STDIN_FILENO) { … }
    /// ```
    ///
    /// The reader is registered at once (so a bad fd throws here); it reads only while the
    /// consumer has taken everything read so far (at most one 64 KiB read is held). One consumer
    /// (a second iteration is a precondition failure). Cancelling the iterating task ends the
    /// sequence (`nil`) and cancels the reader; so does dropping the sequence. The fd is not
    /// closed. Loop thread only (the `async` overload works from any task).
    /// - Throws: `EventLoopError.badDescriptor`, `.wrongThread`.
    public func lines(from fd: Int32, maxLineLength: Int = 65_536) throws(EventLoopError) -> Lines {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.lines(from:maxLineLength:)") }
        let feed = LoopFeed<LineEvent>(loop: self, bound: 1)
        let source = try LineReaderSource(loop: self, fd: fd, maxLineLength: maxLineLength) { [weak feed] event in
            feed?.yield(event)
            switch event {
            case .endOfFile, .error: feed?.finish()
            default: break
            }
        }
        feed.attach(source: source, pause: { [unowned source] in source.pause() },
                    resume: { [unowned source] in source.resume() })
        source.onClosed = { [weak feed] in feed?.finish() }
        source.suspendedTasks = { [weak feed] in feed?.suspendedTasks ?? 0 }
        return Lines(feed: feed)
    }

    /// `lines(from:maxLineLength:)` from any task: registers the reader on this loop (no hop
    /// from a task already on it).
    public nonisolated(nonsending) func lines(from fd: Int32, maxLineLength: Int = 65_536) async throws(EventLoopError)
        -> Lines
    {
        try await onLoop { () throws(EventLoopError) in try self.lines(from: fd, maxLineLength: maxLineLength) }
    }

    /// The signals in `signals` as they arrive, as an async sequence of signal numbers.
    ///
    /// ```swift
    /// for await signal in try EventLoop.main.signals([SIGTERM, SIGINT, SIGHUP]) { … }
    /// ```
    ///
    /// The handlers are installed at once, as `onSignal` would (the default action — ending the
    /// process for `SIGTERM` — no longer applies), and stay until the sequence ends: cancelling
    /// the iterating task ends it (`nil`), as does dropping the sequence; the signals' previous
    /// dispositions are then restored. Signals that arrive while the consumer is busy are kept
    /// (up to 64; a signal delivered several times before it is taken may be reported once, as
    /// with any Unix signal handling). One consumer. Loop thread only (the `async` overload
    /// works from any task).
    /// - Throws: `EventLoopError.signalInUse` when another loop watches one of them, `.system`
    ///   for a signal that cannot be caught, `.wrongThread`.
    public func signals(_ signals: [Int32]) throws(EventLoopError) -> Signals {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.signals(_:)") }
        let feed = LoopFeed<Int32>(loop: self, bound: 64)
        var sources: [SignalSource] = []
        for signal in Set(signals).sorted() {
            if signal > 0 && signal < 65 { unblockSignalInCurrentThread(signal) }
            let source = SignalSource(loop: self, signal: signal) { [weak feed] in
                if let feed, feed.buffered < 64 { feed.yield(signal) }
            }
            do {
                try SignalRegistry.shared.register(source)
            } catch {
                source.close()
                for registered in sources { registered.close() }
                throw error
            }
            source.onClosed = { [weak feed] in feed?.finish() }
            source.suspendedTasks = { [weak feed] in feed?.suspendedTasks ?? 0 }
            sources.append(source)
        }
        feed.attach(sources: sources)
        return Signals(feed: feed)
    }

    /// `signals(_:)` from any task: installs the handlers on this loop (no hop from a task
    /// already on it).
    public nonisolated(nonsending) func signals(_ signals: [Int32]) async throws(EventLoopError) -> Signals {
        try await onLoop { () throws(EventLoopError) in try self.signals(signals) }
    }

    /// `EventLoop.lines(from:)`: an `AsyncSequence` of `LineEvent`s.
    public struct Lines: AsyncSequence, Sendable {
        public typealias Element = LineEvent
        public typealias Failure = Never
        let feed: LoopFeed<LineEvent>

        public func makeAsyncIterator() -> Iterator {
            feed.claim("EventLoop.lines(from:)")
            return Iterator(feed: feed)
        }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let feed: LoopFeed<LineEvent>

            public nonisolated(nonsending) mutating func next() async -> LineEvent? { await feed.next() }

            /// `next()`, on the caller's executor (see `Connection.Lines.Iterator`).
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async -> LineEvent? {
                await feed.next()
            }
        }
    }

    /// `EventLoop.signals(_:)`: an `AsyncSequence` of signal numbers.
    public struct Signals: AsyncSequence, Sendable {
        public typealias Element = Int32
        public typealias Failure = Never
        let feed: LoopFeed<Int32>

        public func makeAsyncIterator() -> Iterator {
            feed.claim("EventLoop.signals(_:)")
            return Iterator(feed: feed)
        }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let feed: LoopFeed<Int32>

            public nonisolated(nonsending) mutating func next() async -> Int32? { await feed.next() }

            /// `next()`, on the caller's executor (see `Connection.Lines.Iterator`).
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async -> Int32? {
                await feed.next()
            }
        }
    }

    /// Runs `body` on this loop and returns its result: directly when the caller is on the
    /// loop's thread, otherwise after one hop there.
    nonisolated(nonsending) func onLoop<T>(_ body: @escaping @Sendable () throws(EventLoopError) -> T) async
        throws(EventLoopError) -> T
    {
        try await onLoop(closed: .loopClosed, body)
    }

    /// `onLoop(_:)` for a domain's own error type: `closed` is thrown when the loop has shut
    /// down before `body` could run.
    nonisolated(nonsending) func onLoop<T, Failure: Error>(
        closed: Failure, _ body: @escaping @Sendable () throws(Failure) -> T
    ) async throws(Failure) -> T {
        if isCurrent { return try body() }
        let result: Result<LoopBound<T>, Failure> = await withUnsafeContinuation { continuation in
            execute {
                do throws(Failure) {
                    continuation.resume(returning: .success(LoopBound(try body())))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            } orElse: {
                continuation.resume(returning: .failure(closed))
            }
        }
        return try result.get().value
    }
}

/// A loop-side buffer between a source that produces elements on the loop's thread and one
/// task that consumes them, possibly elsewhere. The producer's source is paused while `bound`
/// elements wait (if it can be), and resumed once they are taken.
///
/// All state is touched on the loop's thread only; the consumer's `next` touches it directly
/// when it runs there, and hops there otherwise. Releasing the feed (the sequence and its
/// iterator gone) closes the sources.
final class LoopFeed<Element: Sendable>: @unchecked Sendable {
    let loop: EventLoop
    private let bound: Int
    private let isClaimed = Atomic<Bool>(false)
    // Loop thread only:
    private var buffer: [Element] = []
    private var first = 0
    private var waiter: UnsafeContinuation<Element?, Never>?
    private var isFinished = false
    private var sources: [Source] = []
    private var pauseSource: (() -> Void)?
    private var resumeSource: (() -> Void)?
    private var isSourcePaused = false

    init(loop: EventLoop, bound: Int) {
        self.loop = loop
        self.bound = bound
    }

    deinit {
        // Nobody consumes any more: close the sources (on their loop).
        let sources = LoopBound(self.sources)
        guard !sources.value.isEmpty else { return }
        if loop.isCurrent {
            for source in sources.value { source.close() }
        } else {
            loop.execute { for source in sources.value { source.close() } }
        }
    }

    func attach(source: Source, pause: @escaping () -> Void, resume: @escaping () -> Void) {
        sources = [source]
        pauseSource = pause
        resumeSource = resume
    }

    func attach(sources: [Source]) { self.sources = sources }

    func claim(_ function: StaticString) {
        let (claimed, _) = isClaimed.compareExchange(expected: false, desired: true, ordering: .relaxed)
        requireUsage(claimed, "Mainspring: \(function): the sequence already has a consumer; iterate it once, from one task")
    }

    var buffered: Int { buffer.count - first }
    var suspendedTasks: Int { waiter == nil ? 0 : 1 }

    /// Producer: one more element.
    func yield(_ element: Element) {
        guard !isFinished else { return }
        if let waiter {
            self.waiter = nil
            loop.resumingInput { waiter.resume(returning: element) }
            return
        }
        buffer.append(element)
        if buffered >= bound, !isSourcePaused, let pauseSource {
            isSourcePaused = true
            pauseSource()
        }
    }

    /// Producer: no more elements (after the buffered ones).
    func finish() {
        guard !isFinished else { return }
        isFinished = true
        pauseSource = nil
        resumeSource = nil
        if let waiter, buffered == 0 {
            self.waiter = nil
            waiter.resume(returning: nil)
        }
    }

    /// Consumer, loop thread: the next element, `nil` at the end, or `.none` to wait.
    private func take() -> Element?? {
        if first < buffer.count {
            let element = buffer[first]
            first += 1
            if first == buffer.count {
                buffer.removeAll(keepingCapacity: buffer.capacity <= 64)
                first = 0
                if isSourcePaused {
                    isSourcePaused = false
                    resumeSource?()
                }
            }
            return .some(element)
        }
        if isFinished { return .some(nil) }
        return .none
    }

    private func takeOrPark(_ continuation: UnsafeContinuation<Element?, Never>) {
        if let element = take() {
            continuation.resume(returning: element)
        } else {
            waiter = continuation
        }
    }

    /// The consumer's task was cancelled: the sequence ends and the sources close.
    private func cancel() {
        for source in sources { source.close() }
        finish()
        if let waiter {
            self.waiter = nil
            waiter.resume(returning: nil)
        }
    }

    nonisolated(nonsending) func next() async -> Element? {
        let isolation = #isolation
        if Task.isCancelled {
            if loop.isCurrent { cancel() } else { loop.execute { self.cancel() } }
            return nil
        }
        if loop.isCurrent, let element = take() { return element }
        let loop = self.loop
        return await withTaskCancellationHandler(operation: {
            await withUnsafeContinuation(isolation: isolation) { (continuation: UnsafeContinuation<Element?, Never>) in
                if loop.isCurrent {
                    self.takeOrPark(continuation)
                } else {
                    loop.execute {
                        self.takeOrPark(continuation)
                    } orElse: {
                        continuation.resume(returning: nil)  // the loop is gone
                    }
                }
            }
        }, onCancel: {
            loop.execute { self.cancel() }
        }, isolation: isolation)
    }
}
