#if canImport(Glibc)
import Glibc
#endif

/// One `--flag value` pair of an example executable's command line, as `forEachFlag` hands it
/// over.
public struct CommandLineFlag {
    /// The flag as written (`--port`).
    public let name: String
    /// The argument that follows it.
    public let value: String
    private let fail: (String) -> Never

    init(name: String, value: String, fail: @escaping (String) -> Never) {
        self.name = name
        self.value = value
        self.fail = fail
    }

    /// The value as a whole number in `range`; anything else ends the program through the
    /// `fail` given to `forEachFlag`, with "<flag> needs a number in <range>, not '<value>'".
    public func number(_ range: ClosedRange<Int>) -> Int {
        guard let n = Int(value), range.contains(n) else { fail("\(name) needs a number in \(range), not '\(value)'") }
        return n
    }
}

/// Reads `arguments` as `--flag value` pairs, in order, and calls `body` with each: the command
/// line of `mainspring-daemon` and `mainspring-kv`. `--help` or `-h` calls `help`, then exits
/// with status 0; a flag with no value after it calls `fail` with "<flag> needs a value". `body`
/// takes each flag's value (or rejects the flag through `fail`).
public func forEachFlag(
    in arguments: [String], help: () -> Void, fail: @escaping (String) -> Never,
    _ body: (CommandLineFlag) -> Void
) {
    var arguments = arguments[...]
    while let flag = arguments.popFirst() {
        if flag == "--help" || flag == "-h" {
            help()
            exit(0)
        }
        guard let value = arguments.popFirst() else { fail("\(flag) needs a value") }
        body(CommandLineFlag(name: flag, value: value, fail: fail))
    }
}
