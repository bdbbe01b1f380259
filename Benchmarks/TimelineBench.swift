import Foundation
import Mainspring

/// timeline: a 60 fps Timeline step of 1 s on an idle loop vs on a loop that a Feeder keeps
/// saturated with 1 ms chunks (both pacings): frames delivered per second and their lateness
/// behind the frame grid. The claim: frames keep coming (≥ half the rate) under fed work.
let timelineScenario = Scenario(
    name: "timeline",
    summary: "60 fps Timeline for 1 s: idle vs a Feeder saturating the loop with 1 ms chunks"
) { runs in
    var samples = Samples()
    for _ in 0..<runs {
        for (variant, pacing) in [("idle", nil), ("feeder-budget", Feeder.Pacing.budget(.milliseconds(1))),
                                  ("feeder-one-chunk", Feeder.Pacing.oneChunkPerTurn)] as [(String, Feeder.Pacing?)] {
            samples.add(variant, {
                let (frames, late) = timelineFrames(under: pacing)
                return [("frames_per_s", frames), ("frame_late_p99_ms", late)]
            }())
        }
    }
    return samples.records(scenario: "timeline")
}

/// (frames per second, p99 lateness in ms) of a 1 s linear step at 60 fps (0.1 s in a smoke run).
private func timelineFrames(under pacing: Feeder.Pacing?) -> (Double, Double) {
    onFreshThread {
        let loop = EventLoop.current
        var job: FeedJob?
        if let pacing {
            let feeder = Feeder(loop: loop, pacing: pacing)
            job = feeder.feed(chunks: 100_000) { _ in burnCPU(nanoseconds: 1_000_000) }
        }
        let milliseconds = sized(1_000, smoke: 100)
        let duration = Double(milliseconds) / 1e3
        var stamps: [UInt64] = []
        var done = false
        let timeline = Timeline(loop: loop, framesPerSecond: 60)
        timeline.step(duration: .milliseconds(milliseconds), curve: .linear) { _ in stamps.append(nowNanoseconds()) }
        let start = nowNanoseconds()
        timeline.start { _ in done = true }
        loop.spin(until: { done })
        job?.cancel()
        loop.spin(until: { job?.isFinished ?? true }, timeout: .seconds(5))
        // Lateness behind the grid start + k/60 s (frames are on that grid when on time).
        let interval = 1e9 / 60
        let late = stamps.map { stamp -> Double in
            let elapsed = Double(stamp - start)
            return (elapsed - (elapsed / interval).rounded(.down) * interval) / 1e6
        }
        return (Double(stamps.count) / duration, percentile(late, 0.99))
    }
}
