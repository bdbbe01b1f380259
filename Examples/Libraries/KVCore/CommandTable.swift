// The command table. The packed constants are the lowercase names' bytes, little-endian.
/// A command the core implements.
enum CommandID: UInt8, CaseIterable {
    case ping
    case echo
    case quit
    case select
    case dbsize
    case flushall
    case flushdb
    case exists
    case del
    case unlink
    case type
    case keys
    case scan
    case expire
    case pexpire
    case ttl
    case pttl
    case persist
    case set
    case get
    case getset
    case mset
    case mget
    case incr
    case incrby
    case decr
    case decrby
    case append
    case strlen
    case lpush
    case rpush
    case lpop
    case rpop
    case llen
    case lrange
    case lindex
    case hset
    case hget
    case hdel
    case hgetall
    case hlen
    case hexists
    case hincrby
    case sadd
    case srem
    case smembers
    case sismember
    case scard
    case spop
    case info
    case config
    case client
    case command
    case hello
    case debug
}

struct CommandSpec {
    let name: StaticString
    let arity: Int
    let flags: [StaticString]
    let firstKey: Int
    let lastKey: Int
    let step: Int
}

extension CommandID {
    /// Redis's arity (exact when positive, a minimum when negative), flags and key positions.
    static let specs: [CommandSpec] = [
        CommandSpec(name: "ping", arity: -1, flags: ["fast"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "echo", arity: 2, flags: ["fast"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "quit", arity: -1, flags: ["fast"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "select", arity: 2, flags: ["fast"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "dbsize", arity: 1, flags: ["readonly", "fast"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "flushall", arity: -1, flags: ["write"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "flushdb", arity: -1, flags: ["write"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "exists", arity: -2, flags: ["readonly", "fast"], firstKey: 1, lastKey: -1, step: 1),
        CommandSpec(name: "del", arity: -2, flags: ["write"], firstKey: 1, lastKey: -1, step: 1),
        CommandSpec(name: "unlink", arity: -2, flags: ["write", "fast"], firstKey: 1, lastKey: -1, step: 1),
        CommandSpec(name: "type", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "keys", arity: 2, flags: ["readonly"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "scan", arity: -2, flags: ["readonly"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "expire", arity: -3, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "pexpire", arity: -3, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "ttl", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "pttl", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "persist", arity: 2, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "set", arity: -3, flags: ["write", "denyoom"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "get", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "getset", arity: 3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "mset", arity: -3, flags: ["write", "denyoom"], firstKey: 1, lastKey: -1, step: 2),
        CommandSpec(name: "mget", arity: -2, flags: ["readonly", "fast"], firstKey: 1, lastKey: -1, step: 1),
        CommandSpec(name: "incr", arity: 2, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "incrby", arity: 3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "decr", arity: 2, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "decrby", arity: 3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "append", arity: 3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "strlen", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "lpush", arity: -3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "rpush", arity: -3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "lpop", arity: -2, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "rpop", arity: -2, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "llen", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "lrange", arity: 4, flags: ["readonly"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "lindex", arity: 3, flags: ["readonly"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hset", arity: -4, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hget", arity: 3, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hdel", arity: -3, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hgetall", arity: 2, flags: ["readonly"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hlen", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hexists", arity: 3, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "hincrby", arity: 4, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "sadd", arity: -3, flags: ["write", "denyoom", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "srem", arity: -3, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "smembers", arity: 2, flags: ["readonly"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "sismember", arity: 3, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "scard", arity: 2, flags: ["readonly", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "spop", arity: -2, flags: ["write", "fast"], firstKey: 1, lastKey: 1, step: 1),
        CommandSpec(name: "info", arity: -1, flags: ["loading", "stale"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "config", arity: -2, flags: [], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "client", arity: -2, flags: [], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "command", arity: -1, flags: ["loading", "stale"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "hello", arity: -1, flags: ["noscript", "loading", "stale", "fast"], firstKey: 0, lastKey: 0, step: 0),
        CommandSpec(name: "debug", arity: -2, flags: ["admin", "noscript", "loading", "stale"], firstKey: 0, lastKey: 0, step: 0),
    ]

    var spec: CommandSpec { Self.specs[Int(rawValue)] }

    /// The command named `name`, case-insensitively, or nil. No allocation: a switch on the
    /// length and the name's bytes packed into an integer.
    @inline(__always)
    static func lookup(_ name: [UInt8]) -> CommandID? {
        let count = name.count
        guard count >= 3 && count <= 9 else { return nil }
        return name.withUnsafeBufferPointer { bytes -> CommandID? in
            var word: UInt64 = 0
            for index in 0..<min(count, 8) {
                let byte = bytes[index]
                // Names are letters only, and `| 0x20` maps a byte to a lowercase letter only
                // from that letter or its capital.
                word |= UInt64(byte | 0x20) << (8 * UInt64(index))
            }
            switch count {
            case 3:
                switch word {
                case 0x6c6564: return .del
                case 0x6c7474: return .ttl
                case 0x746573: return .set
                case 0x746567: return .get
                default: return nil
                }
            case 4:
                switch word {
                case 0x676e6970: return .ping
                case 0x6f686365: return .echo
                case 0x74697571: return .quit
                case 0x65707974: return .type
                case 0x7379656b: return .keys
                case 0x6e616373: return .scan
                case 0x6c747470: return .pttl
                case 0x7465736d: return .mset
                case 0x7465676d: return .mget
                case 0x72636e69: return .incr
                case 0x72636564: return .decr
                case 0x706f706c: return .lpop
                case 0x706f7072: return .rpop
                case 0x6e656c6c: return .llen
                case 0x74657368: return .hset
                case 0x74656768: return .hget
                case 0x6c656468: return .hdel
                case 0x6e656c68: return .hlen
                case 0x64646173: return .sadd
                case 0x6d657273: return .srem
                case 0x706f7073: return .spop
                case 0x6f666e69: return .info
                default: return nil
                }
            case 5:
                switch word {
                case 0x687375706c: return .lpush
                case 0x6873757072: return .rpush
                case 0x6472616373: return .scard
                case 0x6f6c6c6568: return .hello
                case 0x6775626564: return .debug
                default: return nil
                }
            case 6:
                switch word {
                case 0x7463656c6573: return .select
                case 0x657a69736264: return .dbsize
                case 0x737473697865: return .exists
                case 0x6b6e696c6e75: return .unlink
                case 0x657269707865: return .expire
                case 0x746573746567: return .getset
                case 0x796272636e69: return .incrby
                case 0x796272636564: return .decrby
                case 0x646e65707061: return .append
                case 0x6e656c727473: return .strlen
                case 0x65676e61726c: return .lrange
                case 0x7865646e696c: return .lindex
                case 0x6769666e6f63: return .config
                case 0x746e65696c63: return .client
                default: return nil
                }
            case 7:
                switch word {
                case 0x62646873756c66: return .flushdb
                case 0x65726970786570: return .pexpire
                case 0x74736973726570: return .persist
                case 0x6c6c6174656768: return .hgetall
                case 0x73747369786568: return .hexists
                case 0x796272636e6968: return .hincrby
                case 0x646e616d6d6f63: return .command
                default: return nil
                }
            case 8:
                switch word {
                case 0x6c6c616873756c66: return .flushall
                case 0x737265626d656d73: return .smembers
                default: return nil
                }
            case 9:
                return word == 0x65626d656d736973 && bytes[8] | 0x20 == UInt8(ascii: "r") ? .sismember : nil
            default:
                return nil
            }
        }
    }
}
