#if canImport(Glibc)
import Glibc
#endif

/// Reading: the callback readers (delivered by the loop), the async reads (pulled by a task),
/// and the hand-over between them.
extension ConnectionSource {
    // MARK: Reading starts and stops

    /// Reading starts (the first reader of any kind): the socket is read from now on, up to
    /// the input limit.
    func startReadingSocket() {
        guard state.startReading() else { return }
        applyReadChange()
    }

    /// Installs a callback reader (replacing the current one); the input already buffered is
    /// looked at next turn.
    func startReading(_ reader: CallbackReader) {
        requireUsage(role != .pipeWriteEnd,
                     "Mainspring: Connection.readLines/readBytes: this connection is a child process's standard input, which is write-only")
        guard state.isOpen else { return }
        requireUsage(asyncRead == nil,
                     "Mainspring: Connection.readLines/readBytes: a task is suspended reading this connection; one reader at a time")
        callbackReader = reader
        readerGeneration &+= 1
        startReadingSocket()
        // Input may already be buffered (or the peer already gone): look at it next turn.
        withLoop { $0.enqueueNextTurn(source: self) }
    }

    /// Removes the callback reader: what it did not take stays buffered for the next reader.
    /// The socket is still read, up to the input limit.
    func stopReading() {
        guard callbackReader != nil else { return }
        callbackReader = nil
        readerGeneration &+= 1
        if let socket { lines.abandon(socket) }
    }

    /// Inside the poll (libevent's read callback): stop reading a full input buffer at once.
    func inputArrived() {
        guard !state.isInputFull, let socket, socket.inputLength >= readLimit else { return }
        state.inputFilled()
        applyReadChange()
    }

    /// After a reader took input: a full input buffer that held reading back has room.
    /// Puts the bytes a reader gathered but did not take back in front of the input, for the
    /// next reader. When the socket refuses them the connection finishes with its errno,
    /// which is returned.
    func returnGathered(to socket: BufferedSocket) -> Int32? {
        guard !gathered.isEmpty else { return nil }
        let bytes = gathered
        gathered = []
        do {
            try socket.unreadInput(bytes)
            return nil
        } catch {
            finish(.error(error.errnoCode))
            return error.errnoCode
        }
    }

    func releaseInputHold(_ socket: BufferedSocket) {
        if state.isInputFull && socket.inputLength < readLimit && state.inputDrained() { applyReadChange() }
    }

    /// A read needs `bytes` of input at once (a long delimited read): libevent may buffer that
    /// much until the read completes.
    func raiseReadLimit(to bytes: Int) {
        guard bytes > readLimit, let socket else { return }
        readLimit = bytes
        socket.setReadHighWatermark(bytes)
        releaseInputHold(socket)
    }

    /// Back to the input limit after a read that raised it.
    func restoreReadLimit() {
        let normal = Self.inputLimit(maxLineLength: splitter.maxLineLength)
        guard readLimit != normal, let socket else { return }
        readLimit = normal
        socket.setReadHighWatermark(normal)
    }

    /// A read of raw bytes is about to consume the front of the input: lines split there and
    /// not delivered are forgotten (their bytes stay), and the line and delimiter searches
    /// start over.
    @inline(__always)
    func prepareRawRead(_ socket: BufferedSocket) {
        if !lines.isEmpty || lines.taken > 0 { lines.abandon(socket) }
    }

    /// Raw bytes were taken from the front of the input.
    @inline(__always)
    func rawBytesTaken() {
        splitter.reset()
        delimiterScanned = 0
    }

    /// A reader was given the end of the input. The read end of a child's pipe has nothing
    /// more to give, ever (and no output): it closes (`.closed`), on the next turn, after the
    /// delivery in progress.
    func endDelivered() {
        state.endDelivered()
        guard role == .pipeReadEnd else { return }
        withLoop { $0.execute(priority: .input, LoopBound { [weak self] in self?.closeGracefully() }.run) }
    }

