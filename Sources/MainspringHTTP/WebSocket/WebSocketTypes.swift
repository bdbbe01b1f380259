import MainspringCore

extension WebSocket {
    /// A message: a text message (valid UTF-8, checked as it arrives) or a binary one, whole
    /// (its fragments reassembled).
    public enum Message: Sendable, Equatable {
        /// A text message.
        case text(String)
        /// A binary message.
        case binary([UInt8])
    }

    /// The status code of a close frame (RFC 6455 §7.4).
    public struct CloseCode: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
        /// The code as sent.
        public var rawValue: UInt16

        /// A code (any value; `isValidOnTheWire` says whether a peer may send it).
        public init(rawValue: UInt16) { self.rawValue = rawValue }

        /// 1000: the purpose of the connection was fulfilled.
        public static let normalClosure = CloseCode(rawValue: 1000)
        /// 1001: the endpoint is going away (a server shutting down, a silent peer dropped).
        public static let goingAway = CloseCode(rawValue: 1001)
        /// 1002: the peer broke the protocol (an unmasked client frame, a reserved bit, …).
        public static let protocolError = CloseCode(rawValue: 1002)
        /// 1003: a kind of message the endpoint does not accept.
        public static let unsupportedData = CloseCode(rawValue: 1003)
        /// 1005: the close frame had no status code. Never sent; reported locally.
        public static let noStatusReceived = CloseCode(rawValue: 1005)
        /// 1006: the connection was lost without a close frame. Never sent; reported locally.
        public static let abnormalClosure = CloseCode(rawValue: 1006)
        /// 1007: a text message (or a close reason) that is not valid UTF-8.
        public static let invalidPayload = CloseCode(rawValue: 1007)
        /// 1008: a message that breaks the endpoint's policy.
        public static let policyViolation = CloseCode(rawValue: 1008)
        /// 1009: a message over the endpoint's size limit.
        public static let messageTooBig = CloseCode(rawValue: 1009)
        /// 1010: the client wanted an extension the server did not agree to.
        public static let mandatoryExtension = CloseCode(rawValue: 1010)
        /// 1011: the server met an unexpected condition (a handler that threw).
        public static let internalError = CloseCode(rawValue: 1011)

        /// Whether a close frame may carry this code: 1000–1003, 1007–1014 (RFC 6455 and the
        /// IANA registry) and 3000–4999 (libraries, applications). 1005, 1006 and 1015 are
        /// reported locally only; a close frame with any other code is a protocol error (1002).
        public var isValidOnTheWire: Bool {
            switch rawValue {
            case 1000...1003, 1007...1014, 3000...4999: true
            default: false
            }
        }

