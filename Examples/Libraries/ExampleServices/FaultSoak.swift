import Foundation
import KVService
import Mainspring
@_spi(Simulation) import MainspringCore
import MainspringTesting

/// The line service and the Redis-protocol server (`mainspring-kv`'s `KVServer`) under a random
/// fault schedule on the simulation's network, checked end to end by an oracle: what
/// `mainspring-bench simulation-faults` runs over many seeds, and the tests over a few.
///
/// One seed: a simulation whose latency and segment size the seed chooses; the service on a
/// host of two loops; `clients` clients on another host, each sending requests one at a time
/// with a think time between them, reconnecting after a reset; resets of single streams and
/// partitions between the two hosts injected at random for `duration`; then every client
/// finishes its last request and closes, the service shuts down. A request is `ECHO <tag>` to
/// the line service; to the KV server, `SET c<client> <tag>` and `GET c<client>` as RESP arrays
/// in one write (replies `+OK`, then the bulk string `<tag>`: the keyspace answers with what
/// this client's request stored). The oracle: every reply a client receives is the one its
/// outstanding request expects, exactly once and in order; a request left without a reply was
/// on a connection that failed (a reset); every stream is closed at the end.
public enum FaultSoak {
    /// The service a soak runs against.
    public enum Service: String, Sendable, CaseIterable {
        /// The line service (`LineService`), `ECHO` requests.
        case lineService = "line service"
        /// The Redis-protocol server (`KVServer`), `SET` and `GET` in RESP.
        case kv = "kv"
    }

    /// `arguments` as a RESP command: an array of bulk strings, as Redis clients send them.
    public static func resp(_ arguments: [String]) -> String {
        arguments.reduce("*\(arguments.count)\r\n") { $0 + "$\($1.utf8.count)\r\n\($1)\r\n" }
    }

    /// What one or more seeds found.
    public struct Result: Sendable {
        public var seeds = 0
        /// Faults injected, by kind ("reset", "partition").
        public var faults: [String: Int] = [:]
        /// Requests sent, and replies received as expected.
        public var requests = 0
        public var replies = 0
        /// Requests without a reply on a connection that did not fail.
        public var lost = 0
        /// Replies that came again, or with no request outstanding.
        public var duplicated = 0
        /// Replies that were not the one the outstanding request expects.
        public var reordered = 0
        /// Requests whose connection was reset before the reply (allowed).
        public var cutByReset = 0
        /// Stream ends still open after everything closed.
        public var leakedSources = 0
        public var virtualSeconds = 0.0
        /// What went wrong, one line each, naming the seed that replays it (at most 20 kept).
        public var failures: [String] = []

        public init() {}

        public mutating func add(_ other: Result) {
            seeds += other.seeds
            for (kind, count) in other.faults { faults[kind, default: 0] += count }
            requests += other.requests
            replies += other.replies
            lost += other.lost
            duplicated += other.duplicated
            reordered += other.reordered
            cutByReset += other.cutByReset
            leakedSources += other.leakedSources
            virtualSeconds += other.virtualSeconds
            failures += other.failures.prefix(max(0, 20 - failures.count))
        }
    }

    /// Runs one seed against the line service (see the type's description).
    public static func runLineService(seed: UInt64, clients: Int = 200, duration: Duration = .seconds(60)) throws -> Result {
        try run(.lineService, seed: seed, clients: clients, duration: duration)
    }

    /// Runs one seed against the KV server (see the type's description).
    public static func runKVService(seed: UInt64, clients: Int = 200, duration: Duration = .seconds(60)) throws -> Result {
        try run(.kv, seed: seed, clients: clients, duration: duration)
    }

    /// Runs one seed against `service` (see the type's description).
    public static func run(_ service: Service, seed: UInt64, clients: Int = 200, duration: Duration = .seconds(60)) throws -> Result {
        let simulation = try Simulation(seed: seed)
        simulation.isTracing = false
        var choices = Choices(seed: seed)
        let network = simulation.network
        network.latency = .microseconds(50 + Int64(choices.next(5_000)))
        network.maxSegmentSize = choices.next(4) == 0 ? nil : 1 + choices.next(64)
        let serverHost = "10.0.0.1"
        let server = try simulation.makeGroup(loopCount: 2, host: serverHost)
        let shutdown: () -> Void
        switch service {
        case .lineService:
            let lines = try LineService(group: server, host: "0.0.0.0", port: 7000, options: .init(idleTimeout: nil))
            shutdown = { _ = lines.shutdown(gracePeriod: .seconds(5)) }
        case .kv:
            var options = KVServerOptions()
            options.host = "0.0.0.0"
            options.port = 7000
            let kv = try KVServer(group: server, options: options)
            shutdown = { kv.close() }
        }
        network.injectFaults(resetsPerMinute: 20, partitionsPerMinute: 4, partitionDuration: .seconds(3),
                             between: ["127.0.0.1", serverHost], for: duration)
        let end = simulation.now + duration
        var result = Result()
        result.seeds = 1
        let oracle = Oracle(seed: seed, service: service)
        var drivers: [ClientDriver] = []
        for index in 0..<clients {
            let driver = ClientDriver(index: index, service: service, loop: simulation.loop, host: serverHost, oracle: oracle,
                                      simulation: simulation, stopAt: end, seed: seed &+ UInt64(index) &* 7919)
            drivers.append(driver)
            simulation.loop.execute { driver.start() }
        }
        simulation.advance(by: duration)
        // No more faults; every partition is healed: the requests in flight finish.
        simulation.advance(by: .seconds(30))
        for driver in drivers { driver.finish() }
        simulation.advance(by: .seconds(5))
        shutdown()
        simulation.advance(by: .seconds(5))
        result.faults = network.faults
        result.requests = oracle.requests
        result.replies = oracle.replies
        result.lost = oracle.lost
        result.duplicated = oracle.duplicated
        result.reordered = oracle.reordered
        result.cutByReset = oracle.cutByReset
        result.leakedSources = network.openStreamEnds
        if result.leakedSources > 0 { oracle.fail("\(result.leakedSources) stream ends still open at the end") }
        result.failures = oracle.failures
        result.virtualSeconds = Double(simulation.now.components.seconds)
        return result
    }

