import Foundation
#if canImport(Glibc)
import Glibc
#endif
import KVService
import Mainspring
@_spi(Simulation) import MainspringCore
import MainspringHTTP
import MainspringTLS
import MainspringTesting

/// Bad input against every parser the library ships that runs on the simulated network: runs of
/// random bytes ("junk": newlines, NULs, invalid UTF-8 among them) slipped between the segments
/// of streams split as the seed chooses (often one byte at a time), in both directions, for a
/// simulated minute — what `mainspring-bench simulation-junk` runs over many seeds, and the
/// tests over a few. Each parser has its own simulation and oracle:
///
/// - ``Parser/lines``: `Connection.readLines` (64-byte lines). Every event is a line, invalid
///   UTF-8 or a line too long — never an error; the lines junk did not touch arrive whole and
///   in order (a run of junk touches at most two); both ends stay open.
/// - ``Parser/frames``: `read(until:limit:)` for a `#` that starts a frame and for its decimal
///   length line, then `read(exactly:)` for the payload (which has no `#`: after junk, the
///   reader skips to the next one). Every byte is accounted for: what the reader consumed plus what the writer
///   drained equals what was sent plus the junk; frames untouched arrive whole and in order.
/// - ``Parser/resp``: the KV server (`KVServer`) with clients sending `SET`/`GET` in RESP. The
///   server answers or refuses (`-ERR Protocol error`, then closes), never crashes; once the
///   junk stops, a new client is served exactly (`PING`, `SET`, `GET`).
/// - ``Parser/http``: `HTTPClient` against a scripted upstream. Every request ends — a response
///   or a clear `HTTPClientError` (malformed status line or header, a bad length, a response
///   timeout) — and once the junk stops, a request gets its exact response.
/// - ``Parser/tls``: TLS (`MainspringTLS`, real OpenSSL over the simulated bytes) under a line
///   echo. Junk must never reach the application: every line either side reads is exactly one
///   that was sent, and each connection junk touched ends with a clear reason (the TLS layer's
///   account — a bad record MAC, a wrong version number —, a handshake that fails, or the idle
///   timeout); once the junk stops, a new connection echoes exactly. Needs a certificate for
///   `localhost` (`run(_:seed:duration:certificate:)`).
/// - ``Parser/httpServer``: `HTTPServer` (its connection engine on the simulated network) with
///   three `HTTPClient`s posting bodies to an echo route, junk landing inside heads and bodies
///   (and inside the answers: the client's parser meets it too). Every request ends — an
///   answer (the echo, or a refusal: `400`, `413`, `417`, `431`, `501`, a `404`/`405` for a path
///   or method junk made) or a clear
///   `HTTPClientError` —, the server has nothing in flight at the end, and once the junk stops a
///   new request is echoed exactly.
///
/// In each, every stream is closed at the end (no leak). A failure names the parser and the seed
/// that replays it.
public enum JunkSoak {
    /// A parser under junk.
    public enum Parser: String, Sendable, CaseIterable {
        case lines, frames, resp, http, tls
        case httpServer = "http_server"
    }

    /// A certificate and its key, in PEM files, for the ``Parser/tls`` run: the server's, for
    /// `localhost`; the client trusts it (self-signed) or its issuer (`trustedCertificateFile`).
    public struct Certificate: Sendable {
        public var certificateFile: String
        public var keyFile: String
        /// What the client trusts: the certificate itself (nil), or its issuer's.
        public var trustedCertificateFile: String?

        public init(certificateFile: String, keyFile: String, trustedCertificateFile: String? = nil) {
            self.certificateFile = certificateFile
            self.keyFile = keyFile
            self.trustedCertificateFile = trustedCertificateFile
        }
    }

    /// Why a run could not start.
    public struct SetupError: Error, CustomStringConvertible {
        public let description: String
    }

    /// What one or more runs found.
    public struct Result: Sendable {
        public var runs = 0
        /// Runs of junk slipped in, and their bytes.
        public var junkRuns = 0
        public var junkBytes = 0
        /// What the parser reported, by kind ("line", "invalid UTF-8", "malformed status line", …).
        public var outcomes: [String: Int] = [:]
        /// Units the oracle checked whole (lines, frames, replies, responses).
        public var intact = 0
        public var leakedSources = 0
        public var virtualSeconds = 0.0
        /// What the oracle found wrong, each with its parser and seed.
        public var failures: [String] = []

        public init() {}

        public mutating func add(_ other: Result) {
            runs += other.runs
            junkRuns += other.junkRuns
            junkBytes += other.junkBytes
            outcomes.merge(other.outcomes, uniquingKeysWith: +)
            intact += other.intact
            leakedSources += other.leakedSources
            virtualSeconds += other.virtualSeconds
            failures += other.failures
        }
    }

