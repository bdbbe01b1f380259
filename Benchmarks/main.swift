import Foundation

// mainspring-bench [scenario …] [--runs N] [--json] [--svg DIR] [--smoke]
// Runs each named scenario (all when none is named), every variant side by side in this run,
// and prints an aligned table, or with --json one JSON array of records (`BenchRecord`).
// --svg DIR: scenarios with a plot (fairness) write it there as SVG.
// --smoke: each scenario's smallest form (`smokeRun`): one run, sizes scaled down; a test runs
// every scenario so with --json.
//
// mainspring-bench --counts [scenario …] [--runs N] [--json] [--callers] [--keep DIR]
// Deterministic per-item counts under valgrind's callgrind instead (see Counts.swift).

/// Every scenario, in the order they run. Each lives in its own file.
let scenarios: [Scenario] = [
    postLocalScenario,
    postRemoteScenario,
    timersScenario,
    mainQueueScenario,
    actorHopScenario,
    fairnessScenario,
    tinyChunksScenario,
    inputFloodScenario,
    timelineScenario,
    daemonScenario,
    connectionsScenario,
    httpScenario,
    tlsScenario,
    spawnScenario,
    childOutputScenario,
    httpClientScenario,
    sheddingScenario,
    webSocketScenario,
    udpScenario,
    unixScenario,
    resolveScenario,
    simulationScenario,
    shutdownScenario,
    http2Scenario,
]

/// Scenarios that run only when named (minutes long).
let namedOnlyScenarios: [Scenario] = [
    soakScenario,
    kvScenario,  // against redis-server, about 7 minutes a run
    simulationFaultsScenario,  // --seeds N: about half a second a seed
    simulationJunkScenario,  // --seeds N
]

/// Variants that run in a child process (see `runChild`).
let childEntryPoints: [ChildEntryPoint] = [
    mainQueueChild,
    actorHopChild,
    dispatchFeederChild,
    countsChild,
    echoCChild,
    httpCChild,
    httpServerChild,
    lineServiceChild,
    webSocketEchoChild,
    lineEchoChild,
]

func main() throws {
    var arguments = Array(CommandLine.arguments.dropFirst())
    if arguments.first == "--child" {
        let name = arguments.count > 1 ? arguments[1] : ""
        guard let entry = childEntryPoints.first(where: { $0.name == name }) else {
            throw BenchError.usage("unknown child '\(name)'")
        }
        try entry.body(Array(arguments.dropFirst(2)))
    }
    var requestedRuns: Int?
    var json = false
    var counts = false
    var callers = false
    var keep: String?
    var names: [String] = []
    while !arguments.isEmpty {
        let argument = arguments.removeFirst()
        switch argument {
        case "--runs":
            guard let value = arguments.first.flatMap(Int.init), value > 0 else {
                throw BenchError.usage("--runs needs a positive number")
            }
            arguments.removeFirst()
            requestedRuns = value
        case "--seeds":
            guard let value = arguments.first.flatMap(Int.init), value > 0 else {
                throw BenchError.usage("--seeds needs a positive number")
            }
            arguments.removeFirst()
            simulationFaultSeeds.withLock { $0 = value }
        case "--parsers":
            guard let value = arguments.first else { throw BenchError.usage("--parsers needs a list, such as lines,http_server") }
            arguments.removeFirst()
            try chooseJunkParsers(value)
        case "--json":
            json = true
        case "--smoke":
            smokeRun.store(true, ordering: .relaxed)
        case "--counts":
            counts = true
        case "--callers":
            callers = true
        case "--keep":
            guard let directory = arguments.first else { throw BenchError.usage("--keep needs a directory") }
            arguments.removeFirst()
            keep = directory
        case "--svg":
            guard let directory = arguments.first else { throw BenchError.usage("--svg needs a directory") }
            arguments.removeFirst()
            // Made (or refused) now, before anything is measured: a plot never fails a run.
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            } catch {
                throw BenchError.usage("--svg: cannot make the directory \(directory): \(error.localizedDescription)")
            }
            plotDirectory.withLock { $0 = directory }
        case "--help", "-h":
            let width = (scenarios + namedOnlyScenarios).map(\.name.count).max() ?? 0
            func list(_ group: [Scenario]) {
                for scenario in group {
                    print("  \(scenario.name.padding(toLength: width, withPad: " ", startingAt: 0))  \(scenario.summary)")
                }
            }
            print("usage: mainspring-bench [scenario …] [--runs N] [--json] [--svg DIR] [--seeds N] [--parsers a,b] [--smoke]")
            print("\nscenarios (all of them when none is named):")
            list(scenarios)
            print("\nnamed-only scenarios (minutes long: they run only when named):")
            list(namedOnlyScenarios)
            print("""

                --smoke: each scenario's smallest form, to see that it runs and what it prints (not a
                  measurement): one run unless --runs, tenths of a second where it measures seconds, hundreds
                  or thousands of items where millions, one seed unless --seeds. Every scenario, the named-only
                  ones too, in about half a minute in a debug build (mostly wrk's shortest runs, a second each).

                mainspring-bench --counts [scenario …] [--runs N] [--json] [--callers] [--keep DIR]
                  per-item instructions, retains/releases and heap allocations counted under valgrind's
                  callgrind (deterministic; each of N runs is a pair of counted runs, default 2);
                  --callers: which functions make the retains, releases and allocations;
                  --keep DIR: keep the callgrind.out files there (for callgrind_annotate).
                  counted scenarios: post-local, post-remote, daemon, feeder
                """)
            return
        default:
            names.append(argument)
        }
    }
    if counts {
        if smokeRun.load(ordering: .relaxed) { throw BenchError.usage("--smoke goes with the timed scenarios, not --counts") }
        try runCounts(names: names, runs: requestedRuns ?? 2, json: json, callers: callers, keep: keep)
        return
    }
    if callers || keep != nil { throw BenchError.usage("--callers and --keep go with --counts") }
    let runs = requestedRuns ?? sized(5, smoke: 1)
    let selected = try names.isEmpty ? scenarios : names.map { name in
        guard let scenario = (scenarios + namedOnlyScenarios).first(where: { $0.name == name }) else {
            throw BenchError.unknownScenario(name)
        }
        return scenario
    }
    var records: [BenchRecord] = []
    // A scenario that fails is reported and the run goes on: what the others measured is kept
    // and printed; the exit status says that something failed.
    var failures: [String] = []
    for scenario in selected {
        if !json { FileHandle.standardError.write(Data("running \(scenario.name) (\(runs) runs)…\n".utf8)) }
        do {
            records += try scenario.run(runs)
        } catch {
            FileHandle.standardError.write(Data("mainspring-bench: \(scenario.name) failed: \(error)\n".utf8))
            failures.append(scenario.name)
        }
    }
    if json {
        print(try jsonText(records))
    } else {
        print("$ mainspring-bench \(CommandLine.arguments.dropFirst().joined(separator: " "))")
        print(table(records))
    }
    if !failures.isEmpty {
        throw BenchError.variantFailed("failed (their figures are missing above): \(failures.joined(separator: ", "))")
    }
}

do {
    try main()
} catch {
    FileHandle.standardError.write(Data("mainspring-bench: \(error)\n".utf8))
    exit(1)
}
