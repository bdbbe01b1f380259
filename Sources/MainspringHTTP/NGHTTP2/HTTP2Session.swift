// nghttp2 — the library behind curl's and nginx's HTTP/2 — for MainspringHTTP's HTTP/2 server and
// client. Every nghttp2 call and raw pointer of the module is in this folder: `HTTP2Session`
// wraps one `nghttp2_session` (server or client side) fed with bytes and drained of bytes
// (`nghttp2_session_mem_recv` / `mem_send`), so that it runs over any `Connection` — TCP, TLS,
// or the simulated network — and reports what it reads to its delegate in Swift terms.
import CNGHTTP2

/// One nghttp2 session over a connection's bytes. Loop thread only; not reentrant (a delegate
/// call may submit frames, but not `receive` or `send`).
final class HTTP2Session {
    private var session: OpaquePointer?
    private unowned(unsafe) let delegate: any HTTP2SessionDelegate

    /// Settings the session sends first: (RFC 9113 §6.5.2 identifier, value).
    struct Settings {
        var maxConcurrentStreams: UInt32?
        var initialWindowSize: UInt32?
        var maxHeaderListSize: UInt32?
        var enablePush: Bool?
    }

    /// A server session (`server`) or a client one, reporting to `delegate` (which must outlive
    /// it), sending `settings` first (a client also sends its connection preface). With
    /// `consumesManually`, the windows reopen only as the delegate calls `consume` (the reader's
    /// backpressure); otherwise as soon as nghttp2 has handed the bytes over.
    init(server: Bool, delegate: any HTTP2SessionDelegate, settings: Settings, consumesManually: Bool = false) {
        self.delegate = delegate
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks, onBeginFrame)
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        var options: OpaquePointer?
        nghttp2_option_new(&options)
        // The connections keep their own limits (HTTP2ServerConnection.swift); nghttp2's peer
        // SETTINGS limit stays as a backstop.
        nghttp2_option_set_max_settings(options, 64)
        if consumesManually { nghttp2_option_set_no_auto_window_update(options, 1) }
        let context = Unmanaged.passUnretained(self).toOpaque()
        if server {
            nghttp2_session_server_new2(&session, callbacks, context, options)
        } else {
            nghttp2_session_client_new2(&session, callbacks, context, options)
        }
        nghttp2_option_del(options)
        nghttp2_session_callbacks_del(callbacks)
        var entries: [nghttp2_settings_entry] = []
        if let value = settings.maxConcurrentStreams {
            entries.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: value))
        }
        if let value = settings.initialWindowSize {
            entries.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: value))
        }
        if let value = settings.maxHeaderListSize {
            entries.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: value))
        }
        if let push = settings.enablePush {
            entries.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: push ? 1 : 0))
        }
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), entries, entries.count)
    }

    deinit {
        nghttp2_session_del(session)
    }

    fileprivate static func from(_ context: UnsafeMutableRawPointer?) -> HTTP2Session {
        Unmanaged<HTTP2Session>.fromOpaque(context!).takeUnretainedValue()
    }

    fileprivate var reporter: any HTTP2SessionDelegate { delegate }

    /// How feeding bytes went.
    enum Received {
        /// Read (a protocol error nghttp2 answers with GOAWAY itself counts here too: its GOAWAY
        /// is queued and the session ends once it is sent).
        case read
        /// nghttp2's own flood limits tripped (a peer that leaves its ACKs unread, too many
        /// CONTINUATION frames): the session is over, with no GOAWAY queued.
        case flooded
        /// Not HTTP/2, or nghttp2 failed: the session is over, with no GOAWAY queued.
        case failed
    }

    /// Feeds `bytes` read from the peer.
    func receive(_ bytes: [UInt8]) -> Received {
        let read = bytes.withUnsafeBufferPointer { nghttp2_session_mem_recv(session, $0.baseAddress, $0.count) }
        if read >= 0 { return .read }
        // -905 is NGHTTP2_ERR_TOO_MANY_CONTINUATIONS, which older headers do not name.
        return read == Int(NGHTTP2_ERR_FLOODED.rawValue) || read == -905 ? .flooded : .failed
    }

    /// Appends what the session has to send (frames, and the bodies its data sources give)
    /// to `output`. False when the session failed.
    func send(to output: inout [UInt8]) -> Bool {
        while true {
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            if count < 0 { return false }
            if count == 0 { return true }
            output.append(contentsOf: UnsafeBufferPointer(start: data, count: count))
        }
    }

    /// Whether the session still reads (it does not once both sides have sent GOAWAY and no
    /// stream is open, or after a fatal error).
    var wantsRead: Bool { nghttp2_session_want_read(session) != 0 }

    /// Whether the session has something to send.
    var wantsWrite: Bool { nghttp2_session_want_write(session) != 0 }

    /// Submits a response on `streamID`: `:status` and `fields` and, when `hasBody`, a body
    /// the delegate's `http2ReadBody` gives. False when the stream is gone.
    @discardableResult
    func submitResponse(streamID: Int32, status: Int, fields: HTTP2Fields, hasBody: Bool) -> Bool {
        withNameValues(fields, status: status) { nameValues in
            if hasBody {
                var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: readBody)
                return nghttp2_submit_response(session, streamID, nameValues.baseAddress, nameValues.count, &provider) == 0
            }
            return nghttp2_submit_response(session, streamID, nameValues.baseAddress, nameValues.count, nil) == 0
        }
    }

    /// Submits a request (client); returns its stream, or nil when the session takes no more
    /// streams (after GOAWAY, or out of stream identifiers).
    func submitRequest(fields: HTTP2Fields, hasBody: Bool) -> Int32? {
        let stream = withNameValues(fields) { nameValues in
            if hasBody {
                var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: readBody)
                return nghttp2_submit_request(session, nil, nameValues.baseAddress, nameValues.count, &provider, nil)
            }
            return nghttp2_submit_request(session, nil, nameValues.baseAddress, nameValues.count, nil, nil)
        }
        return stream > 0 ? stream : nil
    }

    /// `fields` as nghttp2's name-value pairs (`:status` first when given), valid during
    /// `body`. nghttp2 copies them when it submits a frame (and never writes to them).
    private func withNameValues<T>(_ fields: HTTP2Fields, status: Int? = nil,
                                   _ body: (UnsafeBufferPointer<nghttp2_nv>) -> T) -> T
    {
        var statusDigits: (UInt8, UInt8, UInt8) = (0, 0, 0)
        let code = min(999, max(100, status ?? 200))
        statusDigits = (0x30 + UInt8(code / 100), 0x30 + UInt8(code / 10 % 10), 0x30 + UInt8(code % 10))
        return withUnsafeMutableBytes(of: &statusDigits) { digits in
            fields.bytes.withUnsafeBufferPointer { storage in
                let base = UnsafeMutablePointer(mutating: storage.baseAddress ?? UnsafePointer(Self.statusName.baseAddress!))
                let extra = status == nil ? 0 : 1
                return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: fields.spans.count + extra) { pairs in
                    if status != nil {
                        pairs[0] = nghttp2_nv(name: Self.statusName.baseAddress!, value: digits.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                              namelen: 7, valuelen: 3, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
                    }
                    for (index, span) in fields.spans.enumerated() {
                        pairs[index + extra] = nghttp2_nv(name: base + span.name, value: base + span.value, namelen: span.nameCount,
                                                          valuelen: span.valueCount, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
                    }
                    return body(UnsafeBufferPointer(pairs))
                }
            }
        }
    }

    /// `:status`, in memory that lives as long as the program (never written after it is made).
    nonisolated(unsafe) private static let statusName: UnsafeMutableBufferPointer<UInt8> = {
        let name = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 7)
        _ = name.initialize(from: ":status".utf8)
        return name
    }()

    /// `count` bytes of `streamID`'s body were taken by its reader: its window (and the
    /// connection's) may reopen by that much.
    func consume(streamID: Int32, count: Int) {
        nghttp2_session_consume(session, streamID, count)
    }

    /// `count` bytes of a closed stream's body were taken by its reader: the connection's window
    /// may reopen by that much.
    func consumeConnection(count: Int) {
        nghttp2_session_consume_connection(session, count)
    }

    /// A stream whose data source said `.deferred` has more to give.
    func resume(streamID: Int32) {
        nghttp2_session_resume_data(session, streamID)
    }

    /// Resets `streamID` with `code`.
    func reset(streamID: Int32, code: HTTP2Error) {
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, code.rawValue)
    }

    /// A GOAWAY with `code` naming the last stream the session has processed: streams the peer
    /// opens after it are not served. The session keeps serving those opened before.
    func goAway(code: HTTP2Error) {
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nghttp2_session_get_last_proc_stream_id(session),
                              code.rawValue, nil, 0)
    }

    /// Ends the session with a GOAWAY of `code`: nothing more is read, every stream closes.
    func terminate(code: HTTP2Error) {
        nghttp2_session_terminate_session(session, code.rawValue)
    }
}

