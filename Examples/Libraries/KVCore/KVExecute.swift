extension KVCore {
    /// Runs one command (as `RESPParser` yields it) for the client of `session`.
    ///
    /// Appends the reply to `output` and returns `.replied` or `.close`, or returns `.sliced`
    /// for a command on large data, whose reply its `step(budget:into:)` produces (see
    /// `KVCore`). Unknown commands, wrong arity, wrong types and bad arguments get Redis 7.0's
    /// error replies. The keyspace changes at once; the cost is the command's own (O(1) for
    /// most, O(n) in the arguments or in the reply).
    public func execute(_ arguments: [[UInt8]], session: inout KVSession, into output: inout [UInt8]) -> KVExecution {
        cachedNow = nil
        guard let name = arguments.first else { return .replied }
        guard let command = CommandID.lookup(name) else {
            replyUnknownCommand(arguments, into: &output)
            return .replied
        }
        let spec = command.spec
        let argc = arguments.count
        if spec.arity > 0 ? argc != spec.arity : argc < -spec.arity {
            replyArity(String(describing: spec.name), into: &output)
            return .replied
        }
        defer { totalCommands += 1 }  // counted after it ran, as Redis does (INFO does not see itself)
        session.lastCommandID = command
        let a = arguments
        switch command {
        case .get: get(a, &output)
        case .set: set(a, &output)
        case .incr: incrementBy(a[1], 1, &output)
        case .decr: incrementBy(a[1], -1, &output)
        case .incrby:
            guard let delta = integerArgument(a[2], &output) else { break }
            incrementBy(a[1], delta, &output)
        case .decrby:
            guard let delta = integerArgument(a[2], &output) else { break }
            if delta == Int64.min {
                RESP.appendError("ERR decrement would overflow", to: &output)
                break
            }
            incrementBy(a[1], -delta, &output)
        case .lpush: push(a, front: true, &output)
        case .rpush: push(a, front: false, &output)
        case .lpop: return pop(a, front: true, &output)
        case .rpop: return pop(a, front: false, &output)
        case .sadd: sadd(a, &output)
        case .hset: hset(a, &output)
        case .spop: return spop(a, &output)
        case .lrange: return lrange(a, &output)
        case .mset: mset(a, &output)
        case .ping:
            if argc > 2 {
                replyArity("ping", into: &output)
            } else if argc == 1 { RESP.appendStatic("+PONG\r\n", to: &output) } else { RESP.appendBulkString(a[1], to: &output) }
        case .echo: RESP.appendBulkString(a[1], to: &output)
        case .quit:
            RESP.appendOK(to: &output)
            return .close
        case .select: select(a, &output)
        case .dbsize: RESP.appendInteger(keyspace.count, to: &output)
        case .flushall, .flushdb: flush(a, &output)
        case .exists:
            var count = 0
            for key in a.dropFirst() where liveSlot(key) != nil { count += 1 }
            RESP.appendInteger(count, to: &output)
        case .del, .unlink:
            var count = 0
            for key in a.dropFirst() {
                if let slot = liveSlot(key) {
                    deleteKey(slot: slot)
                    count += 1
                }
            }
            RESP.appendInteger(count, to: &output)
        case .type:
            if let slot = readSlot(a[1]) {
                RESP.appendSimpleString(entry(at: slot).value.typeName, to: &output)
            } else {
                RESP.appendStatic("+none\r\n", to: &output)
            }
        case .keys: return keys(a, &output)
        case .scan: scan(a, &output)
        case .expire: expire(a, milliseconds: false, &output)
        case .pexpire: expire(a, milliseconds: true, &output)
        case .ttl: ttl(a[1], milliseconds: false, &output)
        case .pttl: ttl(a[1], milliseconds: true, &output)
        case .persist:
            if let slot = liveSlot(a[1]), entry(at: slot).expiryPosition >= 0 {
                clearExpiry(slot: slot)
                RESP.appendInteger(1, to: &output)
            } else {
                RESP.appendInteger(0, to: &output)
            }
        case .getset: getset(a, &output)
        case .mget: mget(a, &output)
        case .append: append(a, &output)
        case .strlen: strlen(a, &output)
        case .llen: llen(a, &output)
        case .lindex: lindex(a, &output)
        case .hget: hget(a, &output)
        case .hdel: hdel(a, &output)
        case .hgetall: return hgetall(a, &output)
        case .hlen: hlen(a, &output)
        case .hexists: hexists(a, &output)
        case .hincrby: hincrby(a, &output)
        case .srem: srem(a, &output)
        case .smembers: return smembers(a, &output)
        case .sismember: sismember(a, &output)
        case .scard: scard(a, &output)
        case .info: info(a, &output)
        case .config: config(a, &output)
        case .client: client(a, &session, &output)
        case .command: self.command(a, &output)
        case .hello: hello(a, &session, &output)
        case .debug: debug(a, &output)
        }
        return .replied
    }

    // MARK: Errors

    @inline(__always)
    func replyWrongType(_ output: inout [UInt8]) {
        RESP.appendError("WRONGTYPE Operation against a key holding the wrong kind of value", to: &output)
    }

    @inline(__always)
    func replyNotInteger(_ output: inout [UInt8]) {
        RESP.appendError("ERR value is not an integer or out of range", to: &output)
    }

    @inline(__always)
    func replySyntaxError(_ output: inout [UInt8]) {
        RESP.appendError("ERR syntax error", to: &output)
    }

    func replyArity(_ name: String, into output: inout [UInt8]) {
        RESP.appendError("ERR wrong number of arguments for '\(name)' command", to: &output)
    }

    /// The integer in `argument`, or nil after replying Redis's not-an-integer error.
    @inline(__always)
    func integerArgument(_ argument: [UInt8], _ output: inout [UInt8]) -> Int64? {
        guard let value = RedisInteger.parse(argument) else {
            replyNotInteger(&output)
            return nil
        }
        return value
    }

    /// A non-negative count (`LPOP key count`, `SPOP key count`), or nil after the error.
    func positiveCountArgument(_ argument: [UInt8], _ output: inout [UInt8]) -> Int? {
        guard let value = RedisInteger.parse(argument), value >= 0 else {
            RESP.appendError("ERR value is out of range, must be positive", to: &output)
            return nil
        }
        return Int(value)
    }

    /// An argument as C's `%.*s` shows it in an error message: up to a NUL byte, at most
    /// `limit` bytes.
    static func cBytes(_ bytes: [UInt8], limit: Int = Int.max) -> [UInt8] {
        let end = min(bytes.firstIndex(of: 0) ?? bytes.count, limit)
        return Array(bytes[0..<end])
    }

    /// Appends an error made of text and argument bytes.
    func replyError(_ parts: [UInt8]..., into output: inout [UInt8]) {
        RESP.appendError(bytes: parts.flatMap { $0 }, to: &output)
    }

    func replyUnknownCommand(_ arguments: [[UInt8]], into output: inout [UInt8]) {
        var args: [UInt8] = []
        for argument in arguments.dropFirst() {
            if args.count >= 128 { break }
            args.append(UInt8(ascii: "'"))
            args += Self.cBytes(argument, limit: 128 - args.count + 1)
            args += [UInt8(ascii: "'"), UInt8(ascii: " ")]
        }
        replyError(
            Array("ERR unknown command '".utf8), Self.cBytes(arguments[0], limit: 128),
            Array("', with args beginning with: ".utf8), args, into: &output)
    }

    func replyUnknownSubcommand(_ arguments: [[UInt8]], _ output: inout [UInt8]) {
        let container = Self.cBytes(arguments[0]).map { $0 >= 0x61 && $0 <= 0x7a ? $0 - 0x20 : $0 }
        replyError(
            Array("ERR unknown subcommand '".utf8), Self.cBytes(arguments[1], limit: 128), Array("'. Try ".utf8),
            container, Array(" HELP.".utf8), into: &output)
    }

    /// Whether `argument` equals `lowercase` (letters only), ignoring case.
    @inline(__always)
    static func equalsIgnoringCase(_ argument: [UInt8], _ lowercase: StaticString) -> Bool {
        let count = lowercase.utf8CodeUnitCount
        guard argument.count == count else { return false }
        let expected = lowercase.utf8Start
        for index in 0..<count {
            let byte = argument[index]
            let lowered = byte >= 0x41 && byte <= 0x5a ? byte | 0x20 : byte
            if lowered != expected[index] { return false }
        }
        return true
    }

    // MARK: Connection and server

    func select(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard let index = RedisInteger.parse(a[1]) else {
            replyNotInteger(&output)
            return
        }
        guard index >= Int64(Int32.min) && index <= Int64(Int32.max) else {
            RESP.appendError("ERR value is out of range, value must between -2147483648 and 2147483647", to: &output)
            return
        }
        if index != 0 {
            RESP.appendError("ERR DB index is out of range", to: &output)
            return
        }
        RESP.appendOK(to: &output)
    }

    func flush(_ a: [[UInt8]], _ output: inout [UInt8]) {
        if a.count > 2 || (a.count == 2 && !Self.equalsIgnoringCase(a[1], "async") && !Self.equalsIgnoringCase(a[1], "sync")) {
            replySyntaxError(&output)
            return
        }
        flushKeyspace()
        RESP.appendOK(to: &output)
    }
}

extension KVSession {
    var lastCommandID: CommandID? {
        get { lastCommandRaw.flatMap(CommandID.init(rawValue:)) }
        set { lastCommandRaw = newValue?.rawValue }
    }
}