    /// The seed's own choices (latency, segments, think times), from the library's seeded
    /// generator (the one the simulation itself uses), on a stream of their own.
    struct Choices {
        private var generator: SplitMix64
        init(seed: UInt64) { generator = SplitMix64(seed: seed ^ 0x5EED_FA17) }
        mutating func next(_ bound: Int) -> Int { Int(generator.next() % UInt64(max(1, bound))) }
    }

    /// Counts what the clients saw. Used on the simulation's thread only.
    final class Oracle: @unchecked Sendable {
        let seed: UInt64
        let service: Service
        var requests = 0
        var replies = 0
        var lost = 0
        var duplicated = 0
        var reordered = 0
        var cutByReset = 0
        var failures: [String] = []

        init(seed: UInt64, service: Service) {
            self.seed = seed
            self.service = service
        }

        func fail(_ what: String) {
            if failures.count < 20 { failures.append("\(service.rawValue), seed \(seed): \(what)") }
        }
    }

    /// One client: connects, sends its request for tag `c<index>-<n>` and waits for its reply,
    /// thinks, sends the next; after a reset it reconnects and goes on with the next number.
    final class ClientDriver: @unchecked Sendable {
        let index: Int
        let service: Service
        let loop: EventLoop
        let host: String
        let oracle: Oracle
        let simulation: Simulation
        let stopAt: Duration
        private var choices: Choices
        private var connection: Connection?
        private var next = 0
        /// The reply lines the outstanding request still expects, in order; the last is its tag.
        private var expectedLines: ArraySlice<String> = []
        /// The tag of the outstanding request.
        var outstanding: String? { expectedLines.last }
        private var answered: Set<String> = []
        private var stopped = false
        private var sentAt = Duration.zero

        init(index: Int, service: Service, loop: EventLoop, host: String, oracle: Oracle, simulation: Simulation,
             stopAt: Duration, seed: UInt64)
        {
            self.index = index
            self.service = service
            self.loop = loop
            self.host = host
            self.oracle = oracle
            self.simulation = simulation
            self.stopAt = stopAt
            choices = Choices(seed: seed)
        }

        func start() {
            loop.schedule(after: .milliseconds(choices.next(1_000))) { [self] in connect() }
        }

        private func connect() {
            guard !stopped else { return }
            let made: Connection
            do {
                made = try Connection.startConnecting(to: host, port: 7000, on: loop)
            } catch {
                oracle.fail("client \(index): connect threw \(error)")
                return
            }
            connection = made
            made.readLines { [self, weak made] event in
                guard let made, made === connection else { return }
                switch event {
                case .line(let text): received(text)
                case .endOfFile, .error: break
                case .tooLong, .invalidUTF8: oracle.fail("client \(index): a reply that is not a line: \(event)")
                }
            }
            made.onClose { [self, weak made] reason in
                guard let made, made === connection else { return }
                connectionClosed(reason)
            }
            send()
        }

        private func send() {
            guard let connection, !stopped, outstanding == nil else { return }
            let tag = "c\(index)-\(next)"
            next += 1
            sentAt = simulation.now
            oracle.requests += 1
            switch service {
            case .lineService:
                expectedLines = [tag]
                connection.writeLine("ECHO \(tag)")
            case .kv:
                expectedLines = ["+OK", "$\(tag.utf8.count)", tag]
                connection.write(FaultSoak.resp(["SET", "c\(index)", tag]) + FaultSoak.resp(["GET", "c\(index)"]))
            }
        }

        private func received(_ text: String) {
            guard let expected = expectedLines.first else {
                oracle.duplicated += 1
                oracle.fail("client \(index): reply \(text) with no request outstanding")
                return
            }
            guard text == expected else {
                if answered.contains(text) {
                    oracle.duplicated += 1
                    oracle.fail("client \(index): reply \(text) again")
                } else {
                    oracle.reordered += 1
                    oracle.fail("client \(index): reply \(text) while \(expected) was expected")
                }
                return
            }
            expectedLines.removeFirst()
            guard expectedLines.isEmpty else { return }  // more lines of this reply to come
            oracle.replies += 1
            answered.insert(text)
            guard simulation.now < stopAt else { return }
            loop.schedule(after: .milliseconds(100 + choices.next(2_000))) { [self] in send() }
        }

        private func connectionClosed(_ reason: Connection.CloseReason) {
            connection = nil
            if let tag = outstanding {
                expectedLines = []
                switch reason {
                case .error(ECONNRESET): oracle.cutByReset += 1
                case .connectFailed: oracle.cutByReset += 1  // never sent: refused or reset while connecting
                default:
                    oracle.lost += 1
                    oracle.fail("client \(index): \(tag) lost, the connection closed: \(reason)")
                }
            }
            guard !stopped, simulation.now < stopAt else { return }
            loop.schedule(after: .milliseconds(100)) { [self] in connect() }
        }

        /// Stops sending and closes the connection.
        func finish() {
            stopped = true
            let open = connection
            connection = nil
            if let tag = outstanding {
                expectedLines = []
                oracle.lost += 1
                let state = open.map { "open \($0.isOpen), \($0.bufferedOutputBytes) bytes unsent, since \(sentAt)" } ?? "none"
                oracle.fail("client \(index): \(tag) never answered (connection: \(state))")
            }
            open?.close()
        }
    }
}
