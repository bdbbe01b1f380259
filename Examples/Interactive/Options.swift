import ExampleServices
import Foundation
import Mainspring

/// What the command line asks `mainspring-demo` to do.
struct DemoOptions {
    /// Where the demo's input comes from.
    enum Mode: String {
        /// Commands typed on stdin (or piped into it).
        case interactive
        /// An `InputSimulator`; stdin is not read.
        case simulate
    }

    var mode: Mode
    /// Primes are counted below this.
    var limit: Int
    /// Numbers sieved per chunk (the `chunk <n>` command changes it while the job runs).
    var chunkSize = 100_000
    /// How the feeder paces the chunks.
    var pacing: Feeder.Pacing = .budget(.milliseconds(1))
    /// Post every chunk at once with `EventLoop.execute` instead of feeding them.
    var naive = false
    /// At the end of stdin, cancel the job instead of letting it finish.
    var cancelOnEndOfInput = false
    /// Simulate mode: print the report as one JSON object, and nothing else.
    var json = false

    /// The default limit when the user types commands: a job of 5–10 s in a release build on a
    /// 2-core VM (π(2·10⁹) = 98,222,287), time enough to try the commands.
    static let interactiveLimit = 2_000_000_000
    /// The default limit with simulated input: about 3 s in a release build (π(10⁹) = 50,847,534),
    /// a few hundred input records.
    static let simulatedLimit = 1_000_000_000

    /// The result of parsing the command line.
    enum Parsed {
        case run(DemoOptions)
        case help
    }

    /// A command line that cannot be run: the message for stderr (exit status 2).
    struct UsageError: Error, CustomStringConvertible {
        let description: String
    }

    static let usage = """
        usage: mainspring-demo [options]

        Counts the primes below a limit on the main thread's event loop, fed in chunks by a
        Feeder, while commands typed on stdin are answered at once ('help' lists them).
        When stdin is not a terminal, simulated input drives the loop instead, and a fairness
        report is printed at the end.

          --limit <n>        count the primes below n (default \(grouped(interactiveLimit)) when
                             typing, \(grouped(simulatedLimit)) with simulated input; 1e9 works)
          --chunk <n>        numbers sieved per chunk (default 100,000; 1...\(grouped(DemoCommand.maxChunk)))
          --pacing one|budget
                             one chunk per loop turn, or chunks for up to 1 ms per turn (default)
          --naive            post every chunk at once with EventLoop.execute instead of feeding
                             them: timers (the progress display) wait behind the whole job, and
                             pause and chunk cannot work
          --interactive      read commands from stdin (the default when stdin is a terminal)
          --simulate         simulated input instead of stdin (the default otherwise)
          --json             with simulated input: print the report as JSON only
          --cancel-on-eof    at the end of stdin, cancel the job instead of waiting for it
          --help             this text

        Exit status: 0 when the job completed or was cancelled or quit on request, 1 when the
        demo could not run, 2 for a bad command line, 130 after Ctrl-C.
        """

