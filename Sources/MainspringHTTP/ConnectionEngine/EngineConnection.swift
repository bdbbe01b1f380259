@_spi(MainspringHTTP) import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// One connection of the connection engine: reads its requests one at a time (head, then body),
/// hands each to the engine, writes its response, and keeps its deadlines. Loop thread only.
final class EngineConnection {
    unowned let engine: ConnectionEngine
    let connection: Connection
    /// What has arrived and not been taken by a request yet: the bytes from `start` on.
    private var input: [UInt8] = []
    private var start = 0
    private var scan: RequestHeadScan
    private var phase = Phase.idle
    /// The request handed to the engine and not answered yet.
    private(set) var current: ConnectionExchange?
    /// The one timer of the connection's deadlines, and when it fires (the loop's clock, ns).
    /// A deadline that moves later leaves it as it is: when it fires early it is set again for
    /// what is left (a request costs no timer of its own).
    private var timer: TimerHandle?
    private var timerAt: UInt64 = 0
    /// The deadline in force and when it falls.
    private var deadline = Deadline.none
    private var deadlineAt: UInt64 = 0
    /// Reading was stopped while a request was with the server: input beyond
    /// `maxPipelinedBytes` waited (pipelining) and the rest stays in the kernel.
    private var isReadingPaused = false
    /// The peer has ended its side (its end of file was read).
    private var peerEnded = false
    /// The connection is no longer the engine's (closed, freed, or taken over).
    private var isDetached = false
    /// A deadline closed the connection.
    private var timedOut = false
    /// When the engine first wrote the current response (the loop's clock, ns; 0 before): its
    /// stall counts from the later of this and when output last left — not from its last
    /// write, so that a handler that keeps writing to a client that does not read is cut too.
    private var responseWrittenAt: UInt64 = 0

    private enum Deadline {
        case none
        /// A head, body or idle wait: the connection closes (timed out).
        case expire
        /// A response in flight or leaving: closed if it has not moved (`stallCheck`).
        case stall
        /// After a refusal: the connection closes.
        case linger
    }

    /// Input that may wait behind a request with the server (pipelined requests): past it,
    /// the connection is not read until the response has left.
    private static let maxPipelinedBytes = 64 * 1024

    private enum Phase {
        /// Between requests: nothing of the next one has arrived.
        case idle
        /// A head is arriving (the scan has seen its first bytes).
        case head
        /// A body is arriving.
        case body(RequestBodyReader, RequestHead)
        /// A request is with the server.
        case inFlight
        /// Its response is written and leaving: the request completes, and the next is taken (or
        /// the connection closes, when `closing`), once the output is sent — so that requests
        /// are answered in order, and a request counts as finished once its answer has left.
        case sending(closing: Bool)
        /// The guard answered and the write side is shut: the rest of the input is dropped until
        /// the peer leaves (at most two seconds).
        case lingering
        /// Closing after the last response.
        case closing
    }

    init(engine: ConnectionEngine, connection: Connection) {
        self.engine = engine
        self.connection = connection
        scan = RequestHeadScan(maxHeaderBytes: engine.limits.maxHeaderBytes, keepsTargetPath: engine.limits.shedsBeforeBody)
    }

    /// No request was read yet: the connection may still turn out to speak HTTP/2.
    private var isFirstRequest = true

    /// Starts reading (the connection is the engine's from now on) — or, when the client agreed
    /// on `h2` by ALPN, hands the connection to HTTP/2.
    func begin() {
        if engine.limits.http2 != nil, connection.negotiatedApplicationProtocol == "h2" {
            return engine.switchToHTTP2(self, input: [])
        }
        connection.onClose { [self] reason in
            closed(timedOut: timedOut || reason == .idleTimeout)
        }
        setDeadline(.expire, after: engine.limits.idleNanoseconds)
        readOn()
    }

    private func readOn() {
        connection.readBytes { [self] event in
            switch event {
            case .bytes(let bytes):
                switch phase {
                case .lingering:
                    return  // dropped: the answer is out
                case .inFlight, .sending:
                    if input.count - start + bytes.count > Self.maxPipelinedBytes {
                        connection.stopReading()
                        isReadingPaused = true
                    }
                default:
                    break
                }
                if input.isEmpty { input = bytes } else { input.append(contentsOf: bytes) }
            case .endOfFile:
                peerEnded = true
            }
            advance()
        }
    }

    // MARK: Reading requests

