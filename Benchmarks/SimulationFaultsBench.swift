import ExampleServices
import Foundation
import Mainspring
import Synchronization

/// simulation-faults: reliability, measured. The line service and the KV server (mainspring-kv's
/// `KVServer`; `ExampleServices.FaultSoak`), each on the simulation's network under a random
/// fault schedule — resets of single streams (20 a
/// minute) and partitions between the client and server hosts (4 a minute, ~3 s each) — with
/// 200 clients for one simulated minute per seed, latency and segment size chosen by the seed;
/// checked end to end by the oracle (every reply the right one, in order, exactly once; a
/// request without a reply only on a reset connection; every stream closed at the end).
///
/// `--seeds N` (default 100) seeds, 0 to N-1, each run against both services; `--runs` is
/// ignored (each seed is one run). The record's counts are the two services' totals, with each
/// service's own requests, faults and misses beside them (`line_*`, `kv_*`). A failure prints the
/// service and the seed that replays it (`FaultSoak.run(_:seed:)`). Not a timing benchmark:
/// `virtual_per_real` says how much faster than real time the simulation ran. A smoke run: one
/// seed (unless `--seeds`), 10 clients, 10 simulated seconds.
let simulationFaultsScenario = Scenario(
    name: "simulation-faults",
    summary: "line service and KV server, 200 clients each, random resets and partitions for a simulated minute per seed (--seeds N): lost/duplicated/reordered replies"
) { _ in
    let seeds = simulationFaultSeeds.withLock { $0 } ?? sized(100, smoke: 1)
    let clients = sized(200, smoke: 10)
    let duration = sized(Duration.seconds(60), smoke: .seconds(10))
    var byService: [FaultSoak.Service: FaultSoak.Result] = [:]
    let (crashes, real) = forEachSeed(seeds, of: FaultSoak.Service.allCases, scenario: "simulation-faults") { service, seed in
        byService[service, default: FaultSoak.Result()].add(try FaultSoak.run(service, seed: seed, clients: clients, duration: duration))
    }
    var total = FaultSoak.Result()
    for service in FaultSoak.Service.allCases { total.add(byService[service] ?? FaultSoak.Result()) }
    for failure in total.failures {
        FileHandle.standardError.write(Data("simulation-faults: \(failure)\n".utf8))
    }
    var perService: [(String, Double)] = []
    for (service, prefix) in [(FaultSoak.Service.lineService, "line"), (.kv, "kv")] {
        let result = byService[service] ?? FaultSoak.Result()
        perService += [
            ("\(prefix)_requests", Double(result.requests)),
            ("\(prefix)_faults", Double(result.faults.values.reduce(0, +))),
            ("\(prefix)_cut_by_reset", Double(result.cutByReset)),
            ("\(prefix)_missed", Double(result.lost + result.duplicated + result.reordered)),
            ("\(prefix)_leaked_sources", Double(result.leakedSources)),
        ]
    }
    var samples = Samples()
    samples.add("mainspring", [
        ("seeds", Double(seeds)),  // each run against both services
        ("faults", Double(total.faults.values.reduce(0, +))),
        ("resets", Double(total.faults["reset"] ?? 0)),
        ("partitions", Double(total.faults["partition"] ?? 0)),
        ("requests", Double(total.requests)),
        ("replies", Double(total.replies)),
        ("cut_by_reset", Double(total.cutByReset)),
        ("lost", Double(total.lost)),
        ("duplicated", Double(total.duplicated)),
        ("reordered", Double(total.reordered)),
        ("leaked_sources", Double(total.leakedSources)),
        ("crashes", Double(crashes)),
        ("virtual_s", total.virtualSeconds),
        ("real_s", real),
        ("virtual_per_real", total.virtualSeconds / max(real, 1e-9)),
    ] + perService)
    return samples.records(scenario: "simulation-faults")
}

/// `--seeds N` for simulation-faults and simulation-junk; nil: 100 (1 in a smoke run).
let simulationFaultSeeds = Mutex<Int?>(nil)

/// Runs `body` for each of `cases` with seeds 0 to `seeds` - 1, in that order; a run that throws
/// is counted and printed with its case and seed (which replay it), and progress goes to standard
/// error every 100 seeds. Returns the runs that threw and the real seconds it all took.
func forEachSeed<Case: RawRepresentable<String>>(_ seeds: Int, of cases: [Case], scenario: String,
                                                  _ body: (Case, UInt64) throws -> Void) -> (crashes: Int, real: Double)
{
    let started = ContinuousClock.now
    var crashes = 0
    for seed in 0..<UInt64(seeds) {
        for item in cases {
            do {
                try body(item, seed)
            } catch {
                crashes += 1
                FileHandle.standardError.write(Data("\(scenario): \(item.rawValue), seed \(seed) could not run: \(error)\n".utf8))
            }
        }
        if (seed + 1) % 100 == 0 {
            FileHandle.standardError.write(Data("\(scenario): \(seed + 1) of \(seeds) seeds\n".utf8))
        }
    }
    return (crashes, (ContinuousClock.now - started) / .seconds(1))
}
