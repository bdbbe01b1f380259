extension HTTPServer {
    /// HTTP/2's settings and flood limits (see the "HTTP/2" article). A server speaks HTTP/2 to
    /// a client that opens with HTTP/2's preface on a plain connection (h2c with prior
    /// knowledge), and over TLS to one that agrees on `h2` by ALPN (the TLS context's
    /// `applicationProtocols`, `["h2", "http/1.1"]`); everything else it serves as HTTP/1.1.
    ///
    /// The server's other limits hold for HTTP/2 as for HTTP/1.1: `maxHeaderBytes` (a header
    /// list decoded past it is answered 431), `maxBodyBytes`, the three timeouts (per stream,
    /// and `idleTimeout` for a connection without streams and for a response its client's
    /// window holds back), load shedding, the connection limit.
    public struct HTTP2Options: Sendable, Equatable {
        /// Streams a client may have open at once on one connection
        /// (SETTINGS_MAX_CONCURRENT_STREAMS); nghttp2 refuses those past it. Default 100.
        public var maxConcurrentStreams: Int
        /// Streams a client may reset before their response has ended, per second, with a burst
        /// of ten times that: past it the connection ends with GOAWAY ENHANCE_YOUR_CALM (Rapid
        /// Reset, CVE-2023-44487). Default 100.
        public var maxResetsPerSecond: Int
        /// SETTINGS, PING, PRIORITY and empty DATA frames a client may send per second, with a
        /// burst of five times that: past it the connection ends with GOAWAY ENHANCE_YOUR_CALM
        /// (the floods of CVE-2019-9512 and kin). Default 100.
        public var maxControlFramesPerSecond: Int

        /// The defaults: 100 streams at once, 100 resets and 100 control frames a second.
        /// Values below 1 count as 1.
        public init(maxConcurrentStreams: Int = 100, maxResetsPerSecond: Int = 100, maxControlFramesPerSecond: Int = 100) {
            self.maxConcurrentStreams = maxConcurrentStreams
            self.maxResetsPerSecond = maxResetsPerSecond
            self.maxControlFramesPerSecond = maxControlFramesPerSecond
        }
    }
}
