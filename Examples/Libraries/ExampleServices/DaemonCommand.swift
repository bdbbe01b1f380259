import Foundation
import Mainspring

/// A request line to `mainspring-daemon`.
public enum DaemonCommand: Equatable, Sendable {
    /// `ECHO <text>`: the text back, verbatim (a slice of the request line: the echo reply
    /// needs no string of its own).
    case echo(Substring)
    /// `TIME`: the server's wall-clock time.
    case time
    /// `SLEEP <ms>`: reply after that long (a timer, not a blocked thread).
    case sleep(milliseconds: Int)
    /// `WORK <n>`: n chunks of CPU work fed to the loop through a Feeder; reply when done.
    case work(chunks: Int)
    /// `STATS`: the server's counters.
    case stats
    /// `QUIT`: reply, then close the connection.
    case quit

    public static let maxSleepMilliseconds = 60_000
    public static let maxWorkChunks = 1_000_000

    /// Why a request is refused (sent back as `ERR <description>`).
    public enum ParseError: Error, Equatable, Sendable, CustomStringConvertible {
        case empty
        case unknown(String)
        case missingArgument(String)
        case invalidArgument(String, String)

        public var description: String {
            switch self {
            case .empty: return "empty request"
            case .unknown(let word): return "unknown command '\(word.prefix(32))' (ECHO, TIME, SLEEP, WORK, STATS, QUIT)"
            case .missingArgument(let command): return "\(command) needs an argument"
            case .invalidArgument(let command, let text):
                let range = command == "SLEEP" ? "0...\(DaemonCommand.maxSleepMilliseconds)" : "1...\(DaemonCommand.maxWorkChunks)"
                return "\(command) argument '\(text.prefix(32))' is not a number in \(range)"
            }
        }
    }

    /// Parses one request line. The command word is case-insensitive; `ECHO` keeps everything
    /// after the first space verbatim. Never traps, whatever the input.
    public static func parse(_ line: Substring) -> Result<DaemonCommand, ParseError> {
        // The command word is read once, byte by byte, into an integer key (its first 8 bytes,
        // uppercased), and compared with the commands' keys: no allocation, no per-command scan
        // (this is the hot path of every request).
        let bytes = line.utf8
        var key: UInt64 = 0
        var length = 0
        var wordEnd = bytes.endIndex
        var index = bytes.startIndex
        while index != bytes.endIndex {
            let byte = bytes[index]
            if byte == 0x20 {
                wordEnd = index
                break
            }
            if length < 8 { key = key << 8 | UInt64(byte >= 0x61 && byte <= 0x7A ? byte - 0x20 : byte) }
            length += 1
            bytes.formIndex(after: &index)
        }
        if length == 0 { return .failure(.empty) }
        let rest = wordEnd == bytes.endIndex ? Substring() : line[bytes.index(after: wordEnd)...]
        let command: Keyword? = length <= 8 ? Keyword(rawValue: key) : nil
        switch command {
        case .echo: return .success(.echo(rest))
        case .time: return .success(.time)
        case .stats: return .success(.stats)
        case .quit: return .success(.quit)
        case .sleep, .work:
            let isSleep = command == .sleep
            let name = isSleep ? "SLEEP" : "WORK"
            let text = rest.trimmingSpaces
            guard !text.isEmpty else { return .failure(.missingArgument(name)) }
            let low = isSleep ? 0 : 1
            let high = isSleep ? maxSleepMilliseconds : maxWorkChunks
            guard let value = Int(text), value >= low, value <= high else {
                return .failure(.invalidArgument(name, String(text)))
            }
            return .success(isSleep ? .sleep(milliseconds: value) : .work(chunks: value))
        case nil:
            return .failure(.unknown(line[line.startIndex..<wordEnd].uppercased()))
        }
    }

    /// The command words, as the key `parse` computes: their ASCII bytes, big-endian.
    private enum Keyword: UInt64 {
        case echo = 0x4543_484F  // "ECHO"
        case time = 0x5449_4D45  // "TIME"
        case stats = 0x53_5441_5453  // "STATS"
        case quit = 0x5155_4954  // "QUIT"
        case sleep = 0x53_4C45_4550  // "SLEEP"
        case work = 0x574F_524B  // "WORK"
    }

    public static func parse(_ line: String) -> Result<DaemonCommand, ParseError> { parse(line[...]) }
}

extension Substring {
    var trimmingSpaces: Substring {
        var result = self
        while result.first == " " || result.first == "\t" { result = result.dropFirst() }
        while result.last == " " || result.last == "\t" { result = result.dropLast() }
        return result
    }
}

extension DaemonCommand {
    /// The canonical request line for this command (`parse(requestLine) == self`).
    public var requestLine: String {
        switch self {
        case .echo(let text): return "ECHO \(text)"
        case .time: return "TIME"
        case .sleep(let ms): return "SLEEP \(ms)"
        case .work(let chunks): return "WORK \(chunks)"
        case .stats: return "STATS"
        case .quit: return "QUIT"
        }
    }
}

extension DaemonCommand {
    /// The `TIME` reply: `loop`'s calendar (the wall clock; virtual in a simulation) in ISO 8601.
    static func timeReply(on loop: EventLoop) -> String {
        let milliseconds = loop.calendarMilliseconds()
        return ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(milliseconds) / 1_000))
    }

    /// Whole seconds from `start` (`loop.monotonicNow()` when the service started) to now, on
    /// `loop`'s clock.
    static func uptimeSeconds(since start: UInt64, on loop: EventLoop) -> Int {
        let now = loop.monotonicNow()
        return now > start ? Int((now - start) / 1_000_000_000) : 0
    }
}
