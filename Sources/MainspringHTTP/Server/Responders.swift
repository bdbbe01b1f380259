import MainspringCore

/// Answers one request later, from any thread, exactly once (a deferred handler's way to reply).
///
/// `send` hops to the request's loop (one `execute`) unless called there. Later calls are
/// ignored. A responder released without having answered answers `500`, so no request hangs.
public final class HTTPResponder: Sendable {
    private let state: RequestBox

    init(endpoint: LoopEndpoint, request: any ServerExchange, method: HTTPMethod) {
        state = RequestBox(endpoint: endpoint, request: request, method: method)
    }

    /// The loop the request belongs to.
    public var loop: EventLoop { state.endpoint.loop }

    /// Sends `response`. Any thread; the first call wins.
    public func send(_ response: HTTPResponse) { state.send(response) }

    /// Sends the response for `error`: its status for an `HTTPError`, else `500` (no detail).
    public func send(error: any Error) { state.send(LoopEndpoint.errorResponse(error)) }

    deinit { state.send(.status(500)) }
}

/// A request handle shared by a responder and the loop: taken once.
private final class RequestBox: @unchecked Sendable {
    let endpoint: LoopEndpoint
    private let request: Protected<(any ServerExchange)?>
    private let method: HTTPMethod

    init(endpoint: LoopEndpoint, request: any ServerExchange, method: HTTPMethod) {
        self.endpoint = endpoint
        self.request = Protected(request)
        self.method = method
    }

    func send(_ response: HTTPResponse) {
        let taken = request.withLock { request in
            defer { request = nil }
            return request
        }
        guard let taken else { return }
        let endpoint = self.endpoint, method = self.method
        let box = LoopBound(taken)
        if endpoint.loop.isCurrent {
            endpoint.reply(response, to: taken, method: method)
        } else {
            endpoint.loop.execute(priority: .input) { endpoint.reply(response, to: box.value, method: method) }
        }
    }
}

/// Streams a response in chunks (`Transfer-Encoding: chunked`; an HTTP/1.0 client gets the bytes
/// and then the connection closes), with backpressure. Loop-bound: use it on the request's loop.
///
/// ```swift
/// routes.on([.get], "/count", streaming: { request, writer in
///     let job = feeder.feed(chunks: 100) { i in
///         writer.write("\(i)\n")
///         if !writer.isWritable { job.pause(); writer.onWritable { job.resume() } }
///     }
///     job.onCompletion { _ in writer.finish() }
///     writer.onCancel { job.cancel() }          // the client went away
/// })
/// ```
///
/// Backpressure: `isWritable` turns false once more than `highWatermark` bytes wait to be sent;
/// `onWritable` runs once when they have drained. Writing more anyway is buffered (memory is the
/// caller's responsibility). The response starts with the first `start` or `write` (status 200
/// by default) and ends with `finish()` — also when the writer is released unfinished.
/// A handler that throws before writing anything answers like a synchronous handler would.
public final class HTTPResponseWriter {
    private let endpoint: LoopEndpoint
    private let request: any ServerExchange
    private let method: HTTPMethod
    private var hasStarted = false
    private(set) public var isFinished = false
    private var writableWaiters: [() -> Void] = []
    private var cancelHandlers: [() -> Void] = []
    private var didReportCancel = false
    /// Bytes waiting to be sent above which `isWritable` is false. Default 256 KiB.
    public var highWatermark = 256 * 1024

    init(endpoint: LoopEndpoint, request: any ServerExchange, method: HTTPMethod) {
        self.endpoint = endpoint
        self.request = request
        self.method = method
    }

    /// The loop the request belongs to.
    public var loop: EventLoop { endpoint.loop }

    /// Starts the response with `status` and `headers` (`Content-Type` defaults to
    /// `text/plain; charset=utf-8`). Ignored after the response started.
    public func start(status: Int = 200, headers: HTTPHeaders = [:]) {
        endpoint.loop.preconditionOnLoopForHTTP("HTTPResponseWriter.start")
        guard !hasStarted, !isFinished else { return }
        hasStarted = true
        var headers = headers
        if !headers.contains("Content-Type") { headers.add("Content-Type", "text/plain; charset=utf-8") }
        endpoint.startStream(request, status: status, headers: headers)
    }

    /// Sends `bytes` as one chunk (starting the response if needed). Ignored once finished or
    /// when the client is gone.
    public func write(_ bytes: [UInt8]) {
        endpoint.loop.preconditionOnLoopForHTTP("HTTPResponseWriter.write")
        if !hasStarted { start() }
        guard !isFinished, !bytes.isEmpty else { return }
        guard request.isConnectionOpen else {
            reportCancel()
            return
        }
        request.sendChunk(bytes) { [weak self] in self?.drained() }
    }

    /// Sends `text` as UTF-8.
    public func write(_ text: String) { write(Array(text.utf8)) }

    /// Whether fewer than `highWatermark` bytes wait to be sent (and the client is still there).
    public var isWritable: Bool {
        request.isConnectionOpen && request.bufferedOutputBytes < highWatermark
    }

    /// Whether the client went away before the response was finished.
    public var isCancelled: Bool { !isFinished && !request.isConnectionOpen }

    /// Runs `body` once, on the loop, when the writer is writable again (at the next turn if it
    /// is already; also when the client went away, so a paused producer wakes up to see it).
    public func onWritable(_ body: @escaping () -> Void) {
        endpoint.loop.preconditionOnLoopForHTTP("HTTPResponseWriter.onWritable")
        if isWritable || !request.isConnectionOpen {
            let call = LoopBound(body)
            endpoint.loop.execute { call.value() }
        } else {
            writableWaiters.append(body)
        }
    }

    /// Runs `body` once, on the loop, if the client goes away before `finish()`.
    public func onCancel(_ body: @escaping () -> Void) {
        if didReportCancel { body() } else { cancelHandlers.append(body) }
    }

    /// Ends the response. Idempotent.
    public func finish() {
        guard !isFinished else { return }
        if !hasStarted { start() }
        isFinished = true
        writableWaiters = []
        cancelHandlers = []
        request.endChunked()
    }

    func fail(with error: any Error) {
        if hasStarted {
            finish()
        } else {
            isFinished = true
            endpoint.reply(LoopEndpoint.errorResponse(error), to: request, method: method)
        }
    }

    private func drained() {
        if !request.isConnectionOpen { reportCancel() }
        guard !writableWaiters.isEmpty, isWritable || !request.isConnectionOpen else { return }
        let waiters = writableWaiters
        writableWaiters = []
        for waiter in waiters { waiter() }
    }

    private func reportCancel() {
        guard !didReportCancel, !isFinished else { return }
        didReportCancel = true
        let handlers = cancelHandlers
        cancelHandlers = []
        for handler in handlers { handler() }
        let waiters = writableWaiters
        writableWaiters = []
        for waiter in waiters { waiter() }
    }

    deinit {
        if !isFinished {
            if !hasStarted && !isFinished {
                isFinished = true
                endpoint.reply(.status(500), to: request, method: method)
            } else {
                isFinished = true
                request.endChunked()
            }
        }
    }
}

@available(*, unavailable)
extension HTTPResponseWriter: Sendable {}

extension EventLoop {
    func preconditionOnLoopForHTTP(_ function: StaticString) {
        requireUsage(isCurrent, "MainspringHTTP: \(function) must be called on the request's loop")
    }
}
