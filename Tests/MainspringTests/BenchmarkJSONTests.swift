import Foundation
import Testing
import MainspringTestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `mainspring-bench --smoke --json`: every scenario `--help` lists, in its smallest form (one
/// short run each: tenths of a second, hundreds of items, one seed), prints records that parse.
/// Each scenario gives at least one record, and every record has the schema's keys and finite
/// numbers — a figure that does not exist in a run (the p99 of 503s when nothing was shed) is
/// left out, never a `nan` that fails the whole run after minutes of measuring.
///
/// The bench is the build under test (debug under `make test`: about 12 s on an idle 2-core
/// machine, three processes at once; under a minute amid the parallel suite). Scenarios that
/// need an outside tool skip their variants when it is missing, so a scenario with none of its
/// tools may give no record. Skipped under sanitizers: the benchmark's load (wrk, 32-thread
/// clients, a C server) under a sanitizer takes minutes and measures the sanitizer, and its JSON
/// does not depend on it.
@Suite("mainspring-bench --json (smoke runs)", .serialized,
       .enabled(if: ProcessInfo.processInfo.environment["MAINSPRING_SANITIZER"] == nil,
                "a sanitizer build runs the benchmarks' load for minutes; their JSON does not depend on it"))
struct BenchmarkJSONTests {
    /// The keys of a record (`BenchRecord`), which the tools that read `--json` expect.
    static let recordKeys: Set<String> = ["scenario", "variant", "metric", "min", "median", "max", "runs"]

    /// Outside tools without which a scenario has no variant left (the others skip single variants).
    static let requiredTools: [String: [String]] = [
        "http": ["wrk"],
        "http2": ["h2load"],
        "tls": ["openssl"],
        "kv": ["redis-server", "redis-benchmark"],
    ]

    /// A program on the PATH, or nil: where the bench looks for its tools (`findExecutable`).
    static func tool(_ name: String) -> String? {
        let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":")
        return directories.map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// The scenarios `mainspring-bench --help` lists: those that run by default, and those that
    /// run only when named (the indented lines after each list's heading).
    static func listedScenarios() async throws -> (defaults: [String], namedOnly: [String]) {
        let help = try await runExecutable("mainspring-bench", arguments: ["--help"])
        try #require(help.status == 0 && !help.crashedBySignal, "\(help.summary)")
        func names(under heading: String) -> [String] {
            help.lines.drop { !$0.hasPrefix(heading) }.dropFirst().prefix { $0.hasPrefix("  ") }
                .compactMap { $0.split(separator: " ").first.map(String.init) }
        }
        return (names(under: "scenarios"), names(under: "named-only scenarios"))
    }

    /// Runs `mainspring-bench <arguments> --smoke --json` and returns its records, each checked:
    /// the schema's keys and no others, finite figures in order (min ≤ median ≤ max), one run.
    static func smokeRecords(_ arguments: [String]) async throws -> [[String: Any]] {
        let result = try await runExecutable("mainspring-bench", arguments: arguments + ["--smoke", "--json"],
                                             timeout: .seconds(240))
        try #require(result.status == 0 && !result.crashedBySignal && !result.timedOut, "\(result.summary)")
        let parsed = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8))
        let records = try #require(parsed as? [[String: Any]], "not an array of objects: \(result.stdout.prefix(2_000))")
        for record in records {
            let name = "\(record["scenario"] ?? "?") \(record["variant"] ?? "?") \(record["metric"] ?? "?")"
            #expect(Set(record.keys) == recordKeys, "\(name): keys \(record.keys.sorted())")
            for key in ["scenario", "variant", "metric"] {
                #expect((record[key] as? String).map { !$0.isEmpty } == true, "\(name): \(key)")
            }
            let figures = ["min", "median", "max"].compactMap { (record[$0] as? NSNumber)?.doubleValue }
            #expect(figures.count == 3 && figures.allSatisfy(\.isFinite), "\(name): figures \(figures)")
            if figures.count == 3 { #expect(figures[0] <= figures[1] && figures[1] <= figures[2], "\(name): \(figures)") }
            #expect((record["runs"] as? NSNumber)?.intValue == 1, "\(name): runs \(record["runs"] ?? "none")")
        }
        return records
    }

    @Test("every scenario, run by default and named-only, prints parseable records with finite figures",
          .timeLimit(.minutes(8)))
    func everyScenario() async throws {
        let (defaults, namedOnly) = try await Self.listedScenarios()
        try #require(defaults.contains("shedding") && namedOnly.contains("soak"), "\(defaults) \(namedOnly)")
        let listed = defaults + namedOnly
        // Three processes at once (much of a smoke run is waiting: wrk's one-second runs, timers,
        // pauses): every other default scenario in each of two, the named-only ones in the third.
        let halves = [0, 1].map { half in defaults.indices.filter { $0 % 2 == half }.map { defaults[$0] } }
        async let firstHalf = Self.smokeRecords(halves[0])
        async let secondHalf = Self.smokeRecords(halves[1])
        async let namedRecords = Self.smokeRecords(namedOnly)
        let records = try await firstHalf + secondHalf + namedRecords
        let scenarios = Set(records.compactMap { $0["scenario"] as? String })
        for scenario in listed {
            let missing = (Self.requiredTools[scenario] ?? []).filter { Self.tool($0) == nil }
            if missing.isEmpty {
                #expect(scenarios.contains(scenario), "\(scenario) printed no record")
            }
        }
        #expect(scenarios.isSubset(of: Set(listed)), "\(scenarios.subtracting(listed))")

        // Issue 49's run: shedding's variants without shedding answer no 503, so they have no
        // `shed_p99_ms` at all — where the whole run used to fail on its `nan`.
        let shedding = records.filter { $0["scenario"] as? String == "shedding" }
        let noShedding = shedding.filter { $0["variant"] as? String == "no-shedding" }
        let metrics = Set(noShedding.compactMap { $0["metric"] as? String })
        #expect(metrics.contains("shed_fraction") && !metrics.contains("shed_p99_ms"), "\(metrics.sorted())")
    }

    /// A scenario whose load tool fails (an `h2load` whose every request failed) fails alone:
    /// the run goes on, prints what the other scenarios measured, names the failed one and
    /// exits 1 — where it used to exit at once and lose the rest.
    @Test("a scenario whose tool fails is reported; the others' records are still printed; the exit status is 1")
    func aFailingScenarioFailsAlone() async throws {
        let directory = freshDirectory("fake-h2load")
        let fake = directory + "/h2load"
        try """
            #!/bin/sh
            echo "finished in 0.01s, 100.00 req/s, 1KB/s"
            echo "requests: 10 total, 10 started, 10 done, 0 succeeded, 10 failed, 10 errored, 0 timeout"
            """.write(toFile: fake, atomically: true, encoding: .utf8)
        chmod(fake, 0o755)
        var environment = ProcessInfo.processInfo.environment
        environment["PATH"] = directory + ":" + (environment["PATH"] ?? "/usr/bin:/bin")
        let result = try await runExecutable("mainspring-bench", arguments: ["http2", "timeline", "--smoke", "--json"],
                                             environment: environment, timeout: .seconds(240))
        #expect(result.status == 1 && !result.crashedBySignal && !result.timedOut, "\(result.summary)")
        #expect(result.stderr.contains("http2 failed") && result.stderr.contains("0 succeeded, 10 failed"), "\(result.stderr)")
        #expect(result.stderr.contains("failed (their figures are missing above): http2"), "\(result.stderr)")
        let parsed = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [[String: Any]]
        let scenarios = Set((parsed ?? []).compactMap { $0["scenario"] as? String })
        #expect(scenarios == ["timeline"], "\(result.stdout.prefix(2_000))")
    }
}
