/// A request line to `mainspring-daemon`.
public enum DaemonCommand: Equatable, Sendable {
    /// `ECHO <text>`: the text back, verbatim.
    case echo(String)
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
        let wordEnd = line.firstIndex(of: " ") ?? line.endIndex
        let word = line[line.startIndex..<wordEnd]
        let rest = wordEnd == line.endIndex ? Substring() : line[line.index(after: wordEnd)...]
        // Compared without allocating (no uppercased() per request: this is the hot path).
        if word.isEmpty { return .failure(.empty) }
        if word.equalsIgnoringASCIICase("ECHO") { return .success(.echo(String(rest))) }
        if word.equalsIgnoringASCIICase("TIME") { return .success(.time) }
        if word.equalsIgnoringASCIICase("STATS") { return .success(.stats) }
        if word.equalsIgnoringASCIICase("QUIT") { return .success(.quit) }
        let isSleep = word.equalsIgnoringASCIICase("SLEEP")
        guard isSleep || word.equalsIgnoringASCIICase("WORK") else { return .failure(.unknown(word.uppercased())) }
        let name = isSleep ? "SLEEP" : "WORK"
        let text = rest.trimmingSpaces
        guard !text.isEmpty else { return .failure(.missingArgument(name)) }
        let low = isSleep ? 0 : 1
        let high = isSleep ? maxSleepMilliseconds : maxWorkChunks
        guard let value = Int(text), value >= low, value <= high else {
            return .failure(.invalidArgument(name, String(text)))
        }
        return .success(isSleep ? .sleep(milliseconds: value) : .work(chunks: value))
    }

    public static func parse(_ line: String) -> Result<DaemonCommand, ParseError> { parse(line[...]) }
}

extension Substring {
    /// Whether this is `word` (uppercase ASCII) in any case.
    func equalsIgnoringASCIICase(_ word: String) -> Bool {
        guard utf8.count == word.utf8.count else { return false }
        return zip(utf8, word.utf8).allSatisfy { byte, expected in
            (byte >= 0x61 && byte <= 0x7A ? byte - 0x20 : byte) == expected
        }
    }

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
