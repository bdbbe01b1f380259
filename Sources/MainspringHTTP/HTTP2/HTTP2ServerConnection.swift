// HTTP/2 on the connection engine: a connection whose client opened with HTTP/2's preface (h2c
// with prior knowledge) or agreed on `h2` by ALPN leaves the HTTP/1.1 reader
// (EngineConnection.swift) for an `HTTP2ServerConnection`, an nghttp2 server session over the same
// `Connection` (NGHTTP2/HTTP2Session.swift) — on real and simulated loops alike. Each stream is
// one `HTTP2Exchange`, handed to the server through the seam every request takes
// (ServerEngine.swift): the same routes, handlers, streaming, limits, load shedding, statistics
// and closing as HTTP/1.1; a handler tells the two apart only by `request.version`.
//
// Limits, the same as HTTP/1.1's where there is one:
// - a header list that decodes past `maxHeaderBytes` (RFC 9113 §6.5.2's size: name, value and 32
//   per field — an HPACK bomb included) is answered 431, its fields not kept past the limit; the
//   limit is also announced (SETTINGS_MAX_HEADER_LIST_SIZE);
// - a body past `maxBodyBytes` 413, an unknown method 501, and, while load shedding sheds, a
//   request that announces a body 503 with `Retry-After` before its body is read;
// - streams at once: `HTTP2Options.maxConcurrentStreams` (SETTINGS_MAX_CONCURRENT_STREAMS; nghttp2
//   refuses the streams past it);
// - flow control is the backpressure both ways: a request body is taken as it comes up to its
//   limit, and a response goes out as the client's windows let it — a streamed response's
//   writer waits for its chunks to leave, so a client that never opens its window holds no
//   more than a chunk or a whole response in memory, and a response that has not moved for
//   `idleTimeout` is reset (CANCEL);
// - a head that has not arrived `headerTimeout` after its stream opened, or a body `bodyTimeout`
//   after its head, resets its stream (CANCEL); a connection with no stream for `idleTimeout`
//   closes with GOAWAY, as does one whose output the kernel has not taken for `idleTimeout`.
//
// Refused with GOAWAY ENHANCE_YOUR_CALM, the connection closed (each limit a token bucket on
// the loop's clock, so what the RFC allows at a human rate passes):
// - Rapid Reset (CVE-2023-44487): streams the client resets before their response has ended,
//   past `HTTP2Options.maxResetsPerSecond` (a burst of ten times that);
// - a CONTINUATION flood (CVE-2024-27316 and kin): more than 8 CONTINUATION frames after one
//   HEADERS, or a header block past `maxHeaderBytes` plus 16 KiB on the wire;
// - SETTINGS, PING, PRIORITY and empty-DATA floods: past `HTTP2Options.maxControlFramesPerSecond`
//   (a burst of five times that) of those frames. nghttp2's own limits (a peer that leaves a
//   thousand ACKs unread; its CONTINUATION limit) end the session the same way.
//
// Closing: stopping accepting sends GOAWAY (NO_ERROR) naming the last stream taken; the
// streams before it finish, then the connection closes. Freed, it ends at once (its requests
// in flight finish unwritten).
#if canImport(Glibc)
import Glibc
#endif
@_spi(MainspringHTTP) import MainspringCore

/// The client connection preface (RFC 9113 §3.4): what an h2c client with prior knowledge sends
/// first.
let http2ClientPreface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

/// One HTTP/2 connection of the engine. Loop thread only (`@unchecked Sendable` only so that its
/// flush can be posted to its own loop with `execute`, which takes a `@Sendable` closure: it runs
/// on that same thread).
final class HTTP2ServerConnection: HTTP2SessionDelegate, @unchecked Sendable {
    unowned let engine: ConnectionEngine
    let connection: Connection
    private let limits: ServerLimits
    private let options: HTTPServer.HTTP2Options
    private var session: HTTP2Session!
    /// The streams opened and not closed yet.
    private var streams: [Int32: HTTP2Exchange] = [:]
    /// The connection is no longer the engine's (closed or freed).
    private var isDetached = false
    /// GOAWAY was sent (closing, or the peer ended its side): the connection closes once its
    /// streams have.
    private var isEnding = false
    /// A flood ended the session: what it still reads is dropped.
    private var isTerminated = false
    /// A deadline closed the connection.
    private var timedOut = false
    /// Streams whose body has all been taken, whose writers wait for it to leave.
    private var drainedStreams: [HTTP2Exchange] = []
    /// The flood limits (HTTP2FloodGuard.swift).
    private var floods: HTTP2FloodGuard
    /// When the connection last had no stream, and when it last wrote (the loop's clock, ns).
    private var idleSince: UInt64
    private var lastWriteAt: UInt64 = 0
    /// The one timer of the connection's deadlines, and when it fires.
    private var timer: TimerHandle?
    private var timerAt: UInt64 = 0

