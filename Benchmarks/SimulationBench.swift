import Foundation
import Mainspring
import MainspringTesting

/// simulation: time compression of `MainspringTesting` — 1,000 repeating timers every 10 ms plus
/// a Feeder whose 1 ms chunks consume modelled CPU, for one simulated hour (trace off): virtual
/// seconds per real second, and the process's resident memory at 6 and at 60 simulated minutes
/// (flat: nothing grows with simulated time). Also the same at 1 simulated minute with the trace
/// on, for what recording every dispatch costs. A smoke run: 100 timers, 6 simulated seconds
/// (the RSS at 0.6 and 6), 1 second traced.
let simulationScenario = Scenario(
    name: "simulation",
    summary: "1,000 timers every 10 ms + a Feeder of 1 ms modelled-CPU chunks for 1 simulated hour: virtual s per real s, RSS"
) { runs in
    var samples = Samples()
    for _ in 0..<runs {
        samples.add("mainspring", {
            let run = simulateTimersAndFeeder(for: .seconds(sized(3600, smoke: 6)), tracing: false)
            return [("virtual_per_real", run.virtualPerReal), ("rss_mb_6min", run.earlyRSS), ("rss_mb_60min", run.lateRSS),
                    ("timer_ticks_per_virtual_s", run.ticksPerVirtualSecond)]
        }())
        samples.add("mainspring-traced", {
            let run = simulateTimersAndFeeder(for: .seconds(sized(60, smoke: 1)), tracing: true)
            return [("virtual_per_real", run.virtualPerReal)]
        }())
    }
    return samples.records(scenario: "simulation")
}

private struct SimulationRun {
    var virtualPerReal: Double
    var earlyRSS: Double
    var lateRSS: Double
    var ticksPerVirtualSecond: Double
}

private func simulateTimersAndFeeder(for length: Duration, tracing: Bool) -> SimulationRun {
    do {
        let simulation = try Simulation(seed: 1)
        simulation.isTracing = tracing
        let loop = simulation.loop
        var ticks = 0
        for _ in 0..<sized(1_000, smoke: 100) {
            loop.schedule(every: .milliseconds(10)) { _ in ticks &+= 1 }
        }
        let feeder = Feeder(loop: loop, priority: .background)
        let job = feeder.feed(chunks: Int.max) { _ in simulation.consume(.milliseconds(1)) }
        let start = nowNanoseconds()
        let tenth = length / 10
        simulation.advance(by: tenth)
        let early = Double(residentBytes(of: getpid())) / 1e6
        simulation.advance(by: length - tenth)
        let real = Double(nowNanoseconds() - start) / 1e9
        let late = Double(residentBytes(of: getpid())) / 1e6
        job.cancel()
        let virtual = Double(simulation.now.components.seconds) + Double(simulation.now.components.attoseconds) / 1e18
        return SimulationRun(virtualPerReal: virtual / real, earlyRSS: early, lateRSS: late,
                             ticksPerVirtualSecond: Double(ticks) / virtual)
    } catch {
        fatalError("simulation benchmark: \(error)")
    }
}
