// What the HTTP/2 connections (server and client) and their nghttp2 session say to each other,
// in Swift terms: frames as they begin and as they are read, error codes, and the delegate a
// session reports to (NGHTTP2/HTTP2Session.swift makes the calls).

/// A frame's header as it begins to arrive (before its payload is read).
struct HTTP2FrameHead {
    let type: HTTP2FrameKind
    let flags: UInt8
    let streamID: Int32
    let length: Int
}

/// The frame types the connections act on (RFC 9113 §6); others are `.other`.
enum HTTP2FrameKind: Equatable {
    case data, headers, priority, resetStream, settings, pushPromise, ping, goAway, windowUpdate, continuation
    case other(UInt8)

    init(_ raw: UInt8) {
        switch raw {
        case 0: self = .data
        case 1: self = .headers
        case 2: self = .priority
        case 3: self = .resetStream
        case 4: self = .settings
        case 5: self = .pushPromise
        case 6: self = .ping
        case 7: self = .goAway
        case 8: self = .windowUpdate
        case 9: self = .continuation
        default: self = .other(raw)
        }
    }
}

/// HTTP/2 error codes (RFC 9113 §7) the library sends, or acts on when it receives them.
enum HTTP2Error: UInt32 {
    case noError = 0x0
    case refusedStream = 0x7
    case cancel = 0x8
    case enhanceYourCalm = 0xB
}

/// A frame read in full, as the connections act on it.
struct HTTP2ReceivedFrame {
    let type: HTTP2FrameKind
    let streamID: Int32
    /// END_STREAM (DATA, HEADERS).
    let endsStream: Bool
    /// HEADERS that open a request (server) or carry a response or trailers (client), as
    /// nghttp2 classed them.
    let headersCategory: HTTP2HeadersCategory?
}

/// What a HEADERS frame is to the session.
enum HTTP2HeadersCategory {
    case request, response, pushResponse, trailers
}

/// What a stream's data source gives nghttp2 when it asks for a DATA frame's payload.
enum HTTP2DataRead {
    /// `count` bytes were copied; `end`: the body ends with them.
    case bytes(Int, end: Bool)
    /// Nothing now: the stream waits until `HTTP2Session.resume(stream:)`.
    case deferred
}

/// What a session reports as it reads (inside `HTTP2Session.receive(_:)`, and, for data
/// sources, inside `HTTP2Session.send(to:)`). Loop thread only.
protocol HTTP2SessionDelegate: AnyObject {
    /// A frame's header arrived. False ends the session (a flood: `HTTP2Session.terminate`
    /// has been called).
    func http2Begins(_ frame: HTTP2FrameHead) -> Bool
    /// A header block opens on `streamID`.
    func http2BeginsHeaders(streamID: Int32, category: HTTP2HeadersCategory)
    /// One header field of `streamID`'s block, decoded (valid only during the call). False
    /// resets the stream (nghttp2 sends RST_STREAM and reports no more of it).
    func http2Header(streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool
    /// A frame was read in full.
    func http2Received(_ frame: HTTP2ReceivedFrame)
    /// Body bytes of `streamID` (valid only during the call).
    func http2Data(streamID: Int32, _ bytes: UnsafeRawBufferPointer)
    /// `streamID` is closed (both sides, or reset), with its error code.
    func http2Closed(streamID: Int32, errorCode: UInt32)
    /// nghttp2 wants up to `buffer.count` bytes of `streamID`'s body.
    func http2ReadBody(streamID: Int32, into buffer: UnsafeMutableRawBufferPointer) -> HTTP2DataRead
}
