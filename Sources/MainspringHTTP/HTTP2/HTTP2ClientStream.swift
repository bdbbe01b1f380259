import MainspringCore
import Synchronization

/// What reads a response's body for the client, whichever protocol it came in: an HTTP/1.1
/// exchange's `ResponseReader` or an HTTP/2 stream. One task at a time; `abandon` from anywhere.
protocol ResponseBody: AnyObject, Sendable {
    /// The next piece of the body, nil at its end.
    func next() async throws(HTTPClientError) -> [UInt8]?
    /// The trailer fields, once the body has ended.
    var trailers: HTTPHeaders { get }
    /// Stops reading: what is left of the response is dropped.
    func abandon()
}

extension ResponseBody {
    /// Reads the rest of the body and drops it (a redirect's, a retried answer's), up to `limit`
    /// bytes; past that the response is abandoned instead. So that what carried it can serve
    /// another request.
    func discard(upTo limit: Int) async throws(HTTPClientError) {
        var dropped = 0
        while let piece = try await next() {
            dropped += piece.count
            if dropped > limit {
                abandon()
                return
            }
        }
    }
}

/// One request of an HTTP/2 client connection (HTTP2ClientConnection.swift): its body as nghttp2
/// takes it, and its response as the frames arrive — handed to the task that reads it. The loop
/// side (`HTTP2ClientConnection`'s callbacks) and the reading task meet under a lock; the
/// request's `ResponseDeadline` resets the stream when a limit runs out.
final class HTTP2ClientStream: ResponseBody, @unchecked Sendable {
    private let connection: HTTP2ClientConnection
    let method: HTTPMethod
    private let url: String
    /// Set once, on the loop, when nghttp2 gives the stream its identifier.
    var streamID: Int32 = 0
    /// The request body and how much of it nghttp2 has taken. Loop thread only.
    private var requestBody: [UInt8]
    private var requestSent = 0
    /// The response's fields as they are decoded, and its status. Loop thread only.
    private var status = 0
    private var fields: [(name: String, value: String)] = []
    private var trailerFields: [(name: String, value: String)] = []
    private var headerBytes = 0
    private let maxHeaderBytes: Int
    private var deadline: ResponseDeadline!

    private struct State {
        var head: ResponseHead?
        var chunks: [[UInt8]] = []
        var ended = false
        var failure: HTTPClientError?
        /// The request never reached the server's processing (refused, or cut by a GOAWAY before
        /// it): another connection may take it.
        var refused = false
        var trailers = HTTPHeaders()
        var headWaiter: CheckedContinuation<Void, Never>?
        var bodyWaiter: CheckedContinuation<Void, Never>?
        var settled = false
    }

    private let state = Protected(State())

    init(connection: HTTP2ClientConnection, method: HTTPMethod, url: String, body: [UInt8], request: RequestDeadline,
         responseTimeout: Duration, maxHeaderBytes: Int)
    {
        self.connection = connection
        self.method = method
        self.url = url
        requestBody = body
        self.maxHeaderBytes = maxHeaderBytes
        deadline = ResponseDeadline(loop: connection.loop, limit: responseTimeout, request: request, stream: self)
    }

    deinit { abandon() }

    // MARK: The loop's side (HTTP2ClientConnection's callbacks)

    /// nghttp2 wants up to `buffer.count` bytes of the request body.
    func readRequestBody(into buffer: UnsafeMutableRawBufferPointer) -> HTTP2DataRead {
        let count = min(buffer.count, requestBody.count - requestSent)
        if count > 0 {
            requestBody.withUnsafeBytes { all in
                buffer.baseAddress!.copyMemory(from: all.baseAddress! + requestSent, byteCount: count)
            }
            requestSent += count
        }
        if requestSent == requestBody.count { requestBody = [] }
        return .bytes(count, end: requestSent >= requestBody.count)
    }

    /// A header block begins: a response's or an interim one's, or (`trailers`) the trailers'.
    func beginsHeaders(trailers: Bool) {
        readingTrailers = trailers
        guard !trailers else { return }
        status = 0
        fields.removeAll(keepingCapacity: true)
    }

    /// The header block being read is the trailers (its fields go to `trailerFields`).
    private var readingTrailers = false

