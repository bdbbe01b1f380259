import KVCore
import MainspringTestSupport

/// A settable clock for the KV core tests (Unix milliseconds).
final class KVTestClock {
    var now: Int64 = 1_700_000_000_000
}

/// A core, one client session and an output buffer: runs commands and returns their replies.
final class KVTestClient {
    let clock = KVTestClock()
    let core: KVCore
    var session: KVSession

    init(configuration: KVConfiguration = KVConfiguration()) {
        let clock = self.clock
        core = KVCore(configuration: configuration, clock: { clock.now })
        session = core.makeSession()
    }

    /// Runs one command; a sliced reply is run to its end in slices of `budget`.
    func execute(_ arguments: [[UInt8]], budget: Int = 7) -> (reply: String, sliced: Bool, close: Bool) {
        var output: [UInt8] = []
        switch core.execute(arguments, session: &session, into: &output) {
        case .replied:
            return (kvText(output), false, false)
        case .close:
            return (kvText(output), false, true)
        case .sliced(var reply):
            while !reply.step(budget: budget, into: &output) {}
            return (kvText(output), true, false)
        }
    }

    /// The reply to `words` (each a UTF-8 argument), as text.
    @discardableResult
    func callAsFunction(_ words: String...) -> String {
        execute(words.map { Array($0.utf8) }).reply
    }

    /// The reply to binary arguments.
    @discardableResult
    func run(_ arguments: [[UInt8]]) -> String {
        execute(arguments).reply
    }
}

/// Bytes shown as text (invalid UTF-8 is replaced; tests use ASCII or compare bytes).
func kvText(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

func kvBytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// The multibulk encoding of a command.
func kvEncode(_ words: [String]) -> [UInt8] {
    var out = kvBytes("*\(words.count)\r\n")
    for word in words { out += kvBytes("$\(word.utf8.count)\r\n\(word)\r\n") }
    return out
}

/// The events a parser yields for `chunks` fed one after the other.
func kvParse(_ chunks: [[UInt8]], limits: RESPParser.Limits = RESPParser.Limits()) -> [RESPParser.Event] {
    var parser = RESPParser(limits: limits)
    var events: [RESPParser.Event] = []
    for chunk in chunks {
        parser.append(contentsOf: chunk)
        while let event = parser.next() { events.append(event) }
    }
    return events
}

func kvCommand(_ words: String...) -> RESPParser.Event {
    .command(words.map { Array($0.utf8) })
}

func kvProtocolError(_ message: String) -> RESPParser.Event {
    .protocolError(RESPParser.ProtocolError(message: "ERR Protocol error: " + message))
}
