/// One connection's state that commands read and change (`CLIENT SETNAME`, `HELLO`, `QUIT`).
/// The server keeps one per connection and passes it to `KVCore.execute`.
public struct KVSession: Sendable {
    /// The connection's id (`CLIENT ID`), unique for the core's lifetime.
    public let id: Int64
    /// The name set with `CLIENT SETNAME` or `HELLO ... SETNAME`, or nil.
    public var name: [UInt8]?
    var lastCommandRaw: UInt8?

    /// The last command's name, lowercase (`cmd=` of `CLIENT LIST`), or `NULL` before any.
    public var lastCommand: String {
        lastCommandID.map { String(describing: $0.spec.name) } ?? "NULL"
    }

    /// Creates a session; `KVCore.makeSession()` hands out ids.
    public init(id: Int64) {
        self.id = id
    }
}

/// A connected client, as the server describes it for `CLIENT LIST`.
public struct KVClientInfo: Sendable {
    /// `id=`.
    public var id: Int64
    /// `addr=`, e.g. `127.0.0.1:50012`.
    public var address: String
    /// `laddr=`.
    public var localAddress: String
    /// `fd=`.
    public var fileDescriptor: Int32
    /// `name=`.
    public var name: String
    /// `age=` in seconds.
    public var ageSeconds: Int
    /// `idle=` in seconds.
    public var idleSeconds: Int
    /// `obl=`/`omem=`: bytes of pending output.
    public var outputBytes: Int
    /// `qbuf=`: bytes of unparsed input.
    public var inputBytes: Int
    /// `cmd=`.
    public var lastCommand: String

    /// Creates a description.
    public init(
        id: Int64, address: String, localAddress: String = "", fileDescriptor: Int32 = -1, name: String = "",
        ageSeconds: Int = 0, idleSeconds: Int = 0, outputBytes: Int = 0, inputBytes: Int = 0,
        lastCommand: String = "NULL"
    ) {
        self.id = id
        self.address = address
        self.localAddress = localAddress
        self.fileDescriptor = fileDescriptor
        self.name = name
        self.ageSeconds = ageSeconds
        self.idleSeconds = idleSeconds
        self.outputBytes = outputBytes
        self.inputBytes = inputBytes
        self.lastCommand = lastCommand
    }
}

/// An `INFO` section the server adds (for instance `mainspring`).
public struct KVInfoSection: Sendable {
    /// The section's name; `INFO name` selects it (case-insensitively). Printed capitalised.
    public var name: String
    /// Its `field:value` lines, in order.
    public var fields: [(String, String)]

    /// Creates a section.
    public init(name: String, fields: [(String, String)]) {
        self.name = name
        self.fields = fields
    }
}

/// What only the server knows, read by `INFO` and `CLIENT LIST` when they run.
public struct KVServerStatus: Sendable {
    /// `process_id`.
    public var processID: Int
    /// `tcp_port`.
    public var tcpPort: Int
    /// `connected_clients`.
    public var connectedClients: Int
    /// `used_memory` in bytes (0 when the server does not measure it).
    public var usedMemory: Int
    /// `CLIENT LIST`'s clients; when empty, `CLIENT LIST` shows the calling client only.
    public var clients: [KVClientInfo]
    /// Extra `INFO` sections, shown by `INFO`, `INFO all` and `INFO <name>`.
    public var extraSections: [KVInfoSection]
    /// Extra `field:value` lines of the `Stats` section, after the core's own (the server's
    /// counters: `rejected_connections`, `client_output_buffer_limit_disconnections`, …).
    public var extraStats: [(String, String)]

    /// Creates a status.
    public init(
        processID: Int = 0, tcpPort: Int = 0, connectedClients: Int = 0, usedMemory: Int = 0,
        clients: [KVClientInfo] = [], extraSections: [KVInfoSection] = [], extraStats: [(String, String)] = []
    ) {
        self.processID = processID
        self.tcpPort = tcpPort
        self.connectedClients = connectedClients
        self.usedMemory = usedMemory
        self.clients = clients
        self.extraSections = extraSections
        self.extraStats = extraStats
    }
}
