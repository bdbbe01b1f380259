extension KVCore {
    // MARK: INFO

    /// `used_memory_human`'s format (Redis's `bytesToHuman`).
    static func humanBytes(_ bytes: Int) -> String {
        func fixed2(_ value: Double) -> String {
            let hundredths = Int((value * 100).rounded())
            let fraction = hundredths % 100
            return "\(hundredths / 100).\(fraction < 10 ? "0" : "")\(fraction)"
        }
        let value = Double(bytes)
        if bytes < 1024 { return "\(bytes)B" }
        if bytes < 1024 * 1024 { return fixed2(value / 1024) + "K" }
        if bytes < 1024 * 1024 * 1024 { return fixed2(value / (1024 * 1024)) + "M" }
        return fixed2(value / (1024 * 1024 * 1024)) + "G"
    }

    /// The text of `INFO` for `sections` (lowercase names; empty: the default set).
    public func infoText(sections requested: [String] = []) -> String {
        let status = statusProvider()
        var wanted = Set(requested)
        let everything = wanted.contains("all") || wanted.contains("everything")
        if wanted.isEmpty || wanted.contains("default") || everything {
            wanted.formUnion(["server", "clients", "memory", "stats", "keyspace"])
            for extra in status.extraSections { wanted.insert(extra.name.lowercased()) }
        }
        var parts: [String] = []
        func section(_ name: String, _ fields: [(String, String)]) {
            guard wanted.contains(name.lowercased()) else { return }
            var text = "# \(name)\r\n"
            for (field, value) in fields { text += "\(field):\(value)\r\n" }
            parts.append(text)
        }
        let uptime = (monotonicClock() - monotonicStart) / 1000
        section("Server", [
            ("redis_version", KVCore.compatibleRedisVersion), ("redis_mode", "standalone"), ("os", "Linux"),
            ("arch_bits", "\(Int.bitWidth)"), ("process_id", "\(status.processID)"), ("tcp_port", "\(status.tcpPort)"),
            ("uptime_in_seconds", "\(uptime)"), ("uptime_in_days", "\(uptime / 86400)"),
        ])
        section("Clients", [
            ("connected_clients", "\(status.connectedClients)"), ("maxclients", "\(configuration.maxClients)"),
        ])
        section("Memory", [
            ("used_memory", "\(status.usedMemory)"), ("used_memory_human", KVCore.humanBytes(status.usedMemory)),
        ])
        let ops = opsSamples.reduce(0, +) / Int64(opsSamples.count)
        section("Stats", [
            ("total_commands_processed", "\(totalCommands)"), ("instantaneous_ops_per_sec", "\(ops)"),
            ("expired_keys", "\(expiredKeys)"), ("keyspace_hits", "\(keyspaceHits)"),
            ("keyspace_misses", "\(keyspaceMisses)"),
        ] + status.extraStats)
        section("Keyspace", keyspace.count == 0 ? [] : [
            ("db0", "keys=\(keyspace.count),expires=\(expiring.count),avg_ttl=\(averageTTL)")
        ])
        for extra in status.extraSections {
            let name = extra.name.prefix(1).uppercased() + extra.name.dropFirst()
            section(name, extra.fields)
        }
        return parts.joined(separator: "\r\n")
    }

    func info(_ a: [[UInt8]], _ output: inout [UInt8]) {
        let sections = a.dropFirst().map { String(decoding: $0, as: UTF8.self).lowercased() }
        RESP.appendBulkString(infoText(sections: sections), to: &output)
    }

    // MARK: CONFIG

    /// The parameters `CONFIG GET` knows, in the order it lists them.
    static let configNames = [
        "maxclients", "proto-max-bulk-len", "client-output-buffer-limit", "save", "appendonly", "databases",
    ]

    func configValue(_ name: String) -> String {
        switch name {
        case "maxclients": return "\(configuration.maxClients)"
        case "proto-max-bulk-len": return "\(configuration.protoMaxBulkLength)"
        case "client-output-buffer-limit": return configuration.outputBufferLimitText
        case "save": return ""
        case "appendonly": return "no"
        case "databases": return "1"
        default: return ""
        }
    }

    func config(_ a: [[UInt8]], _ output: inout [UInt8]) {
        let sub = a[1]
        if Self.equalsIgnoringCase(sub, "get") {
            guard a.count >= 3 else { return replyArity("config|get", into: &output) }
            // An exact name comes back as it was asked (Redis 7.0); a pattern lists the names.
            var matched: [(shown: String, name: String)] = []
            for pattern in a.dropFirst(2) {
                let text = String(decoding: pattern, as: UTF8.self)
                if !pattern.contains(where: { $0 == UInt8(ascii: "*") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "[") }) {
                    let name = text.lowercased()
                    if Self.configNames.contains(name) && !matched.contains(where: { $0.name == name }) {
                        matched.append((text, name))
                    }
                    continue
                }
                let glob = GlobPattern(pattern, ignoresCase: true)
                for name in Self.configNames where !matched.contains(where: { $0.name == name }) && glob.matches(Array(name.utf8)) {
                    matched.append((name, name))
                }
            }
            RESP.appendArrayHeader(matched.count * 2, to: &output)
            for entry in matched {
                RESP.appendBulkString(entry.shown, to: &output)
                RESP.appendBulkString(configValue(entry.name), to: &output)
            }
        } else if Self.equalsIgnoringCase(sub, "set") {
            guard a.count >= 4 && a.count % 2 == 0 else { return replyArity("config|set", into: &output) }
            var updated = configuration
            var seen: Set<String> = []
            var index = 2
            while index < a.count {
                let name = String(decoding: a[index], as: UTF8.self).lowercased()
                let value = String(decoding: a[index + 1], as: UTF8.self)
                func failure(_ reason: String) {
                    RESP.appendError(
                        "ERR CONFIG SET failed (possibly related to argument '\(name)') - \(reason)", to: &output)
                }
                guard ["maxclients", "proto-max-bulk-len", "client-output-buffer-limit"].contains(name) else {
                    replyError(
                        Array("ERR Unknown option or number of arguments for CONFIG SET - '".utf8),
                        Self.cBytes(a[index]), Array("'".utf8), into: &output)
                    return
                }
                if !seen.insert(name).inserted { return failure("duplicate parameter") }
                switch name {
                case "maxclients":
                    guard let number = RedisInteger.parse(a[index + 1]) else {
                        return failure("argument couldn't be parsed into an integer")
                    }
                    guard number >= 1 && number <= Int64(Int32.max) else {
                        return failure("argument must be between 1 and 2147483647 inclusive")
                    }
                    updated.maxClients = Int(number)
                case "proto-max-bulk-len":
                    guard let number = Self.memoryValue(value) else {
                        return failure("argument must be a memory value")
                    }
                    guard number >= 1_048_576 else {
                        return failure("argument must be between 1048576 and 9223372036854775807 inclusive")
                    }
                    updated.protoMaxBulkLength = Int(number)
                default:
                    if let reason = Self.parseOutputBufferLimits(value, into: &updated) { return failure(reason) }
                }
                index += 2
            }
            configuration = updated
            RESP.appendOK(to: &output)
        } else if Self.equalsIgnoringCase(sub, "resetstat") {
            guard a.count == 2 else { return replyArity("config|resetstat", into: &output) }
            totalCommands = 0
            keyspaceHits = 0
            keyspaceMisses = 0
            expiredKeys = 0
            opsSamples = Array(repeating: 0, count: opsSamples.count)
            RESP.appendOK(to: &output)
        } else {
            replyUnknownSubcommand(a, &output)
        }
    }

    /// A memory amount as Redis reads one (`memtoull`): digits and an optional unit
    /// (`k`, `kb`, `m`, `mb`, `g`, `gb`, any case).
    static func memoryValue(_ text: String) -> Int64? {
        let lower = text.lowercased()
        let units: [(String, Int64)] = [
            ("kb", 1024), ("mb", 1024 * 1024), ("gb", 1024 * 1024 * 1024), ("k", 1000), ("m", 1_000_000),
            ("g", 1_000_000_000), ("b", 1),
        ]
        var digits = Substring(lower)
        var multiplier: Int64 = 1
        for (suffix, factor) in units where lower.hasSuffix(suffix) {
            digits = digits.dropLast(suffix.count)
            multiplier = factor
            break
        }
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let number = Int64(digits) else {
            return nil
        }
        let (product, overflow) = number.multipliedReportingOverflow(by: multiplier)
        return overflow ? nil : product
    }

    /// Parses `client-output-buffer-limit` (`class hard soft seconds`, repeated) into
    /// `configuration`; returns the error reason, or nil.
    static func parseOutputBufferLimits(_ text: String, into configuration: inout KVConfiguration) -> String? {
        let words = text.split(separator: " ").map(String.init)
        guard words.count % 4 == 0 else { return "Wrong number of arguments in buffer limit configuration." }
        var result = configuration
        var index = 0
        while index < words.count {
            guard let hard = memoryValue(words[index + 1]), let soft = memoryValue(words[index + 2]),
                let seconds = Int(words[index + 3]), seconds >= 0
            else {
                return "Error in hard, soft or soft_seconds setting in buffer limit configuration."
            }
            let limit = KVConfiguration.OutputBufferLimit(hardLimit: Int(hard), softLimit: Int(soft), softSeconds: seconds)
            switch words[index].lowercased() {
            case "normal": result.normalOutputBufferLimit = limit
            case "slave", "replica": result.replicaOutputBufferLimit = limit
            case "pubsub": result.pubsubOutputBufferLimit = limit
            default: return "Invalid client class specified in buffer limit configuration."
            }
            index += 4
        }
        configuration = result
        return nil
    }

    // MARK: CLIENT

    func client(_ a: [[UInt8]], _ session: inout KVSession, _ output: inout [UInt8]) {
        let sub = a[1]
        if Self.equalsIgnoringCase(sub, "setname") {
            guard a.count == 3 else { return replyArity("client|setname", into: &output) }
            if setName(a[2], &session, &output) { RESP.appendOK(to: &output) }
        } else if Self.equalsIgnoringCase(sub, "getname") {
            guard a.count == 2 else { return replyArity("client|getname", into: &output) }
            if let name = session.name { RESP.appendBulkString(name, to: &output) } else { RESP.appendNullBulk(to: &output) }
        } else if Self.equalsIgnoringCase(sub, "id") {
            guard a.count == 2 else { return replyArity("client|id", into: &output) }
            RESP.appendInteger(session.id, to: &output)
        } else if Self.equalsIgnoringCase(sub, "list") {
            var clients = statusProvider().clients
            if clients.isEmpty {
                clients = [KVClientInfo(
                    id: session.id, address: "", name: session.name.map { String(decoding: $0, as: UTF8.self) } ?? "",
                    lastCommand: "client|list")]
            }
            var text = ""
            for client in clients {
                text += "id=\(client.id) addr=\(client.address) laddr=\(client.localAddress) fd=\(client.fileDescriptor)"
                text += " name=\(client.name) age=\(client.ageSeconds) idle=\(client.idleSeconds) flags=N db=0"
                text += " sub=0 psub=0 ssub=0 multi=-1 qbuf=\(client.inputBytes) qbuf-free=0 argv-mem=0 multi-mem=0"
                text += " rbs=0 rbp=0 obl=\(client.outputBytes) oll=0 omem=\(client.outputBytes) tot-mem=0"
                text += " events=r cmd=\(client.lastCommand) user=default redir=-1 resp=2\n"
            }
            RESP.appendBulkString(text, to: &output)
        } else {
            replyUnknownSubcommand(a, &output)
        }
    }

    /// Sets the session's name (empty clears it); false after replying an error.
    func setName(_ name: [UInt8], _ session: inout KVSession, _ output: inout [UInt8]) -> Bool {
        if name.contains(where: { $0 < UInt8(ascii: "!") || $0 > UInt8(ascii: "~") }) {
            RESP.appendError("ERR Client names cannot contain spaces, newlines or special characters.", to: &output)
            return false
        }
        session.name = name.isEmpty ? nil : name
        return true
    }

    // MARK: COMMAND

    /// The names of the commands the core implements (lowercase), as `COMMAND` lists them.
    public static let commandNames: [String] = CommandID.allCases.map { String(describing: $0.spec.name) }

    func appendCommandInfo(_ command: CommandID, _ output: inout [UInt8]) {
        let spec = command.spec
        RESP.appendArrayHeader(10, to: &output)
        RESP.appendBulkString(String(describing: spec.name), to: &output)
        RESP.appendInteger(spec.arity, to: &output)
        RESP.appendArrayHeader(spec.flags.count, to: &output)
        for flag in spec.flags { RESP.appendSimpleString(flag, to: &output) }
        RESP.appendInteger(spec.firstKey, to: &output)
        RESP.appendInteger(spec.lastKey, to: &output)
        RESP.appendInteger(spec.step, to: &output)
        for _ in 0..<4 { RESP.appendEmptyArray(to: &output) }  // ACL categories, tips, key specs, subcommands
    }

    func command(_ a: [[UInt8]], _ output: inout [UInt8]) {
        if a.count == 1 {
            RESP.appendArrayHeader(CommandID.allCases.count, to: &output)
            for command in CommandID.allCases { appendCommandInfo(command, &output) }
            return
        }
        let sub = a[1]
        if Self.equalsIgnoringCase(sub, "count") {
            guard a.count == 2 else { return replyArity("command|count", into: &output) }
            RESP.appendInteger(CommandID.allCases.count, to: &output)
        } else if Self.equalsIgnoringCase(sub, "docs") {
            RESP.appendEmptyArray(to: &output)
        } else if Self.equalsIgnoringCase(sub, "info") {
            let names = a.dropFirst(2)
            if names.isEmpty {
                RESP.appendArrayHeader(CommandID.allCases.count, to: &output)
                for command in CommandID.allCases { appendCommandInfo(command, &output) }
                return
            }
            RESP.appendArrayHeader(names.count, to: &output)
            for name in names {
                if let command = CommandID.lookup(name) { appendCommandInfo(command, &output) } else { RESP.appendNullBulk(to: &output) }
            }
        } else {
            replyUnknownSubcommand(a, &output)
        }
    }

    // MARK: HELLO

    func hello(_ a: [[UInt8]], _ session: inout KVSession, _ output: inout [UInt8]) {
        var index = 1
        if a.count >= 2 {
            guard let version = RedisInteger.parse(a[1]) else {
                RESP.appendError("ERR Protocol version is not an integer or out of range", to: &output)
                return
            }
            // Only RESP2 is spoken: HELLO 3 is refused as Redis refuses unknown versions.
            guard version == 2 else {
                RESP.appendError("NOPROTO unsupported protocol version", to: &output)
                return
            }
            index = 2
        }
        var name: [UInt8]?
        while index < a.count {
            let remaining = a.count - index - 1
            if Self.equalsIgnoringCase(a[index], "auth") && remaining >= 2 {
                guard Self.equalsIgnoringCase(a[index + 1], "default") else {
                    RESP.appendError("WRONGPASS invalid username-password pair or user is disabled.", to: &output)
                    return
                }
                index += 3
            } else if Self.equalsIgnoringCase(a[index], "setname") && remaining >= 1 {
                name = a[index + 1]
                index += 2
            } else {
                replyError(
                    Array("ERR Syntax error in HELLO option '".utf8), Self.cBytes(a[index]), Array("'".utf8),
                    into: &output)
                return
            }
        }
        if let name, !setName(name, &session, &output) { return }
        RESP.appendArrayHeader(14, to: &output)
        RESP.appendBulkString("server", to: &output)
        RESP.appendBulkString("redis", to: &output)
        RESP.appendBulkString("version", to: &output)
        RESP.appendBulkString(KVCore.compatibleRedisVersion, to: &output)
        RESP.appendBulkString("proto", to: &output)
        RESP.appendInteger(2, to: &output)
        RESP.appendBulkString("id", to: &output)
        RESP.appendInteger(session.id, to: &output)
        RESP.appendBulkString("mode", to: &output)
        RESP.appendBulkString("standalone", to: &output)
        RESP.appendBulkString("role", to: &output)
        RESP.appendBulkString("master", to: &output)
        RESP.appendBulkString("modules", to: &output)
        RESP.appendEmptyArray(to: &output)
    }
}
