/// A command typed into `mainspring-demo`.
public enum DemoCommand: Equatable, Sendable {
    case status, pause, resume, cancel, stats, help, quit
    /// `chunk <n>`: numbers sieved per chunk.
    case chunk(Int)

    /// The largest chunk size `chunk <n>` accepts.
    public static let maxChunk = 10_000_000

    /// Why a line is not a command.
    public enum ParseError: Error, Equatable, Sendable, CustomStringConvertible {
        case unknown(String)
        case missingArgument(String)
        case invalidArgument(String, String)
        case unexpectedArgument(String)

        public var description: String {
            switch self {
            case .unknown(let word): return "unknown command '\(word.prefix(40))'"
            case .missingArgument(let command): return "'\(command)' needs a number, e.g. '\(command) 50000'"
            case .invalidArgument(let command, let text):
                return "'\(text.prefix(40))' is not a chunk size for '\(command)' (1...\(DemoCommand.maxChunk))"
            case .unexpectedArgument(let command): return "'\(command)' takes no argument"
            }
        }
    }

    /// Parses one line: a command word (any case) and, for `chunk`, a number. Blank lines are
    /// `nil`. Never traps, whatever the input.
    public static func parse(_ line: String) -> Result<DemoCommand, ParseError>? {
        let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard let first = words.first else { return nil }
        let word = first.lowercased()
        let arguments = words.dropFirst()
        let simple: [String: DemoCommand] = [
            "status": .status, "pause": .pause, "resume": .resume, "cancel": .cancel,
            "stats": .stats, "help": .help, "?": .help, "quit": .quit, "exit": .quit,
        ]
        if let command = simple[word] {
            return arguments.isEmpty ? .success(command) : .failure(.unexpectedArgument(word))
        }
        guard word == "chunk" else { return .failure(.unknown(String(first))) }
        guard let text = arguments.first else { return .failure(.missingArgument(word)) }
        guard arguments.count == 1, let size = Int(text), size >= 1, size <= maxChunk else {
            return .failure(.invalidArgument(word, arguments.joined(separator: " ")))
        }
        return .success(.chunk(size))
    }

    /// The help text, one command per line.
    public static let helpText = """
        status        progress of the job
        pause         pause the job (input stays responsive)
        resume        resume it
        cancel        cancel it
        chunk <n>     numbers sieved per chunk (1...\(maxChunk))
        stats         the fairness report so far
        help          this text
        quit          stop now
        """
}

extension DemoCommand {
    /// The canonical line for this command (`parse(line) == self`).
    public var line: String {
        switch self {
        case .status: return "status"
        case .pause: return "pause"
        case .resume: return "resume"
        case .cancel: return "cancel"
        case .stats: return "stats"
        case .help: return "help"
        case .quit: return "quit"
        case .chunk(let size): return "chunk \(size)"
        }
    }
}
