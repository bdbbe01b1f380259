import Foundation
import Mainspring

/// fairness: 2,000 chunks of 1 ms of busy CPU on the loop's thread while input arrives every
/// 10 ms: how long input waits (write to handler start), and what the feeding costs against
/// running the chunks straight in a `for` loop (measured in the same run).
///
/// - `naive-flood`: every chunk posted at once with `execute` (`.normal`); only the loop's
///   poll-interval rule keeps input moving.
/// - `dispatch-feeder`: the article's recipe on plain Dispatch (child process; see
///   DispatchFeeder.swift).
/// - `one-chunk`, `budget`: `Feeder` with `.oneChunkPerTurn` and `.budget(1 ms)`.
let fairnessScenario = Scenario(
    name: "fairness",
    summary: "2,000 × 1 ms chunks, input every 10 ms: input latency and overhead, 4 ways"
) { runs in
    let chunks = 2_000
    let chunkNs: UInt64 = 1_000_000
    let everyNs: UInt64 = 10_000_000
    var samples = Samples()
    var pooled: [(String, LatencyHistogram)] = []
    func add(_ variant: String, seconds: Double, latencies: LatencyHistogram, straight: Double) {
        samples.add(variant, [
            ("p50_ms", latencies.percentile(0.5).inMilliseconds),
            ("p99_ms", latencies.percentile(0.99).inMilliseconds),
            ("max_ms", latencies.max.inMilliseconds),
            ("overhead_pct", (seconds / straight - 1) * 100),
        ])
        if let index = pooled.firstIndex(where: { $0.0 == variant }) {
            pooled[index].1.merge(latencies)
        } else {
            pooled.append((variant, latencies))
        }
    }
    for _ in 0..<runs {
        let straight = straightChunks(chunks, chunkNs)
        if variantEnabled("naive-flood") {
            let (seconds, latencies) = mainspringFairness(.naiveFlood, chunks: chunks, chunkNs: chunkNs, everyNs: everyNs)
            add("naive-flood", seconds: seconds, latencies: latencies, straight: straight)
        }
        if variantEnabled("dispatch-feeder") {
            let (seconds, raw) = try dispatchFeeder(chunks: chunks, chunkNanoseconds: chunkNs, inputEveryNanoseconds: everyNs)
            var latencies = LatencyHistogram()
            for ns in raw { latencies.record(.nanoseconds(Int64(ns))) }
            add("dispatch-feeder", seconds: seconds, latencies: latencies, straight: straight)
        }
        if variantEnabled("one-chunk") {
            let (seconds, latencies) = mainspringFairness(.feeder(.oneChunkPerTurn), chunks: chunks, chunkNs: chunkNs,
                                                          everyNs: everyNs)
            add("one-chunk", seconds: seconds, latencies: latencies, straight: straight)
        }
        if variantEnabled("budget") {
            let (seconds, latencies) = mainspringFairness(.feeder(.budget(.milliseconds(1))), chunks: chunks,
                                                          chunkNs: chunkNs, everyNs: everyNs)
            add("budget", seconds: seconds, latencies: latencies, straight: straight)
        }
    }
    if let directory = plotDirectory.withLock({ $0 }) {
        let path = URL(fileURLWithPath: directory).appendingPathComponent("fairness-cdf.svg").path
        let svg = cdfPlot(
            title: "fairness: input latency CDF (2,000 × 1 ms chunks, input every 10 ms, \(runs) runs pooled)",
            series: pooled)
        try svg.write(toFile: path, atomically: true, encoding: .utf8)
        FileHandle.standardError.write(Data("wrote \(path)\n".utf8))
    }
    return samples.records(scenario: "fairness")
}

enum FairnessVariant {
    case naiveFlood
    case feeder(Feeder.Pacing)
}

/// Seconds for `chunks` chunks run straight in a `for` loop on a fresh thread.
func straightChunks(_ chunks: Int, _ chunkNs: UInt64) -> Double {
    onFreshThread {
        let start = nowNanoseconds()
        for _ in 0..<chunks { burnCPU(nanoseconds: chunkNs) }
        return Double(nowNanoseconds() - start) / 1e9
    }
}

/// Runs the chunks on a fresh loop thread with an `InputSimulator` writing every `everyNs`;
/// returns (seconds from submission to the end of the last chunk, input latencies).
func mainspringFairness(_ variant: FairnessVariant, chunks: Int, chunkNs: UInt64, everyNs: UInt64)
    -> (Double, LatencyHistogram)
{
    onFreshThread {
        let loop = EventLoop.current
        final class Done: @unchecked Sendable { var remaining = 0; var done = false }
        let state = Done()
        let input = try! InputSimulator(loop: loop, pattern: .steady(every: .nanoseconds(Int64(everyNs))))
        input.start()
        let start = nowNanoseconds()
        switch variant {
        case .naiveFlood:
            state.remaining = chunks
            for _ in 0..<chunks {
                loop.execute {
                    burnCPU(nanoseconds: chunkNs)
                    state.remaining -= 1
                    if state.remaining == 0 { state.done = true }
                }
            }
        case .feeder(let pacing):
            let job = Feeder(loop: loop, pacing: pacing).feed(chunks: chunks) { _ in burnCPU(nanoseconds: chunkNs) }
            job.onCompletion { _ in state.done = true }
        }
        loop.spin(until: { state.done })
        let seconds = Double(nowNanoseconds() - start) / 1e9
        input.stop()
        loop.spin(until: { input.isFinished }, timeout: .seconds(5))
        return (seconds, input.latencies)
    }
}

extension Duration {
    var inMilliseconds: Double { Double(components.seconds) * 1e3 + Double(components.attoseconds) / 1e15 }
}
