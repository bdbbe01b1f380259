import Foundation
import Mainspring

/// fairness: 2,000 chunks of 1 ms of busy CPU on the loop's thread while input arrives every
/// 10 ms: how long input waits (write to handler start), and what the feeding costs: the wall
/// time from the first submission to the end of the last chunk beyond the chunks' own time (each
/// chunk timed where it runs), as a percentage of that.
///
/// - `naive-flood`: every chunk posted at once with `execute` (`.normal`); only the loop's
///   poll-interval rule keeps input moving.
/// - `dispatch-feeder`: the Dispatch feeding recipe (DispatchFeeder.swift), main queue drained by
///   `dispatchMain()` (child process; see DispatchFeeder.swift).
/// - `dispatch-feeder-runloop`: the same, drained by `RunLoop.main` (the only way to keep the
///   chunks on the main thread on Linux).
/// - `one-chunk`, `budget`: `Feeder` with `.oneChunkPerTurn` and `.budget(1 ms)`.
let fairnessScenario = Scenario(
    name: "fairness",
    summary: "2,000 × 1 ms chunks, input every 10 ms: input latency and overhead, 5 ways"
) { runs in
    let chunks = sized(2_000, smoke: 50)
    let chunkNs: UInt64 = 1_000_000
    let everyNs: UInt64 = 10_000_000
    var samples = Samples()
    var pooled: [(String, LatencyHistogram)] = []
    func add(_ variant: String, _ run: FeedRun) {
        samples.add(variant, [
            ("p50_ms", run.latencies.percentile(0.5).inMilliseconds),
            ("p99_ms", run.latencies.percentile(0.99).inMilliseconds),
            ("max_ms", run.latencies.max.inMilliseconds),
            ("overhead_pct", run.overheadPercent),
        ])
        if let index = pooled.firstIndex(where: { $0.0 == variant }) {
            pooled[index].1.merge(run.latencies)
        } else {
            pooled.append((variant, run.latencies))
        }
    }
    for _ in 0..<runs {
        if variantEnabled("naive-flood") {
            add("naive-flood", mainspringFairness(.naiveFlood, chunks: chunks, chunkNs: chunkNs, everyNs: everyNs))
        }
        if variantEnabled("dispatch-feeder") {
            add("dispatch-feeder", try dispatchFeeder(chunks: chunks, chunkNanoseconds: chunkNs,
                                                      inputEveryNanoseconds: everyNs, runLoop: false))
        }
        if variantEnabled("dispatch-feeder-runloop") {
            add("dispatch-feeder-runloop", try dispatchFeeder(chunks: chunks, chunkNanoseconds: chunkNs,
                                                              inputEveryNanoseconds: everyNs, runLoop: true))
        }
        if variantEnabled("one-chunk") {
            add("one-chunk", mainspringFairness(.feeder(.oneChunkPerTurn), chunks: chunks, chunkNs: chunkNs,
                                                everyNs: everyNs))
        }
        if variantEnabled("budget") {
            add("budget", mainspringFairness(.feeder(.budget(.milliseconds(1))), chunks: chunks, chunkNs: chunkNs,
                                             everyNs: everyNs))
        }
    }
    if let directory = plotDirectory.withLock({ $0 }) {
        let path = URL(fileURLWithPath: directory).appendingPathComponent("fairness-cdf.svg").path
        let chunkCount = sized("2,000", smoke: "\(chunks)")
        let svg = cdfPlot(
            title: "fairness: input latency CDF (\(chunkCount) × 1 ms chunks, input every 10 ms, \(runs) runs pooled)",
            series: pooled)
        do {
            try svg.write(toFile: path, atomically: true, encoding: .utf8)
            FileHandle.standardError.write(Data("wrote \(path)\n".utf8))
        } catch {
            // The figures are measured already: the plot is lost, not the run.
            FileHandle.standardError.write(Data("fairness: could not write \(path): \(error.localizedDescription)\n".utf8))
        }
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

/// Runs the chunks on a fresh loop thread with an `InputSimulator` writing every `everyNs`.
func mainspringFairness(_ variant: FairnessVariant, chunks: Int, chunkNs: UInt64, everyNs: UInt64) -> FeedRun {
    onFreshThread {
        let loop = EventLoop.current
        final class State: @unchecked Sendable {
            var remaining = 0
            var done = false
            var chunkNanoseconds: UInt64 = 0
        }
        let state = State()
        @Sendable func chunk() {
            let start = nowNanoseconds()
            burnCPU(nanoseconds: chunkNs)
            state.chunkNanoseconds += nowNanoseconds() - start
        }
        let input = try! InputSimulator(loop: loop, pattern: .steady(every: .nanoseconds(Int64(everyNs))))
        input.start()
        let start = nowNanoseconds()
        var end: UInt64 = 0
        switch variant {
        case .naiveFlood:
            state.remaining = chunks
            for _ in 0..<chunks {
                loop.execute {
                    chunk()
                    state.remaining -= 1
                    if state.remaining == 0 { state.done = true }
                }
            }
            loop.spin(until: { state.done })
            end = nowNanoseconds()
        case .feeder(let pacing):
            let job = Feeder(loop: loop, pacing: pacing).feed(chunks: chunks) { _ in chunk() }
            job.onCompletion { _ in end = nowNanoseconds() }
            loop.spin(until: { end != 0 })
        }
        input.stop()
        loop.spin(until: { input.isFinished }, timeout: .seconds(5))
        return FeedRun(seconds: Double(end - start) / 1e9, chunkSeconds: Double(state.chunkNanoseconds) / 1e9,
                       latencies: input.latencies)
    }
}

extension Duration {
    var inMilliseconds: Double { Double(components.seconds) * 1e3 + Double(components.attoseconds) / 1e15 }
}
