extension KVCore {
    // MARK: DEBUG

    /// `DEBUG POPULATE count [prefix] [size]`, as in Redis: creates the string keys
    /// `prefix:0` … `prefix:(count-1)` (prefix `key` by default) holding `value:N` (cut or padded
    /// with zero bytes to `size` bytes when a size is given), skipping keys that exist; replies
    /// `+OK`. Runs inline, O(count), like Redis's: a test's way to load a million keys quickly.
    /// `DEBUG HELP` lists the subcommands; others get Redis's unknown-subcommand error.
    func debug(_ a: [[UInt8]], _ output: inout [UInt8]) {
        if Self.equalsIgnoringCase(a[1], "populate") {
            guard a.count >= 3 && a.count <= 5 else { return replyArity("debug|populate", into: &output) }
            guard let count = RedisInteger.parse(a[2]) else { return replyNotInteger(&output) }
            guard count >= 0 else {
                RESP.appendError("ERR count must be greater than or equal to zero", to: &output)
                return
            }
            let prefix = a.count >= 4 ? a[3] : Array("key".utf8)
            var size = 0
            if a.count == 5 {
                guard let parsed = RedisInteger.parse(a[4]) else { return replyNotInteger(&output) }
                guard parsed >= 0 && parsed <= Int64(configuration.protoMaxBulkLength) else {
                    RESP.appendError("ERR size out of range", to: &output)
                    return
                }
                size = Int(parsed)
            }
            let valuePrefix = Array("value:".utf8)
            var key = prefix + [UInt8(ascii: ":")]
            let keyBase = key.count
            for index in 0..<count {
                key.removeSubrange(keyBase...)
                RedisInteger.append(index, to: &key)
                let hash = ByteHash.hash(key)
                if liveSlot(key, hash: hash) != nil { continue }
                var value = valuePrefix
                RedisInteger.append(index, to: &value)
                if size > 0 {
                    if value.count > size {
                        value.removeSubrange(size...)
                    } else {
                        value.append(contentsOf: repeatElement(0, count: size - value.count))
                    }
                }
                insertKey(key, hash: hash, value: .string(SmallBytes(value)))
            }
            RESP.appendOK(to: &output)
        } else if Self.equalsIgnoringCase(a[1], "help") {
            let lines = [
                "DEBUG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "POPULATE <count> [<prefix>] [<size>]",
                "    Create <count> string keys named key:<num>. If <prefix> is specified then",
                "    it is used instead of the 'key' prefix. These are not propagated to",
                "    replicas. Cluster slots are not respected so keys not belonging to the",
                "    current node can be created in cluster mode.",
                "HELP",
                "    Print this help.",
            ]
            RESP.appendArrayHeader(lines.count, to: &output)
            for line in lines { RESP.appendSimpleString(line, to: &output) }
        } else {
            replyUnknownSubcommand(a, &output)
        }
    }
}
