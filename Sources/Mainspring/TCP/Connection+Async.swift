/// The async side of `Connection`: input as async sequences, writes that wait for the peer,
/// the close as something to await.
///
/// Every member here works from any task. It runs on the caller's executor (`nonisolated
/// (nonsending)`), so from a task that prefers the connection's loop — or an actor pinned to
/// it — it touches the connection directly: no hop, no lock; elsewhere it makes one round trip
/// to the loop per call.
///
/// ## Errors and cancellation
/// Operations interrupted by the connection closing throw its `CloseReason` (typed). Input
/// sequences end normally (`nil`) at the end of input and after a local `close()`; they throw
/// for the other reasons (`.idleTimeout`, `.error`, `.cancelled`).
///
/// Cancelling a task while it reads (`lines`, `bytes`, `readLine()`, `read(…)`), sends, or
/// waits for writability closes the connection at once — output not yet sent is dropped, its
/// reason is `.cancelled`, every other operation suspended on it ends with `.cancelled` — and
/// the cancelled operation throws `.cancelled`. A task that was cancelled before it calls one of
/// them closes the connection the same way at that call (lines already buffered are not
/// delivered to a cancelled task).
/// Nothing stays registered: the socket is closed, the suspended tasks are resumed. (A
/// connection is one conversation; a reader that stops half-way cannot leave it in a state
/// anyone could resume.) Awaiting `closed` is not affected by cancellation.
extension Connection {
    // MARK: Input

    /// The peer's input as `LineEvent`s — the `readLines` rules (LF or CRLF, `.tooLong` for
    /// lines over `Options.maxLineLength`, `.invalidUTF8`, NUL bytes kept, a final line without
    /// newline) — ending after `.endOfFile`. Throws the close reason if the connection closes
    /// otherwise (see the errors above).
    ///
    /// Each `next()` is one read of the connection's input: iterate it from one task at a time,
    /// as often as you like — `break` out, read a body with `read(exactly:)`, iterate again —
    /// nothing is lost in between. Not together with a callback reader (a precondition failure
    /// says so). Reading pauses while nobody takes the input, so a slow consumer slows the
    /// peer down through TCP; at most libevent's input buffer (256 KiB) and the lines of one
    /// 4 KiB slice are held meanwhile.
    public var lines: Lines { Lines(connection: self) }

    /// The peer's input as byte chunks of at most 64 KiB (each an array of its exact size),
    /// ending at end of input. The same rules as `lines` for readers, pausing and errors.
    public var bytes: Bytes { Bytes(connection: self) }

    /// `Connection.lines`: an `AsyncSequence` of `LineEvent`s that throws `CloseReason`.
    public typealias Lines = InputSequence<LineReading>

    /// `Connection.bytes`: an `AsyncSequence` of byte chunks that throws `CloseReason`.
    public typealias Bytes = InputSequence<ChunkReading>

    /// How an ``InputSequence`` reads the connection: its iterator, a line at a time
    /// (``LineReading``) or a chunk of bytes at a time (``ChunkReading``). Each iterator is its own
    /// concrete type, so that its inlinable `next()` is the whole fast path.
    public protocol InputReading {
        associatedtype Iterator: AsyncIteratorProtocol where Iterator.Failure == CloseReason
        /// An iterator over `connection`'s input.
        static func makeIterator(reading connection: Connection) -> Iterator
    }

    /// A connection's input as an `AsyncSequence` that throws `CloseReason`, read by `Reading`:
    /// ``Lines`` and ``Bytes``.
    public struct InputSequence<Reading: InputReading>: AsyncSequence, Sendable {
        public typealias Element = Reading.Iterator.Element
        public typealias Failure = CloseReason
        /// The iterator: use it from one task.
        public typealias Iterator = Reading.Iterator
        let connection: Connection

        public func makeAsyncIterator() -> Iterator { Reading.makeIterator(reading: connection) }
    }

    /// The steps of `lines`: `readLine()`.
    public enum LineReading: InputReading {
        public static func makeIterator(reading connection: Connection) -> Iterator { Iterator(connection: connection) }

