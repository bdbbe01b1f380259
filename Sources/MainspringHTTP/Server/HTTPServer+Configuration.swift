extension HTTPServer {
    /// Addresses, limits and timeouts. Its three timeouts are periods (see Mainspring's
    /// "Durations"): zero or negative stops the program with a message naming it when a server
    /// is made; positive ones shorter than a millisecond count as one.
    public struct Configuration: Sendable {
        /// The address to listen on (`127.0.0.1`, `::1`, `0.0.0.0`, `::`). Default `127.0.0.1`.
        public var host: String
        /// The port; 0 picks a free one (see `HTTPServer.port`). Default 0.
        public var port: UInt16
        /// The longest request head (request line and header fields) accepted; longer gets 431.
        /// Default 8 KiB.
        public var maxHeaderBytes: Int
        /// The longest request body accepted; longer gets 413. Default 1 MiB.
        public var maxBodyBytes: Int
        /// Connections open at once, over all loops. Default 10,000.
        public var maxConnections: Int
        /// A connection idle this long (before a request, or between two) is closed, and so is
        /// one whose response has not moved for this long while some of it waits (a client not
        /// reading it: counted from when output last left, so a response read slowly but
        /// steadily is not cut). Default 60 s.
        public var idleTimeout: Duration
        /// A request head that has not arrived in full this long after its first byte closes its
        /// connection. Default 10 s.
        public var headerTimeout: Duration
        /// A request body that has not arrived in full this long after its head closes its
        /// connection. Default 30 s.
        public var bodyTimeout: Duration
        /// The listen backlog. Default 511.
        public var backlog: Int32
        /// A Unix domain stream socket to listen on instead of `host` and `port`: a file path,
        /// or "@name" in Linux's abstract namespace (no file). The rules of Mainspring's
        /// `Listener(.unix(path:mode:), on:)`, whose code binds it: an existing file there is
        /// replaced only if it is a socket nobody listens on (a stale one); a live socket or a
        /// file of another kind is left alone and reported
        /// (`HTTPServerError.unixSocketPathInUse`). The file is removed when `close()` is called
        /// (or when the group's loops shut down without it), if it is still the one this
        /// server made. `HTTPServer.port` is then 0. Default nil.
        public var unixPath: String? = nil
        /// The socket file's mode (`0o660`, say) when `unixPath` is a file path; nil leaves it
        /// to the umask. Default nil.
        public var unixMode: UInt16? = nil
        /// Answer `503` to the requests a loop cannot serve in time, judged by their measured
        /// queue wait (see ``HTTPServer/LoadShedding``); nil serves every request however late.
        /// Default nil.
        public var loadShedding: LoadShedding? = nil
        /// HTTP/2 beside HTTP/1.1 on the same port (h2c with prior knowledge, and `h2` by ALPN
        /// over TLS) with its settings and flood limits; nil serves HTTP/1.1 only. Default on,
        /// with ``HTTPServer/HTTP2Options``' defaults.
        public var http2: HTTP2Options? = HTTP2Options()

        public init(host: String = "127.0.0.1", port: UInt16 = 0, maxHeaderBytes: Int = 8 * 1024,
                    maxBodyBytes: Int = 1 << 20, maxConnections: Int = 10_000, idleTimeout: Duration = .seconds(60),
                    headerTimeout: Duration = .seconds(10), bodyTimeout: Duration = .seconds(30), backlog: Int32 = 511)
        {
            self.host = host
            self.port = port
            self.maxHeaderBytes = maxHeaderBytes
            self.maxBodyBytes = maxBodyBytes
            self.maxConnections = maxConnections
            self.idleTimeout = idleTimeout
            self.headerTimeout = headerTimeout
            self.bodyTimeout = bodyTimeout
            self.backlog = backlog
        }
    }
}
