#if canImport(Glibc)
import Glibc
#endif

/// Writing: coalesced output, backpressure, writability, half-close and close.
extension ConnectionSource {
    // MARK: Writing

    func write(_ bytes: [UInt8]) {
        requireWritable()
        guard state.isOpen, socket != nil, !bytes.isEmpty else { return }
        if pendingOutput.capacity == 0 { takeSpareOutputBuffer() }
        pendingOutput.append(contentsOf: bytes)
        scheduleFlush()
    }

    func write<Text: StringProtocol>(text: Text, newline: Bool) {
        requireWritable()
        guard state.isOpen, socket != nil, newline || !text.isEmpty else { return }
        if pendingOutput.capacity == 0 { takeSpareOutputBuffer() }
        // In one copy where the text is contiguous (a native string or a slice of one); a
        // Substring's UTF-8 view appended as a sequence went byte by byte (474 instructions for
        // a 17-byte echo, bench-counts).
        if text.utf8.withContiguousStorageIfAvailable({ pendingOutput.append(contentsOf: $0) }) == nil {
            pendingOutput.append(contentsOf: text.utf8)
        }
        if newline { pendingOutput.append(0x0A) }
        scheduleFlush()
    }

    /// Writing to the read end of a child's pipe (its stdout or stderr) is a misuse.
    @inline(__always)
    func requireWritable() {
        requireUsage(role != .pipeReadEnd,
                     "Mainspring: Connection.write/send: this connection is a child process's standard output or error, which is read-only")
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
        if let reason = state.closeReason { return .failed(reason) }
        if !state.isOpen || socket == nil { return .failed(.closed) }
        if state.isOutputPaused || hasWaitingSenders { return .wait }
        write(payload)
        if let reason = state.closeReason { return .failed(reason) }
        return .element(())
    }

    /// `Connection.trySend` on the loop's thread: written unless the output is over its limit,
    /// senders are waiting, or the connection is not open.
    func offer(_ payload: Payload) -> Bool {
        guard state.isOpen, socket != nil, !state.isOutputPaused, !hasWaitingSenders else { return false }
        write(payload)
        return state.isOpen
    }

    /// A `trySend` accepted on another thread arrives: written (its bytes leave the in-flight
    /// count), unless the connection closed meanwhile.
    func deliverOffered(_ payload: Payload, accounted: Int) {
        inFlightBytes.subtract(accounted, ordering: .relaxed)
        write(payload)
    }

    func parkSender(_ payload: Payload,
                    _ continuation: UnsafeContinuation<Result<Void, Connection.CloseReason>, Never>)
    {
        senders.append(Sender(payload: payload, continuation: continuation))
    }

    /// Output drained below half the limit: the waiting senders write, in order, until the
    /// output is over the limit again.
    func resumeSenders() {
        guard let rare else { return }
        while rare.firstSender < rare.senders.count, !state.isOutputPaused, state.isOpen {
            let sender = rare.senders[rare.firstSender]
            rare.firstSender += 1
            write(sender.payload)
            let result: Result<Void, Connection.CloseReason> = state.closeReason.map { .failure($0) } ?? .success(())
            loop.resumingInput { sender.continuation.resume(returning: result) }
        }
        if rare.firstSender == rare.senders.count {
            rare.senders.removeAll(keepingCapacity: rare.senders.capacity <= 16)
            rare.firstSender = 0
        }
    }

    /// Output is written before the loop next polls (or before lower-priority work, once the
    /// pass's `.input` callbacks have run), or at once past 64 KiB or past the output limit (so
    /// that backpressure sees it).
    func scheduleFlush() {
        if pendingOutput.count >= Self.chunk || pendingOutput.count + (socket?.outputLength ?? 0) > kept.outputLimit {
            flushPendingOutput()
        } else if !flushScheduled {
            flushScheduled = true
            withLoop { $0.beforeNextPoll(self) }
        }
    }