    init(engine: ConnectionEngine, connection: Connection, options: HTTPServer.HTTP2Options) {
        self.engine = engine
        self.connection = connection
        self.options = options
        limits = engine.limits
        let now = engine.loop.monotonicNow()
        floods = HTTP2FloodGuard(options: options, maxHeaderBytes: engine.limits.maxHeaderBytes, now: now)
        idleSince = now
        session = HTTP2Session(server: true, delegate: self, settings: HTTP2Session.Settings(
            maxConcurrentStreams: UInt32(clamping: max(1, options.maxConcurrentStreams)),
            maxHeaderListSize: UInt32(clamping: limits.maxHeaderBytes), enablePush: false))
    }

    var now: UInt64 { engine.loop.monotonicNow() }

    var isOpen: Bool { !isDetached && connection.isOpen }

    var bufferedOutputBytes: Int { isDetached ? 0 : connection.bufferedOutputBytes }

    /// Starts serving, with `input` the bytes read so far (the preface, for h2c).
    func begin(with input: [UInt8]) {
        connection.onClose { [self] reason in
            closed(timedOut: timedOut || reason == .idleTimeout)
        }
        connection.readBytes { [self] event in
            switch event {
            case .bytes(let bytes): receive(bytes)
            case .endOfFile: peerEnded()
            }
        }
        note(deadline: idleSince &+ limits.idleNanoseconds)
        if input.isEmpty { flush() } else { receive(input) }
    }

    private func receive(_ bytes: [UInt8]) {
        guard !isDetached, !isTerminated else { return }
        switch session.receive(bytes) {
        case .read:
            scheduleFlush()
        case .flooded:
            calm()  // nghttp2's own limits (ACKs left unread, its CONTINUATION limit) came first
            flush()
        case .failed:
            end()
        }
    }

    /// The client ended its side: the streams with the server finish, then the connection
    /// closes.
    private func peerEnded() {
        isEnding = true
        if !streams.values.contains(where: { $0.phase == .withServer }) { end() }
    }

    /// Sends what the session has to send; closes the connection once the session is over.
    func flush() {
        guard !isDetached else { return }
        var output: [UInt8] = []
        let ok = session.send(to: &output)
        if !output.isEmpty {
            lastWriteAt = now
            connection.write(output)
        }
        if !drainedStreams.isEmpty {
            let drained = drainedStreams
            drainedStreams = []
            connection.whenOutputSent { for exchange in drained { exchange.runDrainWaiters() } }
        }
        if !ok || isTerminated || !session.wantsRead && !session.wantsWrite || isEnding && streams.isEmpty { end() }
    }

    /// Closes the connection after what is queued (its GOAWAY, say) has been sent.
    private func end() {
        guard !isDetached else { return }
        cancelTimer()
        connection.close()
    }

    // MARK: What the engine asks

    /// Stops taking streams: GOAWAY (NO_ERROR) names the last one taken; those finish, then the
    /// connection closes.
    func drain() {
        guard !isDetached, !isEnding else { return }
        isEnding = true
        session.goAway(code: .noError)
        flush()
    }

    /// No longer the engine's (freed): returns the requests that were with the server, which
    /// finish unwritten; the connection closes after a GOAWAY.
    func detach() -> [HTTP2Exchange] {
        guard !isDetached else { return [] }
        session.terminate(code: .noError)
        flush()
        isDetached = true
        cancelTimer()
        connection.stopReading()
        let open = streams.values
        streams = [:]
        lastLookedUp = nil
        var lost: [HTTP2Exchange] = []
        for exchange in open where exchange.phase == .withServer {
            _ = exchange.closed(cleanly: false)
            lost.append(exchange)
        }
        return lost
    }

    private func closed(timedOut: Bool) {
        guard !isDetached else { return }
        let lost = detach()
        engine.removed(self, lost: lost, timedOut: timedOut)
    }

    // MARK: What the streams ask

    func submit(_ exchange: HTTP2Exchange, status: Int, fields: HTTP2Fields, hasBody: Bool) {
        guard !isDetached else { return }
        session.submitResponse(streamID: exchange.streamID, status: status, fields: fields, hasBody: hasBody)
        if hasBody { note(deadline: now &+ limits.idleNanoseconds) }
        scheduleFlush()
    }

    func resume(_ exchange: HTTP2Exchange) {
        guard !isDetached else { return }
        session.resume(streamID: exchange.streamID)
        scheduleFlush()
    }

    /// A flush is posted and has not run yet.
    private var isFlushScheduled = false