    /// Runs `parser` under junk for `duration` with `seed` (see the type's description).
    /// `certificate` is needed by ``Parser/tls`` only (the others ignore it).
    public static func run(_ parser: Parser, seed: UInt64, duration: Duration = .seconds(60),
                           certificate: Certificate? = nil) throws -> Result
    {
        let simulation = try Simulation(seed: seed)
        simulation.isTracing = false
        var generator = SplitMix64(seed: seed ^ 0x4A55_4E4B)
        let network = simulation.network
        network.latency = .microseconds(50 + Int64(generator.next() % 2_000))
        network.maxSegmentSize = generator.next() % 3 == 0 ? 1 : 1 + Int(generator.next() % 32)
        let run = Run(parser: parser, seed: seed, simulation: simulation)
        switch parser {
        case .lines: try run.lines(duration: duration)
        case .frames: try run.frames(duration: duration)
        case .resp: try run.resp(duration: duration)
        case .http: try run.http(duration: duration)
        case .httpServer: try run.httpServer(duration: duration)
        case .tls:
            guard let certificate else { throw SetupError(description: "the tls parser's run needs a certificate for localhost") }
            try run.tls(duration: duration, certificate: certificate)
        }
        simulation.advance(by: .seconds(5))
        run.result.runs = 1
        run.result.junkRuns = network.faults["junk"] ?? 0
        run.result.junkBytes = network.junkBytes
        run.result.leakedSources = network.openStreamEnds
        if run.result.leakedSources > 0 { run.fail("\(run.result.leakedSources) stream ends still open at the end") }
        if run.result.junkRuns == 0 { run.fail("no junk was injected") }
        run.result.virtualSeconds = Double(simulation.now.components.seconds)
        return run.result
    }

    /// One parser's run: its state, on the simulation's driving thread.
    final class Run: @unchecked Sendable {
        let parser: Parser
        let seed: UInt64
        let simulation: Simulation
        var result = Result()

        init(parser: Parser, seed: UInt64, simulation: Simulation) {
            self.parser = parser
            self.seed = seed
            self.simulation = simulation
        }

        func fail(_ what: String) { result.failures.append("\(parser.rawValue), seed \(seed): \(what)") }
        func count(_ outcome: String) { result.outcomes[outcome, default: 0] += 1 }

        /// Runs `count` client tasks on the simulation's loop, each until it returns the counts
        /// of its outcomes, and adds them up. On the driving thread.
        func runClients(_ count: Int, _ body: @escaping @Sendable (Int) async -> [String: Int]) throws -> [String: Int] {
            let loop = simulation.loop
            return try simulation.runSynchronously { () async -> [String: Int] in
                await withTaskGroup(of: [String: Int].self) { group in
                    for client in 0..<count { group.addTask(executorPreference: loop) { await body(client) } }
                    var all: [String: Int] = [:]
                    for await outcomes in group { all.merge(outcomes, uniquingKeysWith: +) }
                    return all
                }
            }
        }

        /// Junk between the simulation's hosts for `duration` (about one run every two seconds).
        func injectJunk(for duration: Duration, hosts: [String] = ["127.0.0.1"]) {
            simulation.network.injectFaults(junkPerMinute: 30, between: hosts, for: duration)
        }

        // MARK: Lines

        func lines(duration: Duration) throws {
            let loop = simulation.loop
            let (writer, reader) = try Connection.makePair(on: loop, options: .init(maxLineLength: 64))
            var received: [LineEvent] = []
            reader.readLines { received.append($0) }
            writer.readBytes { _ in }  // junk the other way is read and dropped
            injectJunk(for: duration)
            var sent = 0
            // Each line in two writes 10 ms apart, so that junk lands inside lines too.
            let ticks = loop.schedule(every: .milliseconds(50)) { _ in
                writer.write("line \(sent)")
                _ = loop.schedule(after: .milliseconds(10)) { writer.write("\n") }
                sent += 1
            }
            simulation.advance(by: duration)
            ticks.cancel()
            simulation.advance(by: .seconds(1))
            var intact: [Int] = []
            for event in received {
                switch event {
                case .line(let text):
                    count("line")
                    if text.hasPrefix("line "), let index = Int(text.dropFirst(5)), index < sent { intact.append(index) }
                case .invalidUTF8: count("invalid UTF-8")
                case .tooLong: count("too long")
                default: fail("unexpected \(event)")
                }
            }
            if intact != intact.sorted() || Set(intact).count != intact.count { fail("lines out of order or twice") }
            let junk = simulation.network.faults["junk"] ?? 0
            if intact.count < sent - 2 * junk { fail("\(sent) sent, \(intact.count) whole, \(junk) runs of junk") }
            if !writer.isOpen || !reader.isOpen { fail("a connection closed") }
            result.intact += intact.count
            writer.close()
            reader.close()
        }