    // MARK: Delivering to callbacks

    /// Input arrived, the output drained, the peer ended, or the next turn came: hands what is
    /// buffered to the callback reader (at most `chunk` bytes a turn), or wakes the task
    /// waiting to read.
    func deliverInput() {
        guard let reader = callbackReader else {
            wakeAsyncReader()
            return
        }
        guard state.mayDeliver, let socket else { return }
        let generation = readerGeneration
        switch reader {
        case .lines(let handler):
            deliverLines(handler, socket: socket, generation: generation)
        case .bytes(let handler):
            if endReportedToGeneration == generation { return }
            prepareRawRead(socket)
            let data = socket.readInput(upTo: Self.chunk)
            if !data.isEmpty {
                rawBytesTaken()
                releaseInputHold(socket)
                handler(.bytes(data))
                guard readerGeneration == generation, state.mayDeliver, let socket = self.socket else { return }
                if socket.inputLength > 0 {
                    withLoop { $0.enqueueNextTurn(source: self) }  // more buffered: next turn, after polling
                    return
                }
            }
            if state.peerEnded && self.socket?.inputLength == 0 {
                endReportedToGeneration = generation
                endDelivered()
                handler(.endOfFile)
            }
        case .exactly(let count, let handler):
            deliverExactly(count, handler, socket: socket)
        }
    }

    /// The one-shot `readBytes(exactly:)`: the bytes once they are all there (gathered as they
    /// arrive when more than libevent buffers), or the end; either way the reader is done.
    private func deliverExactly(_ count: Int, _ handler: (Connection.Input) -> Void, socket: BufferedSocket) {
        prepareRawRead(socket)
        var data: [UInt8]?
        if gathered.isEmpty && socket.inputLength >= count {
            data = socket.readInput(upTo: count)
        } else if count > readLimit || !gathered.isEmpty {
            if gathered.isEmpty { gathered.reserveCapacity(count) }
            _ = socket.readInput(appendingTo: &gathered, upTo: count - gathered.count)
            if gathered.count == count {
                data = gathered
                gathered = []
            }
        }
        if let data {
            rawBytesTaken()
            releaseInputHold(socket)
            callbackReader = nil
            readerGeneration &+= 1
            handler(.bytes(data))
            return
        }
        rawBytesTaken()
        releaseInputHold(socket)
        guard state.peerEnded else { return }
        if returnGathered(to: socket) != nil { return }
        callbackReader = nil
        readerGeneration &+= 1
        if socket.inputLength == 0 { endDelivered() }
        handler(.endOfFile)
    }

    /// Delivers lines to `handler` until a turn's worth is done, the reader changes, or output
    /// backpressure pauses delivery; only the lines delivered are drained from the input.
    private func deliverLines(_ handler: (LineEvent) -> Void, socket: BufferedSocket, generation: UInt32) {
        if endReportedToGeneration == generation { return }
        var looked = 0
        while true {
            while let event = lines.take() {
                if event == .endOfFile {
                    endReportedToGeneration = generation
                    endDelivered()
                }
                handler(event)
                guard readerGeneration == generation, state.mayDeliver, let socket = self.socket else {
                    // Replaced, stopped, paused or closed: the lines not delivered stay (their
                    // bytes are still in the input); those delivered are drained.
                    if let socket = self.socket {
                        if readerGeneration == generation { lines.settle(socket) } else { lines.abandon(socket) }
                    }
                    return
                }
                _ = socket
            }
            lines.settle(socket)
            if endReportedToGeneration == generation || looked >= Self.chunk { break }
            if socket.inputLength <= splitter.scanned && !state.peerEnded { break }  // nothing new to split
            let before = socket.inputLength
            // A slice at a time, not the whole turn's chunk: a handler that switches readers
            // leaves at most one slice split for nothing.
            looked += splitter.split(socket, slice: min(Self.asyncSlice, Self.chunk - looked), atEnd: state.peerEnded,
                                     into: &lines)
            if lines.isEmpty && socket.inputLength == before { break }
        }
        releaseInputHold(socket)
        if endReportedToGeneration != generation && socket.inputLength > splitter.scanned {
            withLoop { $0.enqueueNextTurn(source: self) }  // more buffered: next turn, after polling
        }
    }