    /// Flushes once the work already posted to the loop has run: the answers of the requests
    /// read together (each dispatched in a turn of its own) leave in one write.
    private func scheduleFlush() {
        guard !isFlushScheduled, !isDetached else { return }
        isFlushScheduled = true
        engine.loop.execute(priority: .input) { [self] in
            isFlushScheduled = false
            flush()
        }
    }

    /// `exchange`'s body has all been taken: its writers hear once it has left.
    func whenSent(_ exchange: HTTP2Exchange) { drainedStreams.append(exchange) }

    // MARK: The session's reports

    func http2Begins(_ frame: HTTP2FrameHead) -> Bool {
        guard !isTerminated else { return true }
        if !floods.allows(frame, now: now) { calm() }
        return true
    }

    func http2BeginsHeaders(streamID: Int32, category: HTTP2HeadersCategory) {
        guard !isTerminated, category == .request else { return }
        let at = now
        let exchange = HTTP2Exchange(owner: self, streamID: streamID, now: at)
        streams[streamID] = exchange
        lastLookedUp = exchange
        note(deadline: at &+ limits.headerNanoseconds)
    }

    func http2Header(streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        guard let exchange = stream(streamID) else { return true }
        exchange.headerListBytes += name.count + value.count + 32
        guard exchange.phase == .headers, exchange.headerListBytes <= limits.maxHeaderBytes else { return true }
        if name.first == 0x3A {
            // A pseudo-header field: nghttp2 has checked that a request has only these, once each.
            let text = String(decoding: value, as: UTF8.self)
            switch (name.count, name[1]) {
            case (5, 0x70): exchange.path = text  // :path
            case (7, 0x6D): exchange.methodName = text  // :method
            case (7, 0x73): exchange.scheme = text  // :scheme
            case (10, 0x61): exchange.authority = text  // :authority
            default: break
            }
            return true
        }
        let fieldName = String(decoding: name, as: UTF8.self)
        let fieldValue = String(decoding: value, as: UTF8.self)
        if name.count == 14, fieldName == "content-length" { exchange.declaredLength = Int(fieldValue) }
        exchange.fields.append((fieldName, fieldValue))
        return true
    }

    /// The stream `streamID`, if open: the last one looked up is kept (a header block's fields
    /// come one callback each).
    private func stream(_ streamID: Int32) -> HTTP2Exchange? {
        if let last = lastLookedUp, last.streamID == streamID, !last.isClosed { return last }
        let found = streams[streamID]
        lastLookedUp = found
        return found
    }

    private var lastLookedUp: HTTP2Exchange?

    func http2Received(_ frame: HTTP2ReceivedFrame) {
        guard !isTerminated else { return }
        switch frame.type {
        case .headers:
            guard let exchange = stream(frame.streamID) else { return }
            if exchange.phase == .headers {
                headEnded(exchange, endsStream: frame.endsStream)
            } else if exchange.phase == .body, frame.endsStream {
                dispatch(exchange)  // after trailers (read, not kept)
            }
        case .data:
            if frame.endsStream, let exchange = streams[frame.streamID], exchange.phase == .body { dispatch(exchange) }
        case .resetStream:
            // Rapid Reset: a stream reset before its response ended.
            if let exchange = streams[frame.streamID], !exchange.isDone, !floods.allowsReset(now: now) {
                calm()
            }
        default:
            break
        }
    }

    func http2Data(streamID: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard let exchange = stream(streamID), exchange.phase == .body else { return }
        guard exchange.requestBody.count + bytes.count <= limits.maxBodyBytes else {
            return refuse(exchange, 413, "request body larger than \(limits.maxBodyBytes) bytes\n")
        }
        exchange.requestBody.append(contentsOf: bytes)
    }

    func http2Closed(streamID: Int32, errorCode: UInt32) {
        guard let exchange = streams.removeValue(forKey: streamID) else { return }
        if lastLookedUp === exchange { lastLookedUp = nil }
        let written = exchange.closed(cleanly: errorCode == 0)
        if exchange.phase == .withServer { engine.finished(exchange, written: written) }
        if streams.isEmpty {
            idleSince = now
            note(deadline: idleSince &+ limits.idleNanoseconds)
        }
    }

    func http2ReadBody(streamID: Int32, into buffer: UnsafeMutableRawBufferPointer) -> HTTP2DataRead {
        stream(streamID)?.readBody(into: buffer, now: now) ?? .bytes(0, end: true)
    }

    // MARK: Requests

