import Foundation
import Mainspring

/// resolve: input latency on a loop while it keeps 1,000 `loop.resolve` calls in flight for
/// 1.5 s — `localhost` and the names of /etc/hosts, each task resolving again as soon as its
/// answer arrives. The input is an `InputSimulator` on the same loop: a record through a real
/// pipe every millisecond, its latency from the write to its handler. `idle_input_p99_ms` is
/// the same input for 0.5 s before, with no resolution in flight.
let resolveScenario = Scenario(
    name: "resolve",
    summary: "input p99 on a loop while 1,000 loop.resolve calls (localhost, /etc/hosts) are in flight"
) { runs in
    var samples = Samples()
    let names = hostsFileNames()
    for _ in 0..<runs {
        samples.add("mainspring", resolveUnderInput(names: names, inFlight: sized(1_000, smoke: 100),
                                                    duration: .milliseconds(sized(1_500, smoke: 100))))
    }
    return samples.records(scenario: "resolve")
}

/// `localhost` and every name /etc/hosts lists (aliases included), once each.
private func hostsFileNames() -> [String] {
    var names = ["localhost"]
    let text = (try? String(contentsOfFile: "/etc/hosts", encoding: .utf8)) ?? ""
    for line in text.split(separator: "\n") {
        let content = line.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        for name in content.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst() where !names.contains(String(name)) {
            names.append(String(name))
        }
    }
    return names
}

private final class ResolveCounters: @unchecked Sendable {
    var resolved = 0
    var failed = 0
    var finishedTasks = 0
}

private func resolveUnderInput(names: [String], inFlight: Int, duration: Duration) -> [(String, Double)] {
    onFreshThread {
        let loop = EventLoop.current
        // Idle: the input alone.
        let idle = try! InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)), count: sized(500, smoke: 50))
        idle.start()
        loop.spin(until: { idle.isFinished }, timeout: .seconds(30))
        let idleP99 = idle.latencies.percentile(0.99).inMilliseconds

        let input = try! InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)))
        let counters = ResolveCounters()
        let start = nowNanoseconds()
        let deadline = start + UInt64(duration.components.seconds) * 1_000_000_000
            + UInt64(duration.components.attoseconds / 1_000_000_000)
        input.start()
        for index in 0..<inFlight {
            let name = names[index % names.count]
            Task(executorPreference: loop) {
                while nowNanoseconds() < deadline {
                    do {
                        _ = try await loop.resolve(name, port: 80)
                        counters.resolved += 1
                    } catch {
                        counters.failed += 1
                    }
                }
                counters.finishedTasks += 1
            }
        }
        loop.spin(until: { counters.finishedTasks == inFlight }, timeout: .seconds(60))
        let elapsed = Double(nowNanoseconds() - start) / 1e9
        input.stop()
        loop.spin(until: { input.isFinished }, timeout: .seconds(10))
        return [("input_p99_ms", input.latencies.percentile(0.99).inMilliseconds),
                ("input_max_ms", input.latencies.max.inMilliseconds),
                ("idle_input_p99_ms", idleP99),
                ("resolutions_per_s", Double(counters.resolved) / elapsed),
                ("failed", Double(counters.failed))]
    }
}