    /// Hands the buffered output to the socket: straight to the kernel while libevent's output
    /// buffer is empty (a connected socket, plain or through its layer), what it does not take to
    /// libevent.
    func flushPendingOutput() {
        guard !pendingOutput.isEmpty, let socket else { return }
        let written = state.isConnected ? writeNow(socket) : 0
        do {
            if written < pendingOutput.count { try socket.write(pendingOutput, from: written) }
        } catch {
            pendingOutput.removeAll()
            finish(.error(error.errnoCode))
            return
        }
        if pendingOutput.capacity <= Self.retainedCapacity {
            pendingOutput.removeAll(keepingCapacity: true)
            giveBackOutputBuffer()
        } else {
            pendingOutput = []
        }
        if state.outputGrew(to: socket.outputLength, limit: kept.outputLimit) {
            outputPausedFlag.store(true, ordering: .relaxed)
            applyReadChange()
            socket.setWriteLowWatermark(kept.outputLimit / 2)
        }
        // All of it went straight to the kernel: no write callback will say so.
        if let rare, !rare.outputSentHandlers.isEmpty, socket.outputLength == 0 { runOutputSentHandlers() }
    }

    /// Takes an emptied buffer of another connection of this loop, if one is spare, for
    /// `pendingOutput` (which has no capacity).
    private func takeSpareOutputBuffer() {
        withLoop { loop in
            if let spare = loop.spareOutputBuffers.popLast() { pendingOutput = spare }
        }
    }

    /// Hands the emptied `pendingOutput` to the loop's spares (at most `maxSpareOutputBuffers`
    /// of them; past that the connection keeps it).
    private func giveBackOutputBuffer() {
        withLoop { loop in
            guard loop.spareOutputBuffers.count < Self.maxSpareOutputBuffers else { return }
            var emptied: [UInt8] = []
            swap(&emptied, &pendingOutput)
            loop.spareOutputBuffers.append(emptied)
        }
    }

    /// Spare output buffers a loop keeps (each at most `retainedCapacity` bytes).
    static let maxSpareOutputBuffers = 64

    /// Writes what it can of `pendingOutput` at once, past libevent's output buffer, and returns
    /// how many bytes went (`flushPendingOutput` buffers the rest): a plain socket's `send(2)`,
    /// or the layer's own write (TLS: one `SSL_write`) while that buffer is empty. Never on a
    /// pipe to a child.
    @inline(__always)
    private func writeNow(_ socket: BufferedSocket) -> Int {
        guard role == .socket else { return 0 }
        guard let layer else { return socket.writeNow(pendingOutput) }
        return socket.outputLength == 0 ? layer.transport.writeNow(pendingOutput) : 0
    }

    /// The output drained to the low watermark (libevent's write callback).
    func drained() {
        guard let socket else { return }
        defer { if let rare, !rare.outputSentHandlers.isEmpty { runOutputSentHandlers() } }
        let actions = state.outputDrained(to: socket.outputLength, limit: kept.outputLimit)
        if actions.contains(.finishClosing) {
            finish(closingReason)
            return
        }
        if actions.contains(.shutdownWrite) { halfClose(socket) }
        if actions.contains(.resumeFlow) {
            socket.setWriteLowWatermark(0)
            outputPausedFlag.store(false, ordering: .relaxed)
            resumeSenders()
            resumeWritable()
            guard !state.isOutputPaused, state.isOpen else { return }
            applyReadChange()
            deliverInput()
        }
    }

    // MARK: Writability

    /// Runs `handler` once the output is under its limit: next turn if it is now, else when it
    /// has drained to half the limit. Dropped if the connection closes first.
    func whenWritable(_ handler: @escaping () -> Void) {
        guard state.isOpen else { return }
        writableHandlers.append(handler)
        if !state.isOutputPaused { withLoop { $0.execute(priority: .input, LoopBound(resumeWritableWork(self)).run) } }
    }

    /// Runs `handler` once the output has all been handed to the kernel (or, on a simulated
    /// loop, to the network): next turn if it has now. Dropped if the connection closes first.
    func whenOutputSent(_ handler: @escaping () -> Void) {
        guard state.isOpen else { return }
        outputSentHandlers.append(handler)
        if bufferedOutputBytes == 0 {
            withLoop { $0.execute(priority: .input, LoopBound { [self] in runOutputSentHandlers() }.run) }
        }
    }