        // MARK: Length-prefixed frames

        static func payload(_ index: Int) -> [UInt8] {
            Array("frame \(index) ".utf8) + [UInt8](repeating: UInt8(ascii: "a") + UInt8(index % 26), count: index % 40)
        }

        func frames(duration: Duration) throws {
            let loop = simulation.loop
            let (writer, reader) = try Connection.makePair(on: loop)
            var drained = 0
            writer.readBytes { input in
                if case .bytes(let bytes) = input { drained += bytes.count }
            }
            injectJunk(for: duration)
            var sentBytes = 0
            var sentFrames = 0
            let ticks = loop.schedule(every: .milliseconds(50)) { _ in
                let payload = Self.payload(sentFrames)
                let frame = Array("#\(payload.count)\n".utf8) + payload
                // In two writes 10 ms apart, so that junk lands inside frames too.
                let half = frame.count / 2
                writer.write(Array(frame[..<half]))
                _ = loop.schedule(after: .milliseconds(10)) { writer.write(Array(frame[half...])) }
                sentBytes += frame.count
                sentFrames += 1
            }
            // The last frame is out by `duration` (its second half 10 ms later); the writer closes after.
            _ = loop.schedule(after: duration) { ticks.cancel() }
            _ = loop.schedule(after: duration + .seconds(1)) { writer.close() }
            let outcome = try simulation.runSynchronously { () async -> (consumed: Int, intact: [Int], outcomes: [String: Int], error: String?) in
                var consumed = 0
                var intact: [Int] = []
                var outcomes: [String: Int] = [:]
                do throws(Connection.CloseReason) {
                    reading: while true {
                        // Up to the next frame's `#`: nothing before it, unless junk or the rest of
                        // a frame junk broke.
                        guard let sync = try await reader.read(until: [UInt8(ascii: "#")], limit: 4_096) else { break reading }
                        switch sync {
                        case .tooLong:
                            guard let skipped = try await reader.read(upTo: 4_096) else { break reading }
                            consumed += skipped.count
                            outcomes["skipped", default: 0] += 1
                            continue reading
                        case .found(let bytes):
                            consumed += bytes.count + 1
                            if !bytes.isEmpty { outcomes["skipped", default: 0] += 1 }
                        }
                        guard let header = try await reader.read(until: [0x0A], limit: 8) else { break reading }
                        guard case .found(let digits) = header else {
                            outcomes["header too long", default: 0] += 1
                            continue reading  // the search for the next `#` takes it
                        }
                        consumed += digits.count + 1
                        guard let length = Int(String(decoding: digits, as: UTF8.self)), (0...4_096).contains(length) else {
                            outcomes["bad length", default: 0] += 1
                            continue reading
                        }
                        guard let payload = try await reader.read(exactly: length) else { break reading }
                        consumed += payload.count
                        let words = String(decoding: payload.prefix(16), as: UTF8.self).split(separator: " ")
                        if words.count >= 2, words[0] == "frame", let index = Int(words[1]), payload == Self.payload(index) {
                            intact.append(index)
                            outcomes["frame", default: 0] += 1
                        } else {
                            outcomes["altered frame", default: 0] += 1
                        }
                    }
                    // The end came mid-frame or mid-header: what is left is still there.
                    while let rest = try await reader.read(upTo: 65_536) { consumed += rest.count }
                } catch {
                    return (consumed, intact, outcomes, "\(error)")
                }
                return (consumed, intact, outcomes, nil)
            }
            if let error = outcome.error { fail("the reader failed: \(error)") }
            result.outcomes.merge(outcome.outcomes, uniquingKeysWith: +)
            let junkBytes = simulation.network.junkBytes
            if outcome.consumed + drained != sentBytes + junkBytes {
                fail("bytes: read \(outcome.consumed) + drained \(drained) != sent \(sentBytes) + junk \(junkBytes)")
            }
            if outcome.intact != outcome.intact.sorted() || Set(outcome.intact).count != outcome.intact.count {
                fail("frames out of order or twice")
            }
            let junk = simulation.network.faults["junk"] ?? 0
            if outcome.intact.count < sentFrames - 3 * junk {
                fail("\(sentFrames) frames sent, \(outcome.intact.count) whole, \(junk) runs of junk")
            }
            result.intact += outcome.intact.count
            reader.close()
        }

        // MARK: RESP (the KV server)