        /// The iterator of `lines`: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            @usableFromInline let connection: Connection

            init(connection: Connection) { self.connection = connection }

            /// `readLine()`. Inlinable, so that a loop over `lines` takes a line that is there
            /// already with a plain call (an async call allocates its callee's frame in the
            /// task, even when it does not suspend), and calls `waitForLine` itself when it must
            /// wait: no frame of its own in the task while it waits (an idle connection's task
            /// holds every frame of the call it is suspended in).
            @inlinable
            public nonisolated(nonsending) mutating func next() async throws(CloseReason) -> LineEvent? {
                if let ready = connection.lineIfReady() { return try ready.get() }
                return try await connection.waitForLine()
            }

            /// `next()`, on the caller's executor. (Not isolated to `actor`: a function isolated
            /// to a parameter switches to it on entry and back after each call it awaits, two
            /// runtime calls per element that `nonisolated(nonsending)` does not need.)
            @inlinable
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async throws(CloseReason) -> LineEvent? {
                if let ready = connection.lineIfReady() { return try ready.get() }
                return try await connection.waitForLine()
            }
        }
    }

    /// The most that one step of `bytes` gives (for the inlinable iterator).
    @usableFromInline static let bytesChunk = ConnectionSource.chunk

    /// The steps of `bytes`: `read(upTo:)` 64 KiB (`ConnectionSource.chunk`).
    public enum ChunkReading: InputReading {
        public static func makeIterator(reading connection: Connection) -> Iterator { Iterator(reading: connection) }

        /// The iterator of `bytes`: use it from one task. Inlinable, as `lines`' is.
        public struct Iterator: AsyncIteratorProtocol {
            @usableFromInline let connection: Connection

            init(reading connection: Connection) { self.connection = connection }

            /// `read(upTo:)` 64 KiB, which has its own fast path.
            @inlinable
            public nonisolated(nonsending) mutating func next() async throws(CloseReason) -> [UInt8]? {
                try await connection.read(upTo: Connection.bytesChunk)
            }

            /// `next()`, on the caller's executor (without isolating to `actor`, as `lines`' does).
            @inlinable
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async throws(CloseReason) -> [UInt8]? {
                try await connection.read(upTo: Connection.bytesChunk)
            }
        }
    }

    /// What `read(until:limit:)` found.
    public enum Delimited: Sendable, Equatable {
        /// The bytes before the delimiter (the delimiter itself is consumed, not included).
        case found([UInt8])
        /// `limit` bytes arrived without the delimiter. Nothing was consumed: skip them with
        /// `read(upTo:)`, or close the connection.
        case tooLong
    }

    /// The next line event: what one step of `lines` gives — `.line`, `.tooLong`,
    /// `.invalidUTF8`, then `.endOfFile` once — and nil after that, or once the connection was
    /// closed locally. Suspends until a line is there; returns at once (no suspension, no hop)
    /// when one is buffered and the caller is on the connection's loop.
    /// - Throws: the `CloseReason` when the connection closes otherwise (`.idleTimeout`,
    ///   `.error`, `.cancelled`; see the errors above).
    public nonisolated(nonsending) func readLine() async throws(CloseReason) -> LineEvent? {
        if let outcome = lineIfReady() { return try outcome.get() }
        return try await waitForLine()
    }

    /// `readLine()` past its check for a line that is there already (`lineIfReady`): the
    /// inlinable iterator has made that check. On the loop the line is looked for once more,
    /// from inside the suspension (it may have come meanwhile, on another thread's call).
    @usableFromInline
    nonisolated(nonsending) func waitForLine() async throws(CloseReason) -> LineEvent? {
        let result: Result<LineEvent?, CloseReason> = await suspend(isolation: #isolation) { source, continuation in
            if let outcome = source.pullLine().outcome {
                continuation.resume(returning: outcome)
            } else {
                source.parkRead(.line(continuation))
            }
        }
        return try result.get()
    }

    /// `readLine()`'s answer when it needs no wait — the next line event, nil at the end, or the
    /// close reason — on the connection's loop, from a task that is not cancelled; nil when the
    /// read must wait (`waitForLine`). Synchronous, for the inlinable iterator.
    @usableFromInline
    func lineIfReady() -> Result<LineEvent?, CloseReason>? {
        guard loop.isCurrent && !Task.isCancelled else { return nil }
        return source.pullLine().outcome
    }

    /// Up to `maxCount` bytes of input (at least 1): what is buffered now, or, when nothing is,
    /// the next bytes to arrive. nil at the end of input. The rules of `readLine()` for
    /// suspending and errors.
    public nonisolated(nonsending) func read(upTo maxCount: Int) async throws(CloseReason) -> [UInt8]? {
        requireUsage(maxCount > 0, "Mainspring: Connection.read(upTo:) needs a count of at least 1, not \(maxCount)")
        if loop.isCurrent && !Task.isCancelled, let outcome = source.pullBytes(max: maxCount).outcome {
            return try outcome.get()
        }
        let result: Result<[UInt8]?, CloseReason> = await suspend(isolation: #isolation) { source, continuation in
            if let outcome = source.pullBytes(max: maxCount).outcome {
                continuation.resume(returning: outcome)
            } else {
                source.parkRead(.bytes(max: maxCount, continuation))
            }
        }
        return try result.get()
    }

    /// Exactly `count` bytes of input (an N-byte body after a header, say). nil when the input
    /// ends first: the bytes that did arrive are then left at the front of the input, for
    /// `read(upTo:)`. The rules of `readLine()` for suspending and errors.
    ///
    /// Up to the input limit (256 KiB), the bytes wait in libevent's buffer until all have
    /// arrived; a longer read gathers them into its result as they arrive, so a body of any
    /// size costs its own size once — check a declared length against your protocol's limit
    /// before asking for it.
    ///
    /// `count` must be at least 0: a negative count stops the program with a message naming it,
    /// as `prefix(_:)` does. A length taken from the input is input — check it (at least 0, at
    /// most your protocol's limit) before asking for that many bytes, and answer the peer when
    /// it is not.
    /// - Throws: the rules of `readLine()`.
    public nonisolated(nonsending) func read(exactly count: Int) async throws(CloseReason) -> [UInt8]? {
        requireUsage(count >= 0, "Mainspring: Connection.read(exactly:) needs a count of at least 0, not \(count) (check a length taken from the input before reading it)")
        if loop.isCurrent && !Task.isCancelled, let outcome = source.pullExactly(count).outcome { return try outcome.get() }
        let result: Result<[UInt8]?, CloseReason> = await suspend(isolation: #isolation) { source, continuation in
            if let outcome = source.pullExactly(count).outcome {
                continuation.resume(returning: outcome)
            } else {
                source.parkRead(.exactly(count, continuation))
            }
        }
        return try result.get()
    }

    /// The bytes up to the next `delimiter` (`[0x0D, 0x0A]` for CRLF-framed protocols):
    /// `.found(bytes)` without the delimiter, which is consumed; `.tooLong` when `limit` bytes
    /// arrived without it (nothing consumed); nil when the input ends without one (what is left
    /// stays for `read(upTo:)`). The rules of `readLine()` for suspending and errors.
    /// - Complexity: each byte is searched once, however the input arrives.
    public nonisolated(nonsending) func read(until delimiter: [UInt8], limit: Int) async throws(CloseReason) -> Delimited? {
        requireUsage(!delimiter.isEmpty, "Mainspring: Connection.read(until:limit:) needs a delimiter of at least one byte")
        requireUsage(limit >= 0, "Mainspring: Connection.read(until:limit:) needs a limit of at least 0, not \(limit)")
        if loop.isCurrent && !Task.isCancelled, let outcome = source.pullDelimited(delimiter, limit: limit).outcome {
            return try outcome.get()
        }
        let result: Result<Delimited?, CloseReason> = await suspend(isolation: #isolation) { source, continuation in
            if let outcome = source.pullDelimited(delimiter, limit: limit).outcome {
                continuation.resume(returning: outcome)
            } else {
                source.parkRead(.delimited(delimiter, limit: limit, continuation))
            }
        }
        return try result.get()
    }

    // MARK: Output

    /// Sends the UTF-8 bytes of `text`. Suspends while the connection's buffered output is over
    /// `Options.outputLimit`, until it has drained to half of it; otherwise returns at once (the
    /// bytes are queued, as with `write`, and go out when the loop next polls). Concurrent senders
    /// are served in order, each `send` whole.
    /// - Throws: the `CloseReason` if the connection is closed or closes meanwhile (`.closed`
    ///   after a local `close()`); `.cancelled` if the task is cancelled while it waits (which
    ///   closes the connection).
    public nonisolated(nonsending) func send(_ text: String) async throws(CloseReason) {
        try await send(.text(text, newline: false))
    }

    /// Sends the UTF-8 bytes of `text` and a `\n`: `send(_:)` for a line protocol's replies.
    public nonisolated(nonsending) func send(line text: String) async throws(CloseReason) {
        try await send(.text(text, newline: true))
    }

    /// Sends `bytes`; see `send(_: String)`.
    public nonisolated(nonsending) func send(_ bytes: [UInt8]) async throws(CloseReason) {
        try await send(.bytes(bytes))
    }

    /// Suspends until the connection is writable — its output under `outputLimit` (and no
    /// earlier `send` still waiting) — and returns true; or returns false once `timeout`
    /// passes first (nil: no limit), when the connection closed locally, or when the task is
    /// cancelled. For fan-out that gives a slow member a grace period before dropping or
    /// closing it. Unlike the reads and `send`, cancelling the waiting task does not close the
    /// connection: the waiter is usually another connection's task (a broadcaster), whose end
    /// must not close its recipients.
    /// - Throws: the `CloseReason` when the connection closes otherwise (`.error`, …).
    public nonisolated(nonsending) func waitUntilWritable(timeout: Duration? = nil) async throws(CloseReason) -> Bool {
        let source = self.source
        if loop.isCurrent && source.state.isOpen && !source.state.isOutputPaused && !source.hasWaitingSenders {
            return true
        }
        if Task.isCancelled { return false }
        let ticket = source.nextWaitTicket.wrappingAdd(1, ordering: .relaxed).oldValue
        let unchecked = LoopBound(source)
        let loop = self.loop
        let result: Result<Bool, CloseReason> = await withTaskCancellationHandler(operation: {
            await withUnsafeContinuation(isolation: #isolation) { (continuation: UnsafeContinuation<Result<Bool, CloseReason>, Never>) in
                if loop.isCurrent {
                    unchecked.value.awaitWritable(ticket: ticket, timeout: timeout, continuation)
                } else {
                    loop.execute {
                        unchecked.value.awaitWritable(ticket: ticket, timeout: timeout, continuation)
                    } orElse: {
                        continuation.resume(returning: .failure(.cancelled))  // the loop is gone
                    }
                }
            }
        }, onCancel: {
            loop.execute { unchecked.value.cancelWritableWait(ticket: ticket) }
        }, isolation: #isolation)
        return try result.get()
    }

    // MARK: Closing

    /// Why the connection closed, once it has: suspends until then (`connection.close()` then
    /// `await connection.closed` waits for a graceful close to finish). Any number of tasks may
    /// await it; cancelling one does not end its wait (as with `Task.value`).
    public var closed: CloseReason {
        get async {
            let connection = self
            return await withUnsafeContinuation { continuation in
                if connection.loop.isCurrent {
                    connection.source.awaitClose(continuation)
                } else {
                    let source = LoopBound(connection.source)
                    connection.loop.execute {
                        source.value.awaitClose(continuation)
                    } orElse: {
                        continuation.resume(returning: .cancelled)  // the loop is gone
                    }
                }
            }
        }
    }

    // MARK: Connecting

    /// Connects to `host:port` from `loop` — an IPv4 or IPv6 literal, or a host name, resolved
    /// off the loop and tried with Happy Eyeballs as in ``startConnecting(to:port:on:options:)``
    /// — and returns once the connection is established. Any task. Cancelling the task ends the
    /// attempt at once (the lookup's answer is ignored, the socket closed) with `.cancelled`.
    /// - Throws: `EventLoopError.system` with the `errno` of a literal's failed connect
    ///   (`ECONNREFUSED`, …); for a name `.hostNotFound`, `.resolveTimedOut`, or
    ///   `.connectFailed` naming the host and every address tried; `.invalidAddress`,
    ///   `.cancelled`, `.loopClosed` if the loop shut down meanwhile.
    public static func connect(to host: String, port: UInt16, on loop: EventLoop, options: Options = .init()) async
        throws(EventLoopError) -> Connection
    {
        let attempt = PendingConnect()
        // Resumed once: by the connect's outcome, the task's cancellation (at once, from the
        // cancelling thread), or the loop's end.
        let made: Result<Connection, EventLoopError> = await loop.waitCancellably({ once in
            do throws(EventLoopError) {
                let source = try ConnectionSource(loop: loop, connectingTo: host, port: port, options: options)
                let connection = Connection(source: source)
                attempt.connection = connection
                source.awaitConnect { result in once.resume(with: .success(result.map { connection })) }
            } catch {
                once.resume(with: .success(.failure(error)))
            }
        }, onCancel: { attempt.abort(on: loop) })
        return try made.get()
    }
}

