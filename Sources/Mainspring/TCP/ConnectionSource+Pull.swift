#if canImport(Glibc)
import Glibc
#endif

/// Reading pulled by a task (the async API's `lines` and `bytes`).
extension ConnectionSource {
    // MARK: Reading from a task

    /// The async consumer starts: reading is enabled (it stops again while the consumer does
    /// not take what was read, once libevent's input buffer is full).
    func startAsyncReading() {
        guard !isClosed, !isClosing else { return }
        isReading = true
        updateReading()
    }

    /// Enables or disables reading the socket: on while someone reads, and neither the output
    /// (over its limit) nor the async consumer (not taking a full input buffer) holds it back.
    func updateReading() {
        guard let socket else { return }
        let wanted = isReading && !isClosing && !isPausedForOutput && !isInputFull
        guard wanted != isReadEnabled else { return }
        isReadEnabled = wanted
        if wanted {
            do {
                try socket.enable(.read)
            } catch {
                registrationFailed(error)
            }
        } else {
            socket.disable(.read)
        }
    }

    /// Inside the poll (libevent's read callback): stop reading a full input buffer at once.
    func inputArrived() {
        guard !isInputFull, let socket, socket.inputLength >= Self.inputLimit else { return }
        isInputFull = true
        updateReading()
    }

    /// After the reader took input: a full input buffer that held reading back has room.
    func releaseInputHold(_ socket: BufferedSocket) {
        if isInputFull && socket.inputLength < Self.inputLimit {
            isInputFull = false
            updateReading()
        }
    }

    /// The next line event for the task iterating `lines`, if one is ready or can be split from
    /// the input now.
    func pullLine() -> Pull<LineEvent> {
        if let reason = closeReason { return reason == .closed ? .end : .failed(reason) }
        if isClosing { return .end }
        if nextLineEvent < lineEvents.count { return .element(takeLineEvent()) }
        if deliveredEndOfFile { return .end }
        guard !isPausedForOutput, let socket else { return .wait }
        var split = 0
        while lineEvents.isEmpty && split < Self.chunk {
            let taken = socket.splitInput(upTo: Self.asyncSlice, into: &splitter) { lineEvents.append($0) }
            if taken == 0 { break }
            split += taken
        }
        if split > 0 { releaseInputHold(socket) }
        if lineEvents.isEmpty && peerEnded && socket.inputLength == 0 {
            deliveredEndOfFile = true
            splitter.finish { lineEvents.append($0) }
        }
        if nextLineEvent < lineEvents.count { return .element(takeLineEvent()) }
        // A chunk of one long line, with more to come: go on after the next poll.
        if split >= Self.chunk { withLoop { $0.enqueueNextTurn(source: self) } }
        return .wait
    }

    func takeLineEvent() -> LineEvent {
        let event = lineEvents[nextLineEvent]
        nextLineEvent += 1
        if nextLineEvent == lineEvents.count { resetLineEvents() }
        return event
    }

    /// The next chunk for the task iterating `bytes`.
    func pullBytes() -> Pull<[UInt8]> {
        if let reason = closeReason { return reason == .closed ? .end : .failed(reason) }
        if deliveredEndOfFile || isClosing { return .end }
        guard !isPausedForOutput, let socket else { return .wait }
        let data = socket.readInput(upTo: Self.chunk)
        if !data.isEmpty {
            releaseInputHold(socket)
            return .element(data)
        }
        if peerEnded {
            deliveredEndOfFile = true
            return .end
        }
        return .wait
    }

    func parkLineConsumer(_ continuation: UnsafeContinuation<Result<LineEvent?, Connection.CloseReason>, Never>) {
        requireUsage(lineWaiter == nil, "Mainspring: Connection.lines has one consumer at a time")
        lineWaiter = continuation
    }

    func parkBytesConsumer(_ continuation: UnsafeContinuation<Result<[UInt8]?, Connection.CloseReason>, Never>) {
        requireUsage(bytesWaiter == nil, "Mainspring: Connection.bytes has one consumer at a time")
        bytesWaiter = continuation
    }

    /// Input arrived (or the peer ended, or output drained): resumes the waiting consumer if
    /// there is something for it now.
    func wakeAsyncReader() {
        if let waiter = lineWaiter {
            guard let outcome = pullLine().outcome else { return }
            lineWaiter = nil
            loop.resumingInput { waiter.resume(returning: outcome) }
        } else if let waiter = bytesWaiter {
            guard let outcome = pullBytes().outcome else { return }
            bytesWaiter = nil
            loop.resumingInput { waiter.resume(returning: outcome) }
        }
    }
}