    /// Runs the `whenOutputSent` handlers if the output is all sent.
    func runOutputSentHandlers() {
        guard state.isOpen, bufferedOutputBytes == 0, !outputSentHandlers.isEmpty else { return }
        let handlers = outputSentHandlers
        outputSentHandlers = []
        for handler in handlers { handler() }
    }

    /// Parks a task until the output is writable (true), or `timeout` passes (false).
    func awaitWritable(ticket: Int, timeout: Duration?,
                       _ continuation: UnsafeContinuation<Result<Bool, Connection.CloseReason>, Never>)
    {
        if rare?.cancelledWaitTickets.remove(ticket) != nil {
            continuation.resume(returning: .success(false))
            return
        }
        if let reason = state.closeReason {
            continuation.resume(returning: reason == .closed ? .success(false) : .failure(reason))
            return
        }
        if !state.isOpen {
            continuation.resume(returning: .success(false))
            return
        }
        if !state.isOutputPaused && !hasWaitingSenders {
            continuation.resume(returning: .success(true))
            return
        }
        writableWaiters[ticket] = continuation
        if let timeout {
            withLoop { loop in
                _ = loop.schedule(after: timeout) { [weak self] in
                    guard let self, let waiter = self.rare?.writableWaiters.removeValue(forKey: ticket) else { return }
                    waiter.resume(returning: .success(false))
                }
            }
        }
    }

    /// The task of `ticket` was cancelled: its wait ends (false), the connection stays open.
    func cancelWritableWait(ticket: Int) {
        if let waiter = rare?.writableWaiters.removeValue(forKey: ticket) {
            waiter.resume(returning: .success(false))
        } else if !isClosed {
            // Its wait has not arrived yet (or has ended already: then the entry is never used;
            // the set is kept small, and a wait that misses its entry only waits longer).
            if cancelledWaitTickets.count >= 64 { cancelledWaitTickets.removeAll() }
            cancelledWaitTickets.insert(ticket)
        }
    }

    /// The output is under its limit again: writability waiters and handlers run.
    func resumeWritable() {
        guard state.isOpen, !state.isOutputPaused else { return }  // over the limit again: the next drain
        if !writableWaiters.isEmpty {
            let waiting = writableWaiters
            writableWaiters = [:]
            for (_, waiter) in waiting.sorted(by: { $0.key < $1.key }) {
                loop.resumingInput { waiter.resume(returning: .success(true)) }
            }
        }
        guard !writableHandlers.isEmpty else { return }
        let handlers = writableHandlers
        writableHandlers = []
        for handler in handlers {
            guard state.isOpen, !state.isOutputPaused else {
                writableHandlers.append(handler)  // over the limit again: it waits for the next drain
                continue
            }
            handler()
        }
    }

    func failWritableWaiters(_ reason: Connection.CloseReason) {
        let waiting = writableWaiters
        writableWaiters = [:]
        for (_, waiter) in waiting {
            waiter.resume(returning: reason == .closed ? .success(false) : .failure(reason))
        }
    }

    // MARK: Half-close and close

    func shutdownOutput() {
        switch role {
        case .socket: break
        case .pipeReadEnd: return  // no output to end
        case .pipeWriteEnd:
            // A pipe has no half-close: the end of a child's input is the close of its pipe.
            closeGracefully()
            return
        }
        flushPendingOutput()
        guard let socket else { return }
        if state.shutdownOutputRequested(outputLength: socket.outputLength) {
            // Still connecting: the socket half-closes once it is there.
            if state.isConnected { halfClose(socket) } else { shutdownWhenConnected = true }
        }
    }

    /// Ends the output, its layer's first (TLS's close_notify, which a TLS peer reads as the
    /// end of the stream — OpenSSL 3 answers a bare end of TCP with a `decode_error` alert),
    /// then the socket's write side.
    func halfClose(_ socket: BufferedSocket) {
        endLayerOutput(socket)
        socket.shutdownWrite()
    }

