import ExampleServices
import Mainspring

extension FuzzHarness {
    /// The demo's command parser: any bytes, split into lines the way the demo reads stdin, must
    /// parse to a command or a described error (never trap), and a parsed command must
    /// round-trip through its canonical line.
    public static func demoCommands(_ input: [UInt8]) {
        forEachLine(input) { line in
            guard let result = DemoCommand.parse(line) else {
                precondition(line.allSatisfy { $0 == " " || $0 == "\t" }, "a non-blank line parsed as blank")
                return
            }
            switch result {
            case .success(let command):
                precondition(DemoCommand.parse(command.line) == .success(command), "\(command) does not round-trip")
            case .failure(let error):
                precondition(!error.description.isEmpty && error.description.count < 200, "bad error text")
            }
        }
    }

    /// The daemon's request parser: same contract; `ECHO` keeps its text verbatim.
    public static func daemonCommands(_ input: [UInt8]) {
        forEachLine(input) { line in
            switch DaemonCommand.parse(line) {
            case .success(let command):
                precondition(DaemonCommand.parse(command.requestLine) == .success(command), "\(command) does not round-trip")
                if case .echo(let text) = command {
                    precondition(line.hasSuffix(text), "ECHO changed its text")
                }
            case .failure(let error):
                precondition(!error.description.isEmpty && error.description.count < 200, "bad error text")
            }
        }
    }

    /// Splits like a reader with a 256-byte line limit and calls `body` with each valid line.
    private static func forEachLine(_ input: [UInt8], _ body: (String) -> Void) {
        var splitter = LineSplitter(maxLineLength: 256)
        var lines: [String] = []
        splitter.append(input[...]) { if case .line(let text) = $0 { lines.append(text) } }
        splitter.finish { if case .line(let text) = $0 { lines.append(text) } }
        lines.forEach(body)
    }
}