    /// One field of the block; false (the stream is reset) past `maxHeaderBytes`.
    func header(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        headerBytes += name.count + value.count + 32
        guard headerBytes <= maxHeaderBytes else {
            fail(.headersTooLarge(limit: maxHeaderBytes))
            return false
        }
        if name.count == 7, name.elementsEqual(":status".utf8) {
            status = Int(String(decoding: value, as: UTF8.self)) ?? 0
            return true
        }
        guard name.first != 0x3A else { return true }
        let field = (String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self))
        if readingTrailers { trailerFields.append(field) } else { fields.append(field) }
        return true
    }

    /// A response header block is complete: an interim one (1xx) is dropped, a final one is the
    /// head.
    func headersEnded(endsStream: Bool) {
        if status >= 100 && status < 200 {
            headerBytes = 0
            return
        }
        let head = ResponseHead(status: status, reason: reasonPhrase(status), headers: HTTPHeaders(fields: fields), url: url)
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.head = head
            if endsStream { state.ended = true }
            defer { state.headWaiter = nil }
            return state.headWaiter
        }
        waiter?.resume()
    }

    /// Trailers arrived: the body has ended.
    func trailersEnded() {
        let trailers = HTTPHeaders(fields: trailerFields)
        wake { state in
            state.trailers = trailers
            state.ended = true
        }
    }

    func received(_ bytes: UnsafeRawBufferPointer) {
        let chunk = Array(bytes)
        wake { $0.chunks.append(chunk) }
    }

    /// The stream ended (END_STREAM): the body is complete — or, before any head, the server
    /// answered nothing.
    func bodyEnded() {
        wake { state in
            if state.head == nil {
                if state.failure == nil { state.failure = .closedMidResponse("the HTTP/2 stream ended without a response") }
            } else {
                state.ended = true
            }
        }
    }

    /// The stream closed with `errorCode`, or its connection went (`errorCode` nil): what has
    /// not arrived fails.
    func closed(errorCode: UInt32?, refused: Bool = false) {
        wake { state in
            guard !state.ended, state.failure == nil else { return }
            if refused && state.head == nil { state.refused = true }
            let what = errorCode.map { "HTTP/2 stream reset, error \(HTTP2ClientConnection.errorName($0))" }
                ?? "the HTTP/2 connection closed"
            state.failure = .closedMidResponse(what)
        }
    }

    /// A limit of the request's deadline ran out (any thread): the stream is reset, and the
    /// read in progress ends.
    func timedOut() {
        fail(deadline.timeoutError ?? .responseTimeout(.zero))
        connection.reset(self)
    }

    private func fail(_ error: HTTPClientError) {
        wake { state in
            if state.failure == nil && !state.ended { state.failure = error }
        }
    }

    /// Changes the state and resumes whoever waits on it.
    private func wake(_ change: (inout State) -> Void) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            change(&state)
            let waiters = [state.headWaiter, state.bodyWaiter].compactMap { $0 }
            state.headWaiter = nil
            state.bodyWaiter = nil
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    // MARK: The reading task's side

    /// Whether the request may go again on another connection: nothing of it was processed.
    var wasRefused: Bool { state.withLock { $0.refused } }

    /// Waits for the response's head, under the request's deadline.
    func awaitHead() async throws(HTTPClientError) -> ResponseHead {
        deadline.beginPhase(.awaitingResponse)
        defer { deadline.endPhase() }
        while true {
            let outcome = state.withLock { state -> Result<ResponseHead, HTTPClientError>? in
                if let head = state.head { return .success(head) }
                if let failure = state.failure { return .failure(failure) }
                return nil
            }
            if let outcome {
                if case .failure = outcome { settle() }
                return try outcome.get()
            }
            try await waitForChange(\.headWaiter) { $0.head != nil || $0.failure != nil }
        }
    }

    func next() async throws(HTTPClientError) -> [UInt8]? {
        deadline.beginPhase(.readingBody)
        defer { deadline.endPhase() }
        while true {
            let outcome = state.withLock { state -> Result<[UInt8]?, HTTPClientError>? in
                if !state.chunks.isEmpty { return .success(state.chunks.removeFirst()) }
                if state.ended { return .success(nil) }
                if let failure = state.failure { return .failure(failure) }
                return nil
            }
            switch outcome {
            case .success(let chunk?):
                connection.consume(self, count: chunk.count)
                return chunk
            case .success(nil):
                settle()
                return nil
            case .failure(let error):
                settle()
                throw error
            case nil:
                break
            }
            try await waitForChange(\.bodyWaiter) { !$0.chunks.isEmpty || $0.ended || $0.failure != nil }
        }
    }

    /// Waits until `ready` holds of the state (checked under the lock, then each time the loop's
    /// side changes it), or the task is cancelled — which abandons the response and throws.
    private func waitForChange(_ waiter: WritableKeyPath<State, CheckedContinuation<Void, Never>?>,
                               until ready: @escaping @Sendable (State) -> Bool) async throws(HTTPClientError)
    {
        if Task.isCancelled {
            abandon()
            throw .cancelled
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let isReady = state.withLock { state -> Bool in
                    if ready(state) || Task.isCancelled { return true }
                    state[keyPath: waiter] = continuation
                    return false
                }
                if isReady { continuation.resume() }
            }
        } onCancel: {
            fail(.cancelled)
            abandon()  // the stream is reset: the server stops working on it
        }
    }

    var trailers: HTTPHeaders { state.withLock { $0.trailers } }

    func abandon() {
        let wasSettled = state.withLock { state -> Bool in
            defer { state.settled = true }
            return state.settled || state.ended
        }
        deadline.settle()
        guard !wasSettled else { return }
        connection.reset(self)
    }

    /// The exchange is over: its deadline's timer goes.
    private func settle() {
        state.withLock { $0.settled = true }
        deadline.settle()
    }
}