// MARK: - nghttp2's callbacks (C function pointers: the session comes back as user_data)

private let onBeginFrame: nghttp2_on_begin_frame_callback = { _, head, context in
    guard let head = head?.pointee else { return 0 }
    let frame = HTTP2FrameHead(type: HTTP2FrameKind(head.type), flags: head.flags, streamID: head.stream_id,
                               length: head.length)
    return HTTP2Session.from(context).reporter.http2Begins(frame) ? 0 : NGHTTP2_ERR_CALLBACK_FAILURE.rawValue
}

private func category(_ raw: nghttp2_headers_category) -> HTTP2HeadersCategory {
    switch raw {
    case NGHTTP2_HCAT_REQUEST: .request
    case NGHTTP2_HCAT_RESPONSE: .response
    case NGHTTP2_HCAT_PUSH_RESPONSE: .pushResponse
    default: .trailers
    }
}

private let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, context in
    guard let frame = frame?.pointee, frame.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
    HTTP2Session.from(context).reporter.http2BeginsHeaders(streamID: frame.hd.stream_id,
                                                           category: category(frame.headers.cat))
    return 0
}

private let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, context in
    guard let frame = frame?.pointee else { return 0 }
    let keep = HTTP2Session.from(context).reporter.http2Header(
        streamID: frame.hd.stream_id, name: UnsafeRawBufferPointer(start: name, count: nameLength),
        value: UnsafeRawBufferPointer(start: value, count: valueLength))
    return keep ? 0 : NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
}

private let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, context in
    guard let frame = frame?.pointee else { return 0 }
    let type = HTTP2FrameKind(frame.hd.type)
    let received = HTTP2ReceivedFrame(
        type: type, streamID: frame.hd.stream_id,
        endsStream: frame.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0,
        headersCategory: type == .headers ? category(frame.headers.cat) : nil)
    HTTP2Session.from(context).reporter.http2Received(received)
    return 0
}

private let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, length, context in
    HTTP2Session.from(context).reporter.http2Data(streamID: streamID, UnsafeRawBufferPointer(start: data, count: length))
    return 0
}

private let onStreamClose: nghttp2_on_stream_close_callback = { _, streamID, errorCode, context in
    HTTP2Session.from(context).reporter.http2Closed(streamID: streamID, errorCode: errorCode)
    return 0
}

private let readBody: nghttp2_data_source_read_callback = { _, streamID, buffer, length, flags, _, context in
    switch HTTP2Session.from(context).reporter.http2ReadBody(streamID: streamID,
                                                              into: UnsafeMutableRawBufferPointer(start: buffer, count: length)) {
    case .deferred:
        return Int(NGHTTP2_ERR_DEFERRED.rawValue)
    case .bytes(let count, let end):
        if end { flags?.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return count
    }
}