        public var description: String { String(rawValue) }
    }

    /// How a WebSocket ended, as seen from this side: the peer's close frame's code and
    /// reason; `.noStatusReceived` for a close frame without a code; `.abnormalClosure` when the
    /// connection ended without a close frame from the peer (lost, timed out, or failed by this
    /// side for bad input — then `reason` says what was wrong).
    public struct CloseStatus: Sendable, Equatable, CustomStringConvertible {
        /// The code.
        public var code: CloseCode
        /// The reason (UTF-8 text, at most 123 bytes on the wire); empty when none was given.
        public var reason: String

        /// A status.
        public init(code: CloseCode, reason: String = "") {
            self.code = code
            self.reason = reason
        }

        public var description: String { reason.isEmpty ? "\(code)" : "\(code) \(reason)" }
    }

    /// Limits and timeouts of a WebSocket (server and client side alike).
    ///
    /// The three durations are periods (see Mainspring's "Durations"): zero or negative stops
    /// the program with a message naming it when a route or a connection is made with them.
    public struct Configuration: Sendable, Equatable {
        /// The largest message accepted, in bytes, over all its fragments. A frame whose declared
        /// length would take the message past it is refused before any of it is buffered: the
        /// connection closes with 1009. Default 1 MiB.
        public var maxMessageBytes: Int
        /// Messages received and not yet taken from `messages` at which reading pauses (TCP then
        /// slows the peer down; its pings wait too) until one is taken. Default 16.
        public var maxQueuedMessages: Int
        /// Buffered output above which `send` suspends and `trySend` refuses, until half of it
        /// has drained. Default 1 MiB.
        public var outputLimit: Int
        /// With no frame from the peer for this long a ping is sent; with still none after as
        /// long again, the connection is closed as lost (1006 here, close code 1001 sent). nil:
        /// no pings. Default 30 s.
        public var pingInterval: Duration?
        /// How long the closing handshake may take: after this side sends its close frame, the
        /// peer's close frame (and, for a client, the server's end of the connection) is waited
        /// for this long, then the connection is closed anyway. Default 5 s.
        public var closeTimeout: Duration
        /// A client only: how long the opening handshake may take once connected. Default 10 s.
        public var handshakeTimeout: Duration
        /// Compression of messages (permessage-deflate, RFC 7692), used only when both sides
        /// ask for it: a server with it accepts a client's offer, a client with it offers.
        /// nil: none. Default nil.
        public var compression: Compression? = nil

        /// The documented defaults.
        public init(maxMessageBytes: Int = 1 << 20, maxQueuedMessages: Int = 16, outputLimit: Int = 1 << 20,
                    pingInterval: Duration? = .seconds(30), closeTimeout: Duration = .seconds(5),
                    handshakeTimeout: Duration = .seconds(10), compression: Compression? = nil)
        {
            self.compression = compression
            self.maxMessageBytes = maxMessageBytes
            self.maxQueuedMessages = maxQueuedMessages
            self.outputLimit = outputLimit
            self.pingInterval = pingInterval
            self.closeTimeout = closeTimeout
            self.handshakeTimeout = handshakeTimeout
        }

        /// Stops the program when a value breaks the rules above; `function` is the call.
        func checkCompression(_ function: String) {
            if let compression {
                requireUsage((9...15).contains(compression.maxWindowBits),
                             "\(function): WebSocket.Compression.maxWindowBits must be in 9...15, not \(compression.maxWindowBits)")
            }
        }

        /// Stops the program when a value breaks the rules above; `function` is the call.
        func check(_ function: String) {
            requireUsage(maxMessageBytes >= 0, "\(function): WebSocket.Configuration.maxMessageBytes must not be negative")
            requireUsage(maxQueuedMessages >= 1, "\(function): WebSocket.Configuration.maxQueuedMessages must be at least 1")
            requireUsage(outputLimit >= 1, "\(function): WebSocket.Configuration.outputLimit must be at least 1")
            if let pingInterval { _ = requirePositive(pingInterval, "WebSocket.Configuration.pingInterval") }
            _ = requirePositive(closeTimeout, "WebSocket.Configuration.closeTimeout")
            _ = requirePositive(handshakeTimeout, "WebSocket.Configuration.handshakeTimeout")
            checkCompression(function)
        }
    }

    /// permessage-deflate (RFC 7692) settings: how this side compresses. Messages from the peer
    /// are inflated whatever its settings, and the inflated size counts against
    /// `Configuration.maxMessageBytes` as it is produced (a decompression bomb fails with 1009
    /// after at most 16 KiB past the limit). Each compressed WebSocket holds a zlib compressor
    /// and decompressor: about 256 KiB with a 15-bit window (`maxWindowBits`), less with less.
    public struct Compression: Sendable, Equatable {
        /// Whether this side's compressor keeps its window from one message to the next (better
        /// ratios on similar messages); false resets it after each message (and says so in the
        /// handshake: `server_no_context_takeover` or `client_no_context_takeover`). Default true.
        public var contextTakeover: Bool
        /// This side's compressor's window, 9–15 bits (the peer may ask for less). Default 15.
        public var maxWindowBits: Int

        /// Settings; the defaults compress with full context and a 32 KiB window.
        public init(contextTakeover: Bool = true, maxWindowBits: Int = 15) {
            self.contextTakeover = contextTakeover
            self.maxWindowBits = maxWindowBits
        }
    }

    /// A server route's answer to an upgrade request (see `HTTPRoutes.webSocket`).
    public enum Upgrade: Sendable {
        /// Accept, choosing `subprotocol` (one the client offered in `Sec-WebSocket-Protocol`,
        /// see `HTTPRequest.webSocketSubprotocols`; nil: none) and adding `headers` to the `101`.
        case accept(subprotocol: String? = nil, headers: HTTPHeaders = [:])
        /// Refuse with this response (`403` for an origin not allowed, say).
        case refuse(HTTPResponse)
    }
}

/// Why a WebSocket operation failed.
public enum WebSocketError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The WebSocket is closing or closed: nothing more can be sent. `status` is how it ended,
    /// once it has.
    case closed(WebSocket.CloseStatus?)
    /// A client only: the URL is not a `ws://` or `wss://` URL with a host, or it is `wss://`
    /// and no `secureConnector` was given (`MainspringTLS` provides one).
    case invalidURL(String)
    /// A client only: connecting failed (`reason` is the connection's account).
    case connectFailed(String)
    /// A client only (`wss://`): the connection was made but TLS did not secure it — a
    /// certificate that did not verify, a handshake that timed out — with OpenSSL's account in
    /// the one TLS error, `TLSError`. (A `secureConnector` of your own that throws something
    /// else is reported here as `TLSError.handshakeFailed` with that error's description.)
    case tlsFailed(TLSError)
    /// A client only: the server's answer to the opening handshake was not a valid `101`
    /// (`reason` names what was wrong: the status, `Sec-WebSocket-Accept`, …), or it did not
    /// come within `handshakeTimeout`.
    case handshakeFailed(String)
    /// The calling task was cancelled while it waited: a client's connect or handshake (the
    /// connection is closed), or a `send` waiting for the peer to take the output (the message
    /// was queued and still goes out before the close frame; the WebSocket closes with 1001, as
    /// when the task reading `messages` is cancelled).
    case cancelled

    public var description: String {
        switch self {
        case .closed(let status): status.map { "the WebSocket is closed (\($0))" } ?? "the WebSocket is closing"
        case .invalidURL(let url): "not a usable ws:// or wss:// URL: \(url)"
        case .connectFailed(let reason): "WebSocket connect failed: \(reason)"
        case .tlsFailed(let error): "WebSocket connect failed: \(error)"
        case .handshakeFailed(let reason): "WebSocket handshake failed: \(reason)"
        case .cancelled: "cancelled: the waiting task was cancelled"
        }
    }
}

extension WebSocketError: CancellationReportingError {
    /// Whether this is ``cancelled`` — the calling task was cancelled — or carries one (a TLS
    /// connect that the cancellation ended).
    public var reportsCancellation: Bool {
        switch self {
        case .cancelled: return true
        case .tlsFailed(let error): return error.reportsCancellation
        default: return false
        }
    }
}
