import Foundation
import Mainspring

/// input-flood: input every 100 µs, each costing 50 µs of handling (half the CPU), while a
/// `Feeder .budget(1 ms)` runs 4,000 chunks of 100 µs: the work's share of the time, its longest
/// starvation gap, and the input's p99 latency (`FairnessReport`). Input starts with the work
/// and stops when it ends, so every latency is measured under load.
let inputFloodScenario = Scenario(
    name: "input-flood",
    summary: "input every 100 µs costing 50 µs while a Feeder runs: work share, starvation, input p99"
) { runs in
    var samples = Samples()
    for _ in 0..<runs {
        let report = inputFlood(chunks: sized(4_000, smoke: 500), chunkNs: 100_000)
        samples.add("budget", [
            ("work_share", report.workShare),
            ("max_starvation_ms", report.starvation.inMilliseconds),
            ("input_p99_ms", report.inputLatency.p99.inMilliseconds),
        ])
    }
    return samples.records(scenario: "input-flood")
}

func inputFlood(chunks: Int, chunkNs: UInt64) -> FairnessReport {
    onFreshThread {
        let loop = EventLoop.current
        final class Done: @unchecked Sendable { var done = false }
        let state = Done()
        let input = try! InputSimulator(loop: loop, pattern: .steady(every: .microseconds(100)),
                                        handlingCost: .microseconds(50))
        let job = Feeder(loop: loop, pacing: .budget(.milliseconds(1))).feed(chunks: chunks) { _ in
            burnCPU(nanoseconds: chunkNs)
        }
        job.onCompletion { _ in
            input.stop()
            state.done = true
        }
        input.start()
        loop.spin(until: { state.done && input.isFinished })
        return FairnessReport(metrics: loop.metrics, input: input, work: job)
    }
}