    // MARK: Pulls (the async reads, on the loop's thread)

    /// The common checks of every read: `.end` or `.failed` once closing or closed, `.wait`
    /// while delivery is paused; otherwise nil, and the socket is being read.
    @inline(__always)
    private func readPrelude(_ function: StaticString) -> Pull<Void>? {
        requireUsage(role != .pipeWriteEnd,
                     "Mainspring: \(function): this connection is a child process's standard input, which is write-only")
        if let reason = state.closeReason { return reason == .closed ? .end : .failed(reason) }
        if state.isClosing { return .end }
        requireUsage(callbackReader == nil,
                     "Mainspring: \(function): this connection has a callback reader (readLines/readBytes); call stopReading() first — one reader at a time")
        if !state.isReading { startReadingSocket() }
        return nil
    }

    /// The next line event for a task (`lines`, `readLine()`), if one is ready or can be split
    /// from the input now.
    func pullLine() -> Pull<LineEvent> {
        if let early = readPrelude("Connection.lines") { return early.map() }
        if let event = lines.take() { return .element(deliveredAsync(event)) }
        if state.isEndDelivered { return .end }
        guard state.mayDeliver, let socket else { return .wait }
        lines.settle(socket)
        var looked = 0
        while lines.isEmpty && looked < Self.chunk && (socket.inputLength > splitter.scanned || state.peerEnded) {
            looked += splitter.split(socket, slice: Self.asyncSlice, atEnd: state.peerEnded, into: &lines)
            if lines.isEmpty && state.peerEnded && socket.inputLength == 0 { break }
        }
        releaseInputHold(socket)
        if let event = lines.take() { return .element(deliveredAsync(event)) }
        // A chunk of one long line, with more to come: go on after the next poll.
        if looked >= Self.chunk { withLoop { $0.enqueueNextTurn(source: self) } }
        return .wait
    }

    private func deliveredAsync(_ event: LineEvent) -> LineEvent {
        if event == .endOfFile { endDelivered() }
        return event
    }

    /// Up to `max` bytes for a task (`bytes`, `read(upTo:)`).
    func pullBytes(max: Int) -> Pull<[UInt8]> {
        if let early = readPrelude("Connection.read(upTo:)") { return early.map() }
        if state.isEndDelivered { return .end }
        guard state.mayDeliver, let socket else { return .wait }
        prepareRawRead(socket)
        let data = socket.readInput(upTo: max)
        if !data.isEmpty {
            rawBytesTaken()
            releaseInputHold(socket)
            return .element(data)
        }
        if state.peerEnded {
            endDelivered()
            return .end
        }
        return .wait
    }

    /// Exactly `count` bytes for a task (`read(exactly:)`), or `.end` when the input ends first
    /// (what arrived of them is left at the front of the input).
    func pullExactly(_ count: Int) -> Pull<[UInt8]> {
        if let early = readPrelude("Connection.read(exactly:)") { return early.map() }
        if count == 0 { return .element([]) }
        if state.isEndDelivered { return .end }
        guard state.mayDeliver, let socket else { return .wait }
        prepareRawRead(socket)
        if gathered.isEmpty && socket.inputLength >= count {
            let data = socket.readInput(upTo: count)
            rawBytesTaken()
            releaseInputHold(socket)
            return .element(data)
        }
        if count > readLimit || !gathered.isEmpty {
            // Longer than libevent buffers: gather it as it arrives (the reader's own memory).
            if gathered.isEmpty { gathered.reserveCapacity(count) }
            if socket.readInput(appendingTo: &gathered, upTo: count - gathered.count) > 0 {
                rawBytesTaken()
                releaseInputHold(socket)
            }
            if gathered.count == count {
                defer { gathered = [] }
                return .element(gathered)
            }
        }
        if state.peerEnded {
            // Short: the bytes go back, for the next reader.
            if let failure = returnGathered(to: socket) { return .failed(.error(failure)) }
            if socket.inputLength == 0 { endDelivered() }
            return .end
        }
        return .wait
    }

