import CBaselines
import Mainspring

/// timers: a 1 ms repeating timer for 2 s on an idle loop; lateness behind the ideal grid.
let timersScenario = Scenario(
    name: "timers",
    summary: "1 ms repeating timer for 2 s: firings and lateness vs plain libevent"
) { runs in
    let intervalMicroseconds = 1_000
    let durationMilliseconds = sized(2_000, smoke: 50)
    var samples = Samples()
    for _ in 0..<runs {
        samples.add("mainspring", lateness(mainspringTimers(
            interval: .microseconds(intervalMicroseconds), duration: .milliseconds(durationMilliseconds))))
        samples.add("libevent-c", {
            var buffer = [Int64](repeating: 0, count: 10_000)
            let firings = ms_baseline_timers(Int32(intervalMicroseconds), Int32(durationMilliseconds), &buffer, 10_000)
            return lateness(buffer.prefix(Int(firings)).map { Double($0) })
        }())
    }
    return samples.records(scenario: "timers")
}

private func lateness(_ nanoseconds: [Double]) -> [(String, Double)] {
    [("firings", Double(nanoseconds.count)),
     ("late_p50_ms", percentile(nanoseconds, 0.5) / 1e6),
     ("late_p99_ms", percentile(nanoseconds, 0.99) / 1e6),
     ("late_max_ms", (nanoseconds.max() ?? .nan) / 1e6)]
}

/// Lateness (ns) of every firing of a repeating timer behind its ideal deadline.
func mainspringTimers(interval: Duration, duration: Duration) -> [Double] {
    onFreshThread {
        let loop = EventLoop.current
        let intervalNs = UInt64(interval.components.attoseconds / 1_000_000_000) + UInt64(interval.components.seconds) * 1_000_000_000
        let durationNs = UInt64(duration.components.seconds) * 1_000_000_000 + UInt64(duration.components.attoseconds / 1_000_000_000)
        var late: [Double] = []
        late.reserveCapacity(4_096)
        var done = false
        let start = nowNanoseconds()
        let end = start + durationNs
        let timer = loop.schedule(every: interval) { _ in
            let now = nowNanoseconds()
            let ideal = start + (now - start) / intervalNs * intervalNs
            late.append(Double(now - ideal))
            if now >= end { done = true }
        }
        loop.spin(until: { done })
        timer.cancel()
        return late
    }
}
