import CBaselines
import Dispatch
import Mainspring

/// post-local: 5,000,000 posts from the loop's own thread, each post made by the previous item
/// (a chain, like the C baseline's event re-activating itself).
let postLocalScenario = Scenario(
    name: "post-local",
    summary: "5M self-posts on the loop's thread vs C libevent event_active vs DispatchQueue"
) { runs in
    let count = sized(5_000_000, smoke: 2_000)
    let dispatchCount = sized(1_000_000, smoke: 2_000)  // Dispatch is ~20x slower; fewer items keep the run short
    var samples = Samples()
    for _ in 0..<runs {
        samples.add("mainspring", "ops_per_s", Double(count) / mainspringPostLocal(count))
        samples.add("mainspring-no-metrics", "ops_per_s", Double(count) / mainspringPostLocal(count, metrics: false))
        samples.add("libevent-c-polling", "ops_per_s", Double(count) / ms_baseline_post_local(Int64(count), 1_000))
        samples.add("libevent-c", "ops_per_s", Double(count) / ms_baseline_post_local(Int64(count), 0))
        samples.add("dispatch", "ops_per_s", Double(dispatchCount) / dispatchPostLocal(dispatchCount))
    }
    return samples.records(scenario: "post-local")
}

/// Seconds for `count` chained posts on a fresh loop thread: on its `EventLoop.current`, or on
/// a loop made with `configuration` (`metrics: false` turns `collectsMetrics` off in it).
/// `around` runs the measured part, from the first post to the last item (`--counts` passes
/// `countedRegion`).
func mainspringPostLocal(_ count: Int, metrics: Bool = true, configuration: EventLoop.Configuration? = nil,
                         around: @escaping @Sendable (() -> Void) -> Void = { $0() }) -> Double
{
    onFreshThread {
        var configuration = configuration
        if !metrics { configuration = configuration ?? .init() }
        configuration?.collectsMetrics = metrics
        let loop = try! configuration.map { try EventLoop(configuration: $0) } ?? EventLoop.current
        final class Chain: @unchecked Sendable {
            var remaining: Int
            var step: (@Sendable () -> Void)?
            init(_ n: Int) { remaining = n }
        }
        let chain = Chain(count)
        let loopRef = loop
        chain.step = { @Sendable in
            chain.remaining -= 1
            if chain.remaining > 0 { loopRef.execute(chain.step!) }
        }
        let start = nowNanoseconds()
        around {
            loop.execute(chain.step!)
            loop.spin(until: { chain.remaining == 0 })
        }
        let seconds = Double(nowNanoseconds() - start) / 1e9
        chain.step = nil
        return seconds
    }
}

/// Seconds for `count` chained `async` calls on a serial DispatchQueue.
func dispatchPostLocal(_ count: Int) -> Double {
    let queue = DispatchQueue(label: "bench.post-local")
    let done = DispatchSemaphore(value: 0)
    final class Chain: @unchecked Sendable {
        var remaining: Int
        var step: (@Sendable () -> Void)?
        init(_ n: Int) { remaining = n }
    }
    let chain = Chain(count)
    chain.step = { @Sendable in
        chain.remaining -= 1
        if chain.remaining > 0 { queue.async(execute: chain.step!) } else { done.signal() }
    }
    let start = nowNanoseconds()
    queue.async(execute: chain.step!)
    done.wait()
    chain.step = nil
    return Double(nowNanoseconds() - start) / 1e9
}
