import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
import MainspringTestSupport
#endif

// The servers, the client and the probes of the Redis-protocol tests (KVServerTests.swift):
// `mainspring-kv` and `redis-server` as subprocesses, a small blocking RESP client, INFO fields,
// a PING sampler.

// MARK: Servers

/// A running `mainspring-kv`.
final class KVServerProcess: @unchecked Sendable {
    let child: ChildProcess
    let port: UInt16

    init(_ arguments: [String] = []) throws {
        child = try startExecutable("mainspring-kv", arguments: ["--port", "0"] + arguments)
        guard let banner = child.readLine(timeout: .seconds(30)), banner.hasPrefix("listening on "),
              let port = banner.split(separator: ":").last.flatMap({ UInt16($0) })
        else {
            child.send(SIGKILL)
            throw FixtureLaunchError.spawnFailed("mainspring-kv (no banner: \(child.stderrSoFar))", errno: 0)
        }
        self.port = port
    }

    /// SIGTERM, and the exit status (0 expected).
    func stop() -> FixtureResult {
        child.send(SIGTERM)
        return child.waitForExit(timeout: .seconds(30))
    }

    deinit { if !child.hasExited { child.send(SIGKILL) } }
}

/// A `redis-server` on a port outside the ephemeral range (it cannot take port 0), persistence
/// off; retried on another port when the chosen one was taken meanwhile.
final class RedisServerProcess: @unchecked Sendable {
    let child: ChildProcess
    let port: UInt16

    init(path: String) throws {
        for _ in 0..<10 {
            let port = try subprocessPorts(1)[0]
            let child = try startProgram(path, arguments: [
                "--port", "\(port)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--protected-mode", "no",
            ])
            var ready = false
            while let line = child.readLine(timeout: .seconds(20)) {
                if line.contains("Ready to accept connections") {
                    ready = true
                    break
                }
                if line.contains("Address already in use") { break }
            }
            if ready {
                self.child = child
                self.port = port
                return
            }
            child.send(SIGKILL)
            _ = child.waitForExit(timeout: .seconds(10))
        }
        throw FixtureLaunchError.spawnFailed("redis-server (no free port after 10 tries)", errno: 0)
    }

    func stop() {
        child.send(SIGTERM)
        _ = child.waitForExit(timeout: .seconds(20))
    }

    deinit { if !child.hasExited { child.send(SIGKILL) } }
}

// MARK: A RESP client

/// A blocking RESP client over a plain socket (for plain threads): exact replies.
final class RESPClient: @unchecked Sendable {
    let fd: Int32
    private var buffer: [UInt8] = []
    private var position = 0

    init(port: UInt16, timeoutSeconds: Int = 30) throws {
        let fd = try connectTestSocket(port: port, receiveTimeoutSeconds: timeoutSeconds)
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        self.fd = fd
    }

    deinit { close(fd) }

    static func encode(_ arguments: [String]) -> [UInt8] {
        var out = Array("*\(arguments.count)\r\n".utf8)
        for argument in arguments {
            out += Array("$\(argument.utf8.count)\r\n".utf8)
            out += Array(argument.utf8)
            out += [13, 10]
        }
        return out
    }

    func send(_ bytes: [UInt8]) { sendAll(bytes, to: fd) }

    func send(_ arguments: String...) { send(Self.encode(arguments)) }

    /// Sends a command and reads its reply.
    func call(_ arguments: String...) -> RESPValue? {
        send(Self.encode(arguments))
        return read()
    }