    /// The layer's last words (TLS's close_notify), if there is a layer: before a half-close,
    /// and before a graceful close. (Over a simulated stream the send buffer is lifted first, so
    /// that the record goes whole.)
    func endLayerOutput(_ socket: BufferedSocket) {
        guard let transport else { return }
        socket.simulated?.layerWillClose()
        transport.willClose()
    }

    func closeGracefully() {
        flushPendingOutput()
        guard let socket, let step = state.closeRequested(outputLength: socket.outputLength) else { return }
        outputPausedFlag.store(true, ordering: .relaxed)
        applyReadChange()
        endAsyncOperationsForClosing()
        switch step {
        case .finish:
            finish(closingReason)
        case .flush:
            socket.setWriteLowWatermark(0)
            socket.setTimeouts(readNanoseconds: nil, writeNanoseconds: kept.closeTimeoutNanoseconds)
        }
    }

    /// Closing: no more input for the reader, no more output for the senders.
    func endAsyncOperationsForClosing() {
        endAsyncRead(with: .closed)
        failSenders(.closed)
        failWritableWaiters(.closed)
        writableHandlers = []
        outputSentHandlers = []
    }

    func failSenders(_ reason: Connection.CloseReason) {
        let waiting = senders[firstSender...]
        senders = []
        firstSender = 0
        for sender in waiting { sender.continuation.resume(returning: .failure(reason)) }
    }

    func setCloseHandler(_ handler: @escaping (Connection.CloseReason) -> Void) {
        if let closeReason = state.closeReason {
            loop.execute { [handler = LoopBound(handler)] in handler.value(closeReason) }
        } else {
            closeHandler = handler
        }
    }

    /// The reason, if closed already; otherwise `continuation` is resumed with it on close.
    func awaitClose(_ continuation: UnsafeContinuation<Connection.CloseReason, Never>) {
        if let closeReason = state.closeReason {
            continuation.resume(returning: closeReason)
        } else {
            closeWaiters.append(continuation)
        }
    }

    /// `done` runs once an outgoing connection is established or has failed (it resumes a task).
    func awaitConnect(_ done: @escaping (Result<Void, EventLoopError>) -> Void) {
        if let closeReason = state.closeReason {
            done(.failure(connectFailure(closeReason)))
        } else if state.isConnected {
            done(.success(()))
        } else {
            connectWaiter = done
        }
    }

    func connectFailure(_ reason: Connection.CloseReason) -> EventLoopError {
        if case .error(let code) = reason { return .system(function: "connect \(remoteAddress)", errno: code) }
        if case .connectFailed(let error) = reason { return error }
        if case .cancelled = reason { return .cancelled }
        return .loopClosed
    }

    /// The task using the connection was cancelled: its reads and sends end now with
    /// `.cancelled`, and the connection closes as `close()` closes it — what was queued before
    /// (a goodbye) is still sent, within `closeTimeout` — and reports `.cancelled`. A connection
    /// with nothing to send, not yet connected, or not a socket closes at once.
    func cancel() {
        guard role == .socket, state.isOpen, state.isConnected, let socket,
              socket.outputLength > 0 || !pendingOutput.isEmpty
        else {
            finish(.cancelled)
            return
        }
        closesForCancellation = true
        endAsyncRead(with: .cancelled)
        failSenders(.cancelled)
        failWritableWaiters(.cancelled)
        closeGracefully()
    }

    /// What a graceful close reports once its output is sent (or `closeTimeout` passed):
    /// `.closed`, or `.cancelled` when a task's cancellation started it.
    var closingReason: Connection.CloseReason { closesForCancellation ? .cancelled : .closed }

    /// The last `Connection` handle is gone: nobody can read, write or close it any more, so it
    /// closes (gracefully) — unless a callback handler still holds on to it.
    func handleReleased() {
        guard !isClosed, callbackReader == nil, closeHandler == nil, writableHandlers.isEmpty, outputSentHandlers.isEmpty
        else { return }
        closeGracefully()
    }
}

/// Runs the writability handlers of a source (posted when it is writable already).
private func resumeWritableWork(_ source: ConnectionSource) -> () -> Void {
    { [weak source] in
        guard let source, source.state.isOpen, !source.state.isOutputPaused else { return }
        source.resumeWritable()
    }
}