    /// The bytes before the next `delimiter` for a task (`read(until:limit:)`).
    func pullDelimited(_ delimiter: [UInt8], limit: Int) -> Pull<Connection.Delimited> {
        if let early = readPrelude("Connection.read(until:limit:)") { return early.map() }
        if state.isEndDelivered { return .end }
        guard state.mayDeliver, let socket else { return .wait }
        prepareRawRead(socket)
        let window = limit + delimiter.count
        let from = max(0, delimiterScanned - (delimiter.count - 1))
        if let offset = socket.firstInputOffset(of: delimiter, from: from, before: window) {
            let data = socket.readInput(upTo: offset)
            socket.drain(delimiter.count)
            rawBytesTaken()
            restoreReadLimit()
            releaseInputHold(socket)
            return .element(.found(data))
        }
        let length = socket.inputLength
        if length >= window {
            restoreReadLimit()
            return .element(.tooLong)
        }
        delimiterScanned = length
        if state.peerEnded {
            if length == 0 { endDelivered() }
            return .end
        }
        raiseReadLimit(to: window + 1)
        return .wait
    }

    // MARK: Suspending a task

    /// Parks a task's read until input arrives (one reader at a time).
    func parkRead(_ read: PendingRead) {
        requireUsage(asyncRead == nil,
                     "Mainspring: a connection's input has one reader at a time: another task is already suspended reading it")
        asyncRead = read
    }

    /// Input arrived (or the peer ended, or output drained): resumes the waiting task if there
    /// is something for it now.
    func wakeAsyncReader() {
        guard let read = asyncRead else { return }
        switch read {
        case .line(let continuation):
            guard let outcome = pullLine().outcome else { return }
            asyncRead = nil
            loop.resumingInput { continuation.resume(returning: outcome) }
        case .bytes(let max, let continuation):
            guard let outcome = pullBytes(max: max).outcome else { return }
            asyncRead = nil
            loop.resumingInput { continuation.resume(returning: outcome) }
        case .exactly(let count, let continuation):
            guard let outcome = pullExactly(count).outcome else { return }
            asyncRead = nil
            loop.resumingInput { continuation.resume(returning: outcome) }
        case .delimited(let delimiter, let limit, let continuation):
            guard let outcome = pullDelimited(delimiter, limit: limit).outcome else { return }
            asyncRead = nil
            loop.resumingInput { continuation.resume(returning: outcome) }
        }
    }

    /// The connection closes (or is closing): the waiting task gets the end (`.closed`) or the
    /// reason.
    func endAsyncRead(with reason: Connection.CloseReason) {
        guard let read = asyncRead else { return }
        asyncRead = nil
        switch read {
        case .line(let continuation): continuation.resume(returning: reason == .closed ? .success(nil) : .failure(reason))
        case .bytes(_, let continuation): continuation.resume(returning: reason == .closed ? .success(nil) : .failure(reason))
        case .exactly(_, let continuation): continuation.resume(returning: reason == .closed ? .success(nil) : .failure(reason))
        case .delimited(_, _, let continuation):
            continuation.resume(returning: reason == .closed ? .success(nil) : .failure(reason))
        }
    }
}

extension ConnectionSource.Pull<Void> {
    /// The same early answer for a read of another element type.
    @inline(__always)
    func map<T>() -> ConnectionSource.Pull<T> {
        switch self {
        case .element, .end: .end
        case .failed(let reason): .failed(reason)
        case .wait: .wait
        }
    }
}
