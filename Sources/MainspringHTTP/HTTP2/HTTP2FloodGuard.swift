/// An HTTP/2 server connection's flood limits (what HTTP2ServerConnection.swift's header lists):
/// token buckets on the loop's clock for streams reset before their answer ended (Rapid Reset)
/// and for the frames that cost the server work without asking anything of a handler (SETTINGS,
/// PING, PRIORITY, empty DATA), and a cap on a header block's CONTINUATION frames and bytes.
/// A value the connection keeps; loop thread only.
struct HTTP2FloodGuard {
    private let resetsPerSecond: Double
    private let controlFramesPerSecond: Double
    private let maxHeaderBlockBytes: Int
    /// The buckets, and when they were last filled (the loop's clock, ns). Resets may come in a
    /// burst of ten seconds' worth; control frames five (below nghttp2's own limit of a thousand
    /// ACKs queued, so that this limit trips first and says why).
    private var resetTokens: Double
    private var controlTokens: Double
    private var filledAt: UInt64
    /// The header block being read: its CONTINUATION frames and its bytes on the wire.
    private var continuations = 0
    private var headerBlockBytes = 0

    /// More CONTINUATION frames than this after one HEADERS is a flood.
    static let maxContinuations = 8

    init(options: HTTPServer.HTTP2Options, maxHeaderBytes: Int, now: UInt64) {
        resetsPerSecond = Double(options.maxResetsPerSecond)
        controlFramesPerSecond = Double(options.maxControlFramesPerSecond)
        maxHeaderBlockBytes = maxHeaderBytes + 16_384
        resetTokens = resetsPerSecond * 10
        controlTokens = controlFramesPerSecond * 5
        filledAt = now
    }

    /// Whether `frame`, beginning now, stays within the limits.
    mutating func allows(_ frame: HTTP2FrameHead, now: UInt64) -> Bool {
        switch frame.type {
        case .headers:
            continuations = 0
            headerBlockBytes = frame.length
            return true
        case .continuation:
            continuations += 1
            headerBlockBytes += frame.length
            return continuations <= Self.maxContinuations && headerBlockBytes <= maxHeaderBlockBytes
        case .ping, .settings:
            return frame.flags & 0x1 != 0 || takeControlToken(now: now)  // an ACK costs nothing
        case .priority:
            return takeControlToken(now: now)
        case .data:
            return frame.length > 0 || frame.flags & 0x1 != 0 || takeControlToken(now: now)
        default:
            return true
        }
    }

    /// Whether a stream reset before its answer ended, now, stays within the limit.
    mutating func allowsReset(now: UInt64) -> Bool {
        refill(now: now)
        guard resetTokens >= 1 else { return false }
        resetTokens -= 1
        return true
    }

    private mutating func takeControlToken(now: UInt64) -> Bool {
        refill(now: now)
        guard controlTokens >= 1 else { return false }
        controlTokens -= 1
        return true
    }

    private mutating func refill(now: UInt64) {
        let elapsed = Double(now &- filledAt) / 1e9
        filledAt = now
        resetTokens = min(resetsPerSecond * 10, resetTokens + elapsed * resetsPerSecond)
        controlTokens = min(controlFramesPerSecond * 5, controlTokens + elapsed * controlFramesPerSecond)
    }
}
