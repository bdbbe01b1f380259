import ExampleServices
import Foundation
import Synchronization

/// simulation-junk: bad input, measured. Every parser that runs on the simulated network —
/// lines, length-prefixed frames (`read(until:)` and `read(exactly:)`), RESP (the KV server),
/// HTTP responses (`HTTPClient`), HTTP requests (`HTTPServer`) and TLS records (`MainspringTLS`, with a certificate the openssl
/// command makes; left out, saying so, without it) — fed runs of random bytes slipped between segments the seed
/// sizes, for a simulated minute per seed (`ExampleServices.JunkSoak`), each checked by its
/// oracle: clear events and errors only, every byte accounted for, the intact units whole and in
/// order, a clean exchange once the junk stops, nothing leaked.
///
/// `--seeds N` (default 100; shared with simulation-faults) seeds, 0 to N-1, each against every
/// parser (or those `--parsers lines,http_server` names); `--runs` is ignored. A failure prints the parser and the seed that replays it
/// (`JunkSoak.run(_:seed:)`). Not a timing benchmark. A smoke run: one seed (unless `--seeds`),
/// 10 simulated seconds of junk (about five runs of it per parser).
let simulationJunkScenario = Scenario(
    name: "simulation-junk",
    summary: "lines, frames, RESP, HTTP (client and server) and TLS under random junk bytes for a simulated minute per seed (--seeds N): failures"
) { _ in
    let seeds = simulationFaultSeeds.withLock { $0 } ?? sized(100, smoke: 1)
    let duration = sized(Duration.seconds(60), smoke: .seconds(10))
    var parsers = simulationJunkParsers.withLock { $0 }
    // TLS's server certificate (self-signed, for localhost) comes from the openssl command.
    var certificate: BenchCertificate?
    if let openssl = findExecutable("openssl") {
        certificate = try BenchCertificate(openssl: openssl)
    } else {
        parsers.removeAll { $0 == .tls }
        FileHandle.standardError.write(Data("simulation-junk: tls left out: no openssl command to make its certificate\n".utf8))
    }
    defer { certificate?.remove() }
    let files = certificate.map { JunkSoak.Certificate(certificateFile: $0.certificate, keyFile: $0.key) }
    var byParser: [JunkSoak.Parser: JunkSoak.Result] = [:]
    let (crashes, real) = forEachSeed(seeds, of: parsers, scenario: "simulation-junk") { parser, seed in
        byParser[parser, default: JunkSoak.Result()].add(try JunkSoak.run(parser, seed: seed, duration: duration, certificate: files))
    }
    var total = JunkSoak.Result()
    for parser in parsers { total.add(byParser[parser] ?? JunkSoak.Result()) }
    for failure in total.failures {
        FileHandle.standardError.write(Data("simulation-junk: \(failure)\n".utf8))
    }
    for parser in parsers {
        let outcomes = (byParser[parser]?.outcomes ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
        FileHandle.standardError.write(Data("simulation-junk: \(parser.rawValue): \(outcomes.joined(separator: ", "))\n".utf8))
    }
    var perParser: [(String, Double)] = []
    for parser in parsers {
        let result = byParser[parser] ?? JunkSoak.Result()
        perParser += [
            ("\(parser.rawValue)_junk_runs", Double(result.junkRuns)),
            ("\(parser.rawValue)_intact", Double(result.intact)),
            ("\(parser.rawValue)_failures", Double(result.failures.count)),
        ]
    }
    var samples = Samples()
    samples.add("mainspring", [
        ("seeds", Double(seeds)),
        ("junk_runs", Double(total.junkRuns)),
        ("junk_bytes", Double(total.junkBytes)),
        ("intact", Double(total.intact)),
        ("failures", Double(total.failures.count)),
        ("leaked_sources", Double(total.leakedSources)),
        ("crashes", Double(crashes)),
        ("virtual_s", total.virtualSeconds),
        ("real_s", real),
        ("virtual_per_real", total.virtualSeconds / max(real, 1e-9)),
    ] + perParser)
    return samples.records(scenario: "simulation-junk")
}

/// The parsers `simulation-junk` runs (`--parsers`): all by default.
let simulationJunkParsers = Mutex(JunkSoak.Parser.allCases)

/// Sets `simulationJunkParsers` from `--parsers`' comma-separated names.
func chooseJunkParsers(_ list: String) throws {
    var chosen: [JunkSoak.Parser] = []
    for name in list.split(separator: ",") {
        guard let parser = JunkSoak.Parser(rawValue: String(name)) else {
            let known = JunkSoak.Parser.allCases.map(\.rawValue).joined(separator: ", ")
            throw BenchError.usage("--parsers: no parser '\(name)' (known: \(known))")
        }
        chosen.append(parser)
    }
    simulationJunkParsers.withLock { $0 = chosen }
}