        func resp(duration: Duration) throws {
            let server = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
            var options = KVServerOptions()
            options.host = "0.0.0.0"
            options.port = 6379
            let kv = try KVServer(group: server, options: options)
            injectJunk(for: duration, hosts: ["127.0.0.1", "10.0.0.1"])
            let loop = simulation.loop
            let stopAt = simulation.now + duration
            let simulation = self.simulation
            let outcomes = try runClients(4) { client in
                var outcomes: [String: Int] = [:]
                var round = 0
                while simulation.now < stopAt {
                    // A command junk left unfinished keeps the server waiting for its
                    // rest: the idle timeout ends such a connection. A connect that
                    // fails is counted (its reason is not the oracle's business), and
                    // the client tries again.
                    guard let connection = try? await Connection.connect(to: "10.0.0.1", port: 6379, on: loop,
                                                                         options: .init(idleTimeout: .seconds(2)))
                    else {
                        outcomes["connect failed", default: 0] += 1
                        try? await loop.sleep(for: .milliseconds(200))  // throws only if cancelled: nothing cancels it
                        continue
                    }
                    do throws(Connection.CloseReason) {
                        while simulation.now < stopAt {
                            round += 1
                            // The commands in two writes 20 ms apart: junk lands inside them too.
                            let commands = Array((FaultSoak.resp(["SET", "k\(client)", "v\(round)"])
                                    + FaultSoak.resp(["GET", "k\(client)"])).utf8)
                            try await connection.send(Array(commands[..<(commands.count / 2)]))
                            try? await loop.sleep(for: .milliseconds(20))  // throws only if cancelled: nothing cancels it
                            try await connection.send(Array(commands[(commands.count / 2)...]))
                            for _ in 0..<3 {
                                guard let event = try await connection.readLine() else { throw .closed }
                                switch event {
                                case .line(let text):
                                    let kind = text.hasPrefix("-") ? "error reply" : text.hasPrefix("+") ? "status reply"
                                        : text.hasPrefix("$") ? "bulk reply" : "other line"
                                    outcomes[kind, default: 0] += 1
                                case .endOfFile: throw .closed
                                default: outcomes["unparsable reply", default: 0] += 1
                                }
                            }
                            try? await loop.sleep(for: .milliseconds(200))  // throws only if cancelled: nothing cancels it
                        }
                    } catch {
                        outcomes["connection ended", default: 0] += 1
                    }
                    connection.close()
                }
                return outcomes
            }
            result.outcomes.merge(outcomes, uniquingKeysWith: +)
            simulation.advance(by: .seconds(2))  // the junk has stopped: a new client is served exactly
            // Any failure here (connect, send, read) shows as lines missing from `check`, which
            // the oracle reports: the errors themselves need no handling.
            let check = try simulation.runSynchronously { () async -> [String] in
                guard let connection = try? await Connection.connect(to: "10.0.0.1", port: 6379, on: loop) else { return ["no connection"] }
                defer { connection.close() }
                try? await connection.send("PING\r\n" + FaultSoak.resp(["SET", "check", "fine"]) + FaultSoak.resp(["GET", "check"]))
                var lines: [String] = []
                while lines.count < 4, case .line(let text)? = try? await connection.readLine() { lines.append(text) }
                return lines
            }
            if check == ["+PONG", "+OK", "$4", "fine"] { result.intact += 1 } else { fail("after the junk, a new client got \(check)") }
            kv.close()
        }

    }

    /// A TLS connection's end, for the outcome counts: OpenSSL's reason for a TLS failure, or
    /// the plain reason.
    static func kind(of reason: Connection.CloseReason) -> String {
        switch reason {
        case .tlsFailed(.protocolError(let text)): "tls: \(text)"
        case .error(ECONNRESET): "reset"
        case .error(let code): "error \(code)"
        case .idleTimeout: "idle timeout"
        case .closed: "end of input"
        case .cancelled: "cancelled"
        default: "other: \(reason)"
        }
    }

    /// An HTTP client error's kind, for the outcome counts: the parser's clear errors by name,
    /// anything else as "other: …" (which the oracle reports).
    static func kind(of error: HTTPClientError) -> String {
        switch error {
        case .malformedStatusLine: "malformed status line"
        case .malformedHeader: "malformed header"
        case .malformedChunk: "malformed chunk"
        case .invalidContentLength: "invalid content length"
        case .headersTooLarge: "headers too large"
        case .bodyTooLarge: "body too large"
        case .closedMidResponse: "closed mid-response"
        case .responseTimeout: "response timeout"
        case .sendFailed: "send failed"
        case .tooManyInterimResponses: "too many interim responses"
        case .connectFailed, .connectTimeout: "connect failed"
        default: "other: \(error)"
        }
    }
}