    private func fill() -> Bool {
        if position > 0 && position == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            position = 0
        } else if position > 1 << 20 {
            buffer.removeSubrange(0..<position)
            position = 0
        }
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            buffer += chunk[0..<n]
            return true
        }
    }

    private func line() -> [UInt8]? {
        var skip = 0  // bytes after `position` already searched (fill may move the buffer)
        while true {
            if let cr = buffer[(position + skip)...].firstIndex(of: 13), cr + 1 < buffer.count {
                let text = Array(buffer[position..<cr])
                position = cr + 2
                return text
            }
            skip = max(0, buffer.count - position - 1)
            guard fill() else { return nil }
        }
    }

    private func exactly(_ count: Int) -> [UInt8]? {
        while buffer.count - position < count + 2 {
            guard fill() else { return nil }
        }
        let bytes = Array(buffer[position..<(position + count)])
        position += count + 2
        return bytes
    }

    /// The next reply; nil at end of input, error or timeout.
    func read() -> RESPValue? {
        guard let header = line(), let kind = header.first else { return nil }
        let rest = String(decoding: header.dropFirst(), as: UTF8.self)
        switch kind {
        case UInt8(ascii: "+"): return .simple(rest)
        case UInt8(ascii: "-"): return .error(rest)
        case UInt8(ascii: ":"): return Int(rest).map { .integer($0) }
        case UInt8(ascii: "$"):
            guard let count = Int(rest) else { return nil }
            if count < 0 { return .null }
            return exactly(count).map { .bulk($0) }
        case UInt8(ascii: "*"):
            guard let count = Int(rest) else { return nil }
            if count < 0 { return .null }
            var items: [RESPValue] = []
            items.reserveCapacity(count)
            for _ in 0..<count {
                guard let item = read() else { return nil }
                items.append(item)
            }
            return .array(items)
        default:
            return nil
        }
    }

    /// Whether the server closes the connection within the timeout (reading and dropping what
    /// comes before the end).
    func isClosedByServer() -> Bool {
        while fill() {}
        return errno != EAGAIN && errno != EWOULDBLOCK
    }
}

enum RESPValue: Equatable, Sendable {
    case simple(String)
    case error(String)
    case integer(Int)
    case bulk([UInt8])
    case null
    case array([RESPValue])

    var text: String? {
        switch self {
        case .simple(let text), .error(let text): return text
        case .bulk(let bytes): return String(decoding: bytes, as: UTF8.self)
        default: return nil
        }
    }

    var array: [RESPValue]? {
        if case .array(let items) = self { return items }
        return nil
    }

    static func bulk(_ text: String) -> RESPValue { .bulk(Array(text.utf8)) }
}

// MARK: Probes
/// An INFO field of `client`'s server, as text.
func infoField(_ client: RESPClient, _ section: String, _ field: String) -> String? {
    guard let text = client.call("INFO", section)?.text else { return nil }
    for line in text.split(separator: "\r\n") where line.hasPrefix(field + ":") {
        return String(line.dropFirst(field.count + 1))
    }
    return nil
}

/// Pushes `count` elements `e0`… to the list `key`, 10,000 per command, pipelined.
func fillList(_ client: RESPClient, key: String, count: Int) -> Int {
    var commands = 0
    var start = 0
    while start < count {
        let end = min(count, start + 10_000)
        client.send(RESPClient.encode(["RPUSH", key] + (start..<end).map { "e\($0)" }))
        commands += 1
        start = end
    }
    var length = 0
    for _ in 0..<commands {
        if case .integer(let n)? = client.read() { length = n }
    }
    return length
}

/// PINGs `client` once a millisecond until `stop` is set; the round trips in ms, and how many
/// PINGs went unanswered.
func samplePings(_ client: RESPClient, until stop: StopFlag) -> (rtts: [Double], lost: Int) {
    var rtts: [Double] = []
    var lost = 0
    let ping = RESPClient.encode(["PING"])
    while !stop.value.load(ordering: .relaxed) {
        let start = DispatchTime.now().uptimeNanoseconds
        client.send(ping)
        if client.read() == .simple("PONG") {
            rtts.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        } else {
            lost += 1
            break
        }
        usleep(1_000)
    }
    return (rtts, lost)
}

/// A flag set by one thread, read by another.
final class StopFlag: Sendable {
    let value = Atomic<Bool>(false)
}

/// A value handed to one other thread (set before it starts, read after it ends).
final class Handoff<Value>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}

func percentile99(_ values: [Double]) -> Double {
    guard !values.isEmpty else { return .nan }
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int((0.99 * Double(sorted.count)).rounded(.up)) - 1)]
}
