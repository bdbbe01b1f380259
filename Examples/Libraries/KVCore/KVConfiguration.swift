/// The limits and settings `CONFIG GET` and `CONFIG SET` read and change.
///
/// The core enforces `protoMaxBulkLength` (through `parserLimits`, and for `APPEND`) and uses
/// `slicingThreshold`; `maxClients` and the output buffer limits are the server's to enforce.
public struct KVConfiguration: Sendable, Hashable {
    /// A client class's output buffer limit (`client-output-buffer-limit`): close the client
    /// when its pending output exceeds `hardLimit` bytes, or stays above `softLimit` for
    /// `softSeconds`. 0 disables a limit.
    public struct OutputBufferLimit: Sendable, Hashable {
        /// Bytes; 0 is no limit.
        public var hardLimit: Int
        /// Bytes; 0 is no limit.
        public var softLimit: Int
        /// How long the soft limit may be exceeded.
        public var softSeconds: Int

        /// Creates a limit.
        public init(hardLimit: Int, softLimit: Int, softSeconds: Int) {
            self.hardLimit = hardLimit
            self.softLimit = softLimit
            self.softSeconds = softSeconds
        }
    }

    /// `maxclients`: the most connected clients (Redis's default 10000).
    public var maxClients: Int = 10_000
    /// `proto-max-bulk-len`: the largest bulk argument and string value (default 512 MB).
    public var protoMaxBulkLength: Int = 512 * 1024 * 1024
    /// `client-output-buffer-limit` for normal clients (default: none).
    public var normalOutputBufferLimit = OutputBufferLimit(hardLimit: 0, softLimit: 0, softSeconds: 0)
    /// `client-output-buffer-limit` for replicas (reported only; default 256 MB / 64 MB / 60 s).
    public var replicaOutputBufferLimit = OutputBufferLimit(hardLimit: 268_435_456, softLimit: 67_108_864, softSeconds: 60)
    /// `client-output-buffer-limit` for Pub/Sub clients (reported only; default 32 MB / 8 MB / 60 s).
    public var pubsubOutputBufferLimit = OutputBufferLimit(hardLimit: 33_554_432, softLimit: 8_388_608, softSeconds: 60)
    /// Values and keyspaces with fewer elements than this are handled inline; larger ones make
    /// `execute` return a sliced reply, or are freed in slices. Not a Redis setting.
    public var slicingThreshold: Int = 1000

    /// Creates the default configuration.
    public init() {}

    /// The parser limits these settings imply.
    public var parserLimits: RESPParser.Limits {
        RESPParser.Limits(maxBulkLength: protoMaxBulkLength)
    }

    /// `client-output-buffer-limit` as Redis prints it.
    var outputBufferLimitText: String {
        func text(_ name: String, _ limit: OutputBufferLimit) -> String {
            "\(name) \(limit.hardLimit) \(limit.softLimit) \(limit.softSeconds)"
        }
        return [
            text("normal", normalOutputBufferLimit), text("slave", replicaOutputBufferLimit),
            text("pubsub", pubsubOutputBufferLimit),
        ].joined(separator: " ")
    }
}
