#if canImport(Glibc)
import Glibc
#endif

/// Writing: coalesced output, backpressure, half-close and close.
extension ConnectionSource {
    // MARK: Writing

    func write(_ bytes: [UInt8]) {
        guard !isClosed, !isClosing, socket != nil, !bytes.isEmpty else { return }
        pendingOutput.append(contentsOf: bytes)
        scheduleFlush()
    }

    func write(text: String, newline: Bool) {
        guard !isClosed, !isClosing, socket != nil else { return }
        pendingOutput.append(contentsOf: text.utf8)
        if newline { pendingOutput.append(0x0A) }
        scheduleFlush()
    }

    func write(_ payload: Payload) {
        switch payload {
        case .bytes(let bytes): write(bytes)
        case .text(let text, let newline): write(text: text, newline: newline)
        }
    }

    /// An async `send`: written at once unless the output is over its limit (or other senders
    /// wait already, which keeps them in order).
    func trySend(_ payload: Payload) -> Pull<Void> {
        if let reason = closeReason { return .failed(reason) }
        if isClosing || socket == nil { return .failed(.closed) }
        if isPausedForOutput || firstSender < senders.count { return .wait }
        write(payload)
        if let reason = closeReason { return .failed(reason) }
        return .element(())
    }

    func parkSender(_ payload: Payload,
                    _ continuation: UnsafeContinuation<Result<Void, Connection.CloseReason>, Never>)
    {
        senders.append(Sender(payload: payload, continuation: continuation))
    }

    /// Output drained below half the limit: the waiting senders write, in order, until the
    /// output is over the limit again.
    func resumeSenders() {
        while firstSender < senders.count, !isPausedForOutput, closeReason == nil, !isClosing {
            let sender = senders[firstSender]
            firstSender += 1
            write(sender.payload)
            let result: Result<Void, Connection.CloseReason> = closeReason.map { .failure($0) } ?? .success(())
            loop.resumingInput { sender.continuation.resume(returning: result) }
        }
        if firstSender == senders.count {
            senders.removeAll(keepingCapacity: senders.capacity <= 16)
            firstSender = 0
        }
    }

    /// Output is handed to libevent before the loop next polls, or at once past 64 KiB or past
    /// the output limit (so that backpressure sees it).
    func scheduleFlush() {
        if pendingOutput.count >= Self.chunk || pendingOutput.count + (socket?.outputLength ?? 0) > options.outputLimit {
            flushPendingOutput()
        } else if !flushScheduled {
            flushScheduled = true
            withLoop { $0.beforeNextPoll(self) }
        }
    }

    /// Hands the buffered output to libevent.
    func flushPendingOutput() {
        guard !pendingOutput.isEmpty, let socket else { return }
        do {
            try socket.write(pendingOutput)
        } catch {
            pendingOutput.removeAll()
            finish(.error(ENOMEM))
            return
        }
        pendingOutput.removeAll(keepingCapacity: pendingOutput.capacity <= Self.retainedCapacity)
        didWrite(socket)
    }

    func didWrite(_ socket: BufferedSocket) {
        if !isPausedForOutput && socket.outputLength > options.outputLimit {
            isPausedForOutput = true
            updateReading()
            socket.setWriteLowWatermark(options.outputLimit / 2)
        }
    }

    func shutdownOutput() {
        flushPendingOutput()
        guard !isClosed, let socket else { return }
        wantsOutputShutdown = true
        if socket.outputLength == 0 { socket.shutdownWrite() }
    }

    func closeGracefully() {
        flushPendingOutput()
        guard !isClosed, !isClosing, let socket else { return }
        isClosing = true
        isReading = false
        updateReading()
        endAsyncOperationsForClosing()
        if socket.outputLength == 0 {
            finish(.closed)
        } else {
            socket.setWriteLowWatermark(0)
            socket.setTimeouts(readNanoseconds: nil, writeNanoseconds: max(1, options.closeTimeout.clampedNanoseconds))
        }
    }

    /// Closing: no more input for the consumer, no more output for the senders.
    func endAsyncOperationsForClosing() {
        if let waiter = lineWaiter {
            lineWaiter = nil
            waiter.resume(returning: .success(nil))
        }
        if let waiter = bytesWaiter {
            bytesWaiter = nil
            waiter.resume(returning: .success(nil))
        }
        failSenders(.closed)
    }

    func failSenders(_ reason: Connection.CloseReason) {
        let waiting = senders[firstSender...]
        senders = []
        firstSender = 0
        for sender in waiting { sender.continuation.resume(returning: .failure(reason)) }
    }

    func setCloseHandler(_ handler: @escaping (Connection.CloseReason) -> Void) {
        if let closeReason {
            loop.execute { [handler = UncheckedHandler(handler)] in handler.call(closeReason) }
        } else {
            closeHandler = handler
        }
    }

    /// The reason, if closed already; otherwise `continuation` is resumed with it on close.
    func awaitClose(_ continuation: UnsafeContinuation<Connection.CloseReason, Never>) {
        if let closeReason {
            continuation.resume(returning: closeReason)
        } else {
            closeWaiters.append(continuation)
        }
    }

    /// `done` runs once an outgoing connection is established or has failed (it resumes a task).
    func awaitConnect(_ done: @escaping (Result<Void, EventLoopError>) -> Void) {
        if let closeReason {
            done(.failure(connectFailure(closeReason)))
        } else if isConnected {
            done(.success(()))
        } else {
            connectWaiter = done
        }
    }

    func connectFailure(_ reason: Connection.CloseReason) -> EventLoopError {
        if case .error(let code) = reason { return .system(function: "connect \(remoteAddress)", errno: code) }
        return .loopClosed
    }

    /// A task using the connection was cancelled: the connection closes at once (output that was
    /// not sent is dropped) and every suspended operation ends with `.cancelled`.
    func cancel() {
        finish(.cancelled)
    }

    /// The last `Connection` handle is gone: nobody can read, write or close it any more, so it
    /// closes (gracefully) — unless a callback handler still holds on to it.
    func handleReleased() {
        guard !isClosed, lineHandler == nil, bytesHandler == nil, closeHandler == nil else { return }
        closeGracefully()
    }
}