    /// Reads as far as the input goes: a head, a body, a request handed over.
    private func advance() {
        while !isDetached {
            switch phase {
            case .idle:
                guard start < input.count else {
                    if peerEnded {
                        cancelTimer()
                        connection.close()
                    }
                    return
                }
                if isFirstRequest, engine.limits.http2 != nil, input[start] == 0x50 {  // "P": HTTP/2's preface?
                    switch prefaceMatch() {
                    case .some(true):
                        return engine.switchToHTTP2(self, input: Array(input[start...]))
                    case .none:
                        if peerEnded { connection.close() }
                        return  // too few bytes to tell
                    case .some(false):
                        break
                    }
                }
                phase = .head
                scan.reset()
                setDeadline(.expire, after: engine.limits.headerNanoseconds)
            case .head:
                guard readHead() else { return }
            case .body(var reader, let head):
                phase = .head  // so that `reader` holds the body alone: appending to it copies nothing
                let outcome = reader.read(from: input, at: &start)
                switch outcome {
                case .needMore:
                    phase = .body(reader, head)
                    // What the reader took is not kept: a body that trickles in costs its size.
                    if start == input.count {
                        input.removeAll(keepingCapacity: true)
                        start = 0
                    } else if start >= 65_536 {
                        input.removeFirst(start)
                        start = 0
                    }
                    if peerEnded { connection.close() }
                    return
                case .tooLarge:
                    refuse(413, "Payload Too Large", "request body larger than \(engine.limits.maxBodyBytes) bytes\n")
                    return
                case .malformed(let reason):
                    refuse(400, "Bad Request", reason + "\n")
                    return
                case .done(let body):
                    dispatch(head, body: body)
                    return
                }
            case .inFlight, .sending, .lingering, .closing:
                if case .lingering = phase, peerEnded { connection.close() }
                return
            }
        }
    }

