import CBaselines
import Dispatch
import Foundation
import Mainspring

/// post-remote: one producer thread posts 2,000,000 items to a loop on another thread.
let postRemoteScenario = Scenario(
    name: "post-remote",
    summary: "2M posts from another thread vs C eventfd-coalesced queue vs DispatchQueue"
) { runs in
    let count = sized(2_000_000, smoke: 2_000)
    let dispatchCount = sized(1_000_000, smoke: 2_000)
    var samples = Samples()
    for _ in 0..<runs {
        samples.add("mainspring", {
            let (seconds, perWakeup) = mainspringPostRemote(count)
            return [("ops_per_s", Double(count) / seconds), ("items_per_wakeup", perWakeup)]
        }())
        samples.add("libevent-c", {
            var wakeups: Int64 = 0
            let seconds = ms_baseline_post_remote(Int64(count), &wakeups)
            return [("ops_per_s", Double(count) / seconds), ("items_per_wakeup", Double(count) / Double(max(wakeups, 1)))]
        }())
        samples.add("dispatch", "ops_per_s", Double(dispatchCount) / dispatchPostRemote(dispatchCount))
    }
    return samples.records(scenario: "post-remote")
}

/// The items' target. A global, so the posted closures capture nothing: like the C baseline's
/// (function, argument) items, posting them costs no reference counting.
private final class RemoteCounter: @unchecked Sendable { var value = 0 }
private let mainspringCounter = RemoteCounter()
private let dispatchCounter = RemoteCounter()

/// (seconds, items per wake-up) for `count` posts from one producer thread.
func mainspringPostRemote(_ count: Int) -> (Double, Double) {
    onFreshThread {
        let loop = EventLoop.current
        let counter = mainspringCounter
        counter.value = 0
        let work: @Sendable () -> Void = { mainspringCounter.value += 1 }
        let before = loop.metrics
        let start = nowNanoseconds()
        let producer = Thread {
            for _ in 0..<count { loop.execute(work) }
        }
        producer.start()
        loop.spin(until: { counter.value == count })
        let seconds = Double(nowNanoseconds() - start) / 1e9
        let after = loop.metrics
        let wakeups = max(after.wakeups - before.wakeups, 1)
        return (seconds, Double(after.remoteItems - before.remoteItems) / Double(wakeups))
    }
}

/// Seconds for `count` `async` calls from one thread onto a serial DispatchQueue.
func dispatchPostRemote(_ count: Int) -> Double {
    let queue = DispatchQueue(label: "bench.post-remote")
    dispatchCounter.value = 0
    let work: @Sendable () -> Void = { dispatchCounter.value += 1 }
    let start = nowNanoseconds()
    let producer = Thread {
        for _ in 0..<count { queue.async(execute: work) }
    }
    producer.start()
    while true {
        // Wait on the queue itself: a final sync runs after every item posted before it.
        usleep(1_000)
        if queue.sync(execute: { dispatchCounter.value }) == count { break }
    }
    return Double(nowNanoseconds() - start) / 1e9
}