/// The connection an async connect is making, for its cancellation: aborted on its loop unless
/// it is established by then (a connection that connected as the task was cancelled is closed by
/// the drop rule instead: nobody holds it). `connection` is set and read on the loop's thread
/// only.
final class PendingConnect: @unchecked Sendable {
    var connection: Connection?

    func abort(on loop: EventLoop) {
        loop.executeNowOrPost({
            guard let connection = self.connection, !connection.source.state.isConnected else { return }
            connection.source.finish(.cancelled)
        }, orElse: {})
    }
}

// MARK: - The loop side of the calls

extension Connection {
    /// One `send`.
    nonisolated(nonsending) func send(_ payload: ConnectionSource.Payload) async throws(CloseReason) {
        if loop.isCurrent && !Task.isCancelled {
            switch source.trySend(payload) {
            case .element: return
            case .end: return
            case .failed(let reason): throw reason
            case .wait: break
            }
        }
        let result: Result<Void, CloseReason> = await suspend(isolation: #isolation) { source, continuation in
            switch source.trySend(payload) {
            case .element, .end: continuation.resume(returning: .success(()))
            case .failed(let reason): continuation.resume(returning: .failure(reason))
            case .wait: source.parkSender(payload, continuation)
            }
        }
        try result.get()
    }

    /// Suspends the task until the loop resumes it: `body` runs on the loop's thread (at once
    /// when the caller is there already) and either resumes the continuation or hands it to the
    /// connection. Cancelling the task meanwhile closes the connection (`.cancelled`), which
    /// resumes it. A task that was cancelled before it got here closes the connection and does
    /// not suspend.
    ///
    /// Inlined into each read: a task suspended in one holds every frame of the call, and the
    /// read and this as one frame are some 90 bytes smaller than as two — which is what lets an
    /// idle connection's task fit in one slab of the task allocator (see BENCHMARKS.md, "Memory of
    /// an idle async connection").
    @inline(__always)
    private func suspend<T: Sendable>(
        isolation: isolated (any Actor)?,
        _ body: @escaping @Sendable (ConnectionSource, UnsafeContinuation<Result<T, CloseReason>, Never>) -> Void
    ) async -> Result<T, CloseReason> {
        let source = LoopBound(source)
        let loop = self.loop
        if Task.isCancelled {
            if loop.isCurrent { source.value.cancel() } else { loop.execute { source.value.cancel() } }
            return .failure(.cancelled)
        }
        return await withTaskCancellationHandler(operation: {
            await withUnsafeContinuation(isolation: isolation) { (continuation: UnsafeContinuation<Result<T, CloseReason>, Never>) in
                if loop.isCurrent {
                    body(source.value, continuation)
                } else {
                    loop.execute {
                        body(source.value, continuation)
                    } orElse: {
                        continuation.resume(returning: .failure(.cancelled))  // the loop is gone
                    }
                }
            }
        }, onCancel: {
            loop.execute { source.value.cancel() }
        }, isolation: isolation)
    }
}
