import Foundation
import Mainspring

/// tiny-chunks: chunks of about 1 µs of busy CPU, no input: what the feeding costs per chunk.
/// `for-loop` runs them straight; `budget` and `one-chunk` through a `Feeder`; `dispatch-feeder`
/// is the Dispatch feeding recipe with `dispatchMain()` (on Linux: no hop, chunks run inline on the
/// feeder queue's thread) and `dispatch-feeder-runloop` with `RunLoop.main` (a real hop to the
/// main thread and back per chunk). Child processes; see DispatchFeeder.swift.
///
/// Sizes: 1,000,000 chunks for `for-loop` and `budget`; 200,000 for `one-chunk` (a poll per
/// chunk) and the Dispatch variants, to keep the run short. The metric is a rate, so the sizes
/// do not bias it.
let tinyChunksScenario = Scenario(
    name: "tiny-chunks",
    summary: "1 µs chunks: Feeder throughput vs a plain for loop and the Dispatch feeding recipe"
) { runs in
    let chunkNs: UInt64 = 1_000
    let count = sized(1_000_000, smoke: 2_000)
    let oneChunkCount = sized(200_000, smoke: 1_000)
    let dispatchCount = sized(200_000, smoke: 1_000)
    var samples = Samples()
    for _ in 0..<runs {
        samples.add("for-loop", "chunks_per_s", Double(count) / straightChunks(count, chunkNs))
        samples.add("budget", "chunks_per_s", Double(count) / feederChunks(count, chunkNs, .budget(.milliseconds(1))))
        samples.add("one-chunk", "chunks_per_s", Double(oneChunkCount) / feederChunks(oneChunkCount, chunkNs, .oneChunkPerTurn))
        for (variant, runLoop) in [("dispatch-feeder", false), ("dispatch-feeder-runloop", true)]
        where variantEnabled(variant) {
            let run = try dispatchFeeder(chunks: dispatchCount, chunkNanoseconds: chunkNs, inputEveryNanoseconds: 0,
                                         runLoop: runLoop)
            samples.add(variant, "chunks_per_s", Double(dispatchCount) / run.seconds)
        }
    }
    return samples.records(scenario: "tiny-chunks")
}

/// Seconds to feed `count` chunks through a `Feeder` on a fresh loop thread.
func feederChunks(_ count: Int, _ chunkNs: UInt64, _ pacing: Feeder.Pacing) -> Double {
    onFreshThread {
        let loop = EventLoop.current
        let start = nowNanoseconds()
        let job = Feeder(loop: loop, pacing: pacing).feed(chunks: count) { _ in burnCPU(nanoseconds: chunkNs) }
        loop.spin(until: { job.isFinished })
        return Double(nowNanoseconds() - start) / 1e9
    }
}