    /// A request's header block is complete.
    private func headEnded(_ exchange: HTTP2Exchange, endsStream: Bool) {
        if exchange.headerListBytes > limits.maxHeaderBytes {
            return refuse(exchange, 431, "request head larger than \(limits.maxHeaderBytes) bytes\n")
        }
        guard let method = HTTPMethod(rawValue: exchange.methodName), method != .connect else {
            return refuse(exchange, 501, "unknown method \(exchange.methodName.prefix(32))\n")
        }
        exchange.route(as: method)
        if let authority = exchange.authority, !exchange.fields.contains(where: { $0.name == "host" }) {
            exchange.fields.insert(("host", authority), at: 0)
        }
        if endsStream { return dispatch(exchange) }
        if let length = exchange.declaredLength, length > limits.maxBodyBytes {
            return refuse(exchange, 413, "request body larger than \(limits.maxBodyBytes) bytes\n")
        }
        if limits.shedsBeforeBody, let retryAfter = engine.shedsBeforeBody(path: Array(exchange.path.utf8)) {
            return refuse(exchange, 503, "overloaded: try again later\n", retryAfter: retryAfter)
        }
        exchange.phase = .body
        exchange.phaseStartedAt = now
        note(deadline: exchange.phaseStartedAt &+ limits.bodyNanoseconds)
    }

    /// The request is read: it goes to the server.
    private func dispatch(_ exchange: HTTP2Exchange) {
        exchange.phase = .withServer
        engine.received(exchange)
    }

    /// The engine's own answer: a plain-text body saying why, dated. What the client still
    /// sends on the stream is dropped.
    private func refuse(_ exchange: HTTP2Exchange, _ status: Int, _ body: String, retryAfter: Int? = nil) {
        exchange.phase = .refused
        exchange.phaseStartedAt = now
        exchange.requestBody = []
        exchange.fields = []
        exchange.addResponseHeader("content-type", "text/plain; charset=utf-8")
        if let retryAfter { exchange.addResponseHeader("retry-after", String(retryAfter)) }
        exchange.addResponseHeader("date", HTTPDateCache.format(time_t(engine.loop.calendarSeconds())))
        exchange.addContentLength(body.utf8.count)
        exchange.sendReply(status: status, reason: reasonPhrase(status), body: Array(body.utf8))
        engine.answeredByGuard(status: status)
        note(deadline: exchange.phaseStartedAt &+ 2_000_000_000)
    }

    // MARK: Floods

    /// A flood: GOAWAY ENHANCE_YOUR_CALM, nothing more read, the connection closes.
    private func calm() {
        guard !isTerminated else { return }
        isTerminated = true
        session.terminate(code: .enhanceYourCalm)
        connection.stopReading()
    }

    // MARK: Deadlines

    /// A deadline falls at `at`: the timer fires by then.
    private func note(deadline at: UInt64) {
        guard !isDetached, timer == nil || at < timerAt else { return }
        timer?.cancel()
        timerAt = at
        let delay = at > now ? at &- now : 1
        // Held strongly: the timer is cancelled when the connection is detached (no weak
        // reference, whose side table would make every retain of the connection slow).
        timer = engine.loop.schedule(after: .nanoseconds(Int64(clamping: delay))) { [self] in timerFired() }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
    }

    /// Acts on every deadline that has passed, and sets the timer for the next.
    private func timerFired() {
        timer = nil
        guard !isDetached else { return }
        let at = now
        let idle = limits.idleNanoseconds
        var next = UInt64.max
        if streams.isEmpty {
            if at &- idleSince >= idle {
                timedOut = true
                isEnding = true
                session.goAway(code: .noError)
                flush()
                end()
                return
            }
            next = idleSince &+ idle
        }
        // Output the kernel has not taken for `idleTimeout` (a client that does not read).
        if connection.bufferedOutputBytes > 0 {
            let moved = max(lastWriteAt, connection.outputMovedAt ?? 0)
            if at &- moved >= idle {
                timedOut = true
                cancelTimer()
                connection.abort()
                return
            }
            next = min(next, moved &+ idle)
        }
        var reset = false
        for exchange in streams.values {
            let due: UInt64
            switch exchange.phase {
            case .headers: due = exchange.phaseStartedAt &+ limits.headerNanoseconds
            case .body: due = exchange.phaseStartedAt &+ limits.bodyNanoseconds
            case .refused: due = exchange.phaseStartedAt &+ 2_000_000_000
            case .withServer:
                guard exchange.hasResponded, exchange.pendingOutputBytes > 0 else { continue }
                due = exchange.outputMovedAt &+ idle  // waiting on its window
            }
            if at >= due {
                session.reset(streamID: exchange.streamID, code: .cancel)
                reset = true
            } else {
                next = min(next, due)
            }
        }
        if reset { flush() }
        if next != .max { note(deadline: next) }
    }
}