    /// Parses the arguments (without the program name). `stdinIsTerminal` picks the default mode.
    static func parse(_ arguments: [String], stdinIsTerminal: Bool) -> Result<Parsed, UsageError> {
        var modeFlag: Mode?
        var limit: Int?
        var chunkSize: Int?
        var pacing: Feeder.Pacing?
        var naive = false
        var cancelOnEndOfInput = false
        var json = false
        var remaining = arguments[...]
        while let flag = remaining.popFirst() {
            func value() throws(UsageError) -> String {
                guard let value = remaining.popFirst() else { throw UsageError(description: "\(flag) needs a value") }
                return value
            }
            do throws(UsageError) {
                switch flag {
                case "--help", "-h":
                    return .success(.help)
                case "--limit":
                    limit = try number(try value(), for: flag, in: 2...1_000_000_000_000)
                case "--chunk":
                    chunkSize = try number(try value(), for: flag, in: 1...DemoCommand.maxChunk)
                case "--pacing":
                    switch try value() {
                    case "one": pacing = .oneChunkPerTurn
                    case "budget": pacing = .budget(.milliseconds(1))
                    case let other:
                        throw UsageError(description: "--pacing is 'one' or 'budget', not '\(other.prefix(40))'")
                    }
                case "--naive": naive = true
                case "--cancel-on-eof": cancelOnEndOfInput = true
                case "--json": json = true
                case "--interactive", "--simulate":
                    let mode: Mode = flag == "--simulate" ? .simulate : .interactive
                    if let modeFlag, modeFlag != mode {
                        throw UsageError(description: "--interactive and --simulate exclude each other")
                    }
                    modeFlag = mode
                default:
                    throw UsageError(description: "unknown option '\(flag.prefix(40))'")
                }
            } catch {
                return .failure(error)
            }
        }
        if json && modeFlag == .interactive {
            return .failure(UsageError(description: "--json is for simulated input (--simulate), not --interactive"))
        }
        if naive && pacing != nil {
            return .failure(UsageError(description: "--pacing has no effect with --naive (nothing is fed)"))
        }
        // --json asks for the simulated run's report, so it implies --simulate.
        let mode = modeFlag ?? (json || !stdinIsTerminal ? .simulate : .interactive)
        var options = DemoOptions(mode: mode, limit: limit ?? (mode == .simulate ? simulatedLimit : interactiveLimit))
        options.chunkSize = chunkSize ?? options.chunkSize
        options.pacing = pacing ?? options.pacing
        options.naive = naive
        options.cancelOnEndOfInput = cancelOnEndOfInput
        options.json = json
        return .success(.run(options))
    }

    /// A whole number in `range`: digits (with `_` or `,` between groups), or `<m>e<k>` such as
    /// `2e8`.
    private static func number(_ text: String, for flag: String, in range: ClosedRange<Int>) throws(UsageError) -> Int {
        let digits = text.filter { $0 != "_" && $0 != "," }
        var value = Int(digits)
        if value == nil {
            let parts = digits.lowercased().split(separator: "e", omittingEmptySubsequences: false)
            if parts.count == 2, let mantissa = Int(parts[0]), let exponent = Int(parts[1]), (0...18).contains(exponent) {
                var scaled = mantissa
                var overflow = false
                for _ in 0..<exponent where !overflow {
                    (scaled, overflow) = scaled.multipliedReportingOverflow(by: 10)
                }
                value = overflow ? nil : scaled
            }
        }
        guard let value, range.contains(value) else {
            throw UsageError(description: "\(flag) needs a whole number in \(grouped(range.lowerBound))...\(grouped(range.upperBound)), not '\(text.prefix(40))'")
        }
        return value
    }
}

extension Feeder.Pacing {
    /// `one` or `budget 1 ms`, as the demo prints it.
    var label: String {
        switch self {
        case .oneChunkPerTurn: return "one chunk per turn"
        case .budget(let budget): return "up to " + String(format: "%g", budget.milliseconds) + " ms of chunks per turn"
        }
    }

    /// `one` or `budget`, as the command line and the JSON spell it.
    var flagValue: String {
        switch self {
        case .oneChunkPerTurn: return "one"
        case .budget: return "budget"
        }
    }
}

extension Duration {
    /// The duration in milliseconds, as a `Double`.
    var milliseconds: Double { Double(components.seconds) * 1e3 + Double(components.attoseconds) / 1e15 }
    /// The duration in seconds, as a `Double`.
    var seconds: Double { milliseconds / 1e3 }
}

/// `1234567` as `1,234,567`.
func grouped(_ number: Int) -> String {
    let digits = String(number.magnitude)
    var result = ""
    for (index, digit) in digits.enumerated() {
        if index > 0 && (digits.count - index) % 3 == 0 { result.append(",") }
        result.append(digit)
    }
    return number < 0 ? "-" + result : result
}