    /// Scans what arrived of the head; true when it is complete and the connection has moved on
    /// (to its body, or the request went to the server), false to wait for more or once answered.
    private func readHead() -> Bool {
        let scannedBefore = scan.bytes
        let within = input.withUnsafeBytes { all in
            scan.scan(UnsafeRawBufferPointer(rebasing: all[(start + scannedBefore)...]))
        }
        guard within else {
            refuse(431, "Request Header Fields Too Large", "request head larger than \(scan.maxHeaderBytes) bytes\n")
            return false
        }
        guard scan.isComplete else {
            if peerEnded { connection.close() }
            return false
        }
        let headBytes = input[start..<(start + scan.bytes)]
        start += scan.bytes
        let head: RequestHead
        switch RequestHead.parse(headBytes) {
        case .failure(let failure):
            refuse(failure.status, reasonPhrase(failure.status), failure.reason + "\n")
            return false
        case .success(let parsed):
            head = parsed
        }
        let limits = engine.limits
        let reader: RequestBodyReader
        switch head.framing {
        case .none:
            dispatch(head, body: [])
            return true
        case .length(let length) where length > limits.maxBodyBytes:
            // The body is read and dropped, then refused: a client that has sent it all reads the
            // 413 rather than a reset (one that stops sending it meets the body timeout,
            // unanswered).
            reader = .discarding(length)
        case .length(let length):
            if length == 0 {
                dispatch(head, body: [])
                return true
            }
            reader = .length(length)
        case .chunked:
            reader = .chunked(ChunkedBodyDecoder(maxBytes: limits.maxBodyBytes, maxTrailerBytes: limits.maxHeaderBytes))
        }
        if let expectation = head.expectation, !head.expectsContinue {
            refuse(417, "Expectation Failed", "cannot meet the expectation \(expectation.prefix(64))\n")
            return false
        }
        if limits.shedsBeforeBody, let retryAfter = engine.shedsBeforeBody(path: scan.targetPath) {
            refuse(503, "Service Unavailable", "overloaded: try again later\n", extra: "Retry-After: \(retryAfter)\r\n")
            return false
        }
        // `100 Continue` while none of the body has come — unless it is to be refused anyway.
        if head.expectsContinue, start >= input.count, !reader.isDiscarding {
            write(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8))
        }
        phase = .body(reader, head)
        setDeadline(.expire, after: limits.bodyNanoseconds)
        return true
    }

    /// Whether the input starts with HTTP/2's client preface (h2c with prior knowledge): nil
    /// while what arrived is a prefix of it.
    private func prefaceMatch() -> Bool? {
        let count = min(input.count - start, http2ClientPreface.count)
        guard input[start..<(start + count)].elementsEqual(http2ClientPreface[..<count]) else { return false }
        return count == http2ClientPreface.count ? true : nil
    }

    /// The request is read: it goes to the server; what arrives meanwhile waits for its
    /// response (up to `maxPipelinedBytes`).
    private func dispatch(_ head: RequestHead, body: [UInt8]) {
        isFirstRequest = false
        phase = .inFlight
        if start == input.count {
            input.removeAll(keepingCapacity: true)
            start = 0
        }
        let request = ConnectionExchange(owner: self, head: head, body: body)
        current = request
        responseWrittenAt = 0
        setDeadline(.stall, after: engine.limits.idleNanoseconds)
        engine.received(request)
    }

    /// The engine's own answer, before anything is routed: a plain-text body saying why, dated,
    /// `Connection: close`. The write side shuts after it, and what the client still sends is
    /// read and dropped until it leaves — for at most two seconds.
    private func refuse(_ status: Int, _ reason: String, _ body: String, extra: String = "") {
        let text = "HTTP/1.1 \(status) \(reason)\r\nContent-Type: text/plain; charset=utf-8\r\n" + extra
            + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n"
            + "Date: \(HTTPDateCache.format(time_t(engine.loop.calendarSeconds())))\r\n\r\n" + body
        write(Array(text.utf8))
        engine.answeredByGuard(status: status)
        phase = .lingering
        input = []
        start = 0
        connection.shutdownOutput()
        setDeadline(.linger, after: 2_000_000_000)
        if peerEnded { connection.close() }
    }

    // MARK: Answering

    func write(_ bytes: [UInt8]) {
        if responseWrittenAt == 0 { responseWrittenAt = engine.loop.monotonicNow() }
        connection.write(bytes)
    }

    var bufferedOutputBytes: Int { isDetached ? 0 : connection.bufferedOutputBytes }

    var isOpen: Bool { !isDetached && connection.isOpen }

    /// The response to `request` is written in full: once it has left, the request completes
    /// and the next one is read, or the connection closes. Until then the response must keep
    /// moving (`idleTimeout`, as while it was in flight); a connection that ends first loses it
    /// (the request finishes unwritten).
    func responded(_ request: ConnectionExchange, closing: Bool) {
        guard current === request, !isDetached else { return }
        phase = .sending(closing: closing)
        connection.whenOutputSent { [weak self] in self?.sent(request) }
    }

    private func sent(_ request: ConnectionExchange) {
        guard current === request, !isDetached, case .sending(let closing) = phase else { return }
        current = nil
        engine.completed(request)
        if closing || peerEnded && start >= input.count {
            phase = .closing
            cancelTimer()
            connection.close()
            return
        }
        phase = .idle
        if start > 0 {
            input.removeFirst(start)
            start = 0
        }
        setDeadline(.expire, after: engine.limits.idleNanoseconds)
        if isReadingPaused {
            isReadingPaused = false
            readOn()
        }
        advance()
    }

    /// Hands the connection over (a WebSocket upgrade): returns it with the bytes that came
    /// after the request, or nil when it is closed.
    func takeOver(_ request: ConnectionExchange) -> (Connection, [UInt8])? {
        guard current === request, isOpen else { return nil }
        let leftover = Array(input[start...])
        current = nil
        _ = detach()
        engine.removed(self, lost: request, timedOut: false)
        return (connection, leftover)
    }

    /// No longer the engine's: deadlines and reading stop. Returns the request in flight.
    func detach() -> ConnectionExchange? {
        isDetached = true
        cancelTimer()
        connection.stopReading()
        input = []
        start = 0
        defer { current = nil }
        return current
    }

    private func closed(timedOut: Bool) {
        guard !isDetached else { return }
        let request = detach()
        request?.connectionLost()
        engine.removed(self, lost: request, timedOut: timedOut)
    }

    // MARK: Deadlines

    /// `kind` falls `nanoseconds` from now (replacing the deadline in force). The timer moves only
    /// when it would fire too late.
    private func setDeadline(_ kind: Deadline, after nanoseconds: UInt64) {
        let now = engine.loop.monotonicNow()
        deadline = kind
        deadlineAt = now &+ max(1, nanoseconds)
        if timer == nil || timerAt > deadlineAt { startTimer(now: now) }
    }

    private func cancelTimer() {
        deadline = .none
        timer?.cancel()
        timer = nil
    }

    private func startTimer(now: UInt64) {
        timer?.cancel()
        timerAt = deadlineAt
        timer = engine.loop.schedule(after: .nanoseconds(Int64(clamping: deadlineAt &- now))) { [weak self] in
            self?.timerFired()
        }
    }

    private func timerFired() {
        timer = nil
        guard !isDetached else { return }
        let now = engine.loop.monotonicNow()
        switch deadline {
        case .none:
            return
        case _ where now < deadlineAt:
            startTimer(now: now)  // the deadline moved later meanwhile
        case .expire:
            expired()
        case .stall:
            stallCheck()
        case .linger:
            deadline = .none
            connection.close()
        }
    }

    /// A request with the server: its connection closes once its response has not moved for
    /// `idleTimeout` while some of it waits (the client does not read) — exactly then: counted
    /// from the later of the response's first write and the last time output left.
    private func stallCheck() {
        switch phase {
        case .inFlight, .sending: break
        default: return
        }
        guard connection.bufferedOutputBytes > 0 else {  // nothing waits
            return setDeadline(.stall, after: engine.limits.idleNanoseconds)
        }
        let now = engine.loop.monotonicNow()
        let lastMove = max(responseWrittenAt, connection.outputMovedAt ?? 0)
        let limit = engine.limits.idleNanoseconds
        if now &- lastMove >= limit {
            expired()
        } else {
            setDeadline(.stall, after: lastMove &+ limit &- now)
        }
    }

    private func expired() {
        deadline = .none
        guard !isDetached else { return }
        timedOut = true
        connection.abort()
    }
}
