import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP
import Synchronization

/// shedding: a one-loop `HTTPServer` offered four times the `/work` it can do, with and without
/// load shedding. `/work?n=400` is the daemon's route: 400 `WorkUnit`s (about 20 ms of CPU) fed
/// through the loop's `Feeder`, so that input stays responsive while it runs.
///
/// Each run first measures the server's capacity (two clients sending `/work` back to back for
/// 2 s: completions per second), then offers `4 ×` that, open-loop — arrivals on a timer,
/// whatever the answers — for 5 s, from a client that gives each request 1 s (its response
/// timeout, counted from the arrival: a request that waited for a connection has less), while a
/// prober sends `GET /healthz` every 20 ms on a client of its own. Figures:
///
/// - `goodput_fraction`: `/work` answered `200` within its 1 s, per second, over the capacity.
/// - `shed_p99_ms`: the p99 latency of the `503` answers (from the arrival).
/// - `healthz_p99_ms`: the prober's p99.
/// - `capacity_per_s`, `shed_fraction` (503s over arrivals), `late_fraction` (arrivals that got
///   no answer in time: timed out, or answered after their second).
///
/// Variants: `mainspring` — `loadShedding` on (its defaults: a 50 ms target, a 100 ms window)
/// watching the `/work` feeder's backlog (`watchedFeeders`): shed while a job has waited over
/// 50 ms to start; `mainspring-route-limit` — no lag rule, `/work` limited to 2 at once
/// (`limitConcurrency`); `mainspring-queue-wait-only` — the requests' queue wait alone (input
/// first keeps it short while the work piles up in the feeder: it does not see this overload);
/// `no-shedding` — none of them.
let sheddingScenario = Scenario(
    name: "shedding",
    summary: "HTTPServer at 4x capacity of /work (20 ms of CPU, fed): goodput, 503 p99 and /healthz p99 with and without shedding"
) { runs in
    var samples = Samples()
    for _ in 0..<runs {
        for mode in SheddingMode.allCases {
            samples.add(mode.variant, sheddingRun(mode))
        }
    }
    return samples.records(scenario: "shedding")
}

private enum SheddingMode: CaseIterable {
    case feederLag, routeLimit, queueWaitOnly, off

    var variant: String {
        switch self {
        case .feederLag: return "mainspring"
        case .routeLimit: return "mainspring-route-limit"
        case .queueWaitOnly: return "mainspring-queue-wait-only"
        case .off: return "no-shedding"
        }
    }
}

// A smoke run: 2 ms requests, 0.2 s of capacity and of overload, a budget of 250 ms.
private var sheddingWorkChunks: Int { sized(400, smoke: 40) }  // WorkUnit ≈ 50 µs: about 20 ms per request
private var sheddingCapacitySeconds: Double { sized(2, smoke: 0.2) }
private var sheddingSeconds: Double { sized(5, smoke: 0.2) }
private var sheddingRequestBudget: Duration { .milliseconds(sized(1_000, smoke: 250)) }

/// One arrival's end: its status (0: no answer — a timeout or another failure) and its latency
/// from the arrival, in ms.
private struct Answer: Sendable {
    var status: Int
    var milliseconds: Double
}

/// What the arrivals and the prober saw.
private final class Tally: Sendable {
    let answers = Mutex<[Answer]>([])
    let health = Mutex<[Double]>([])
    let outstanding = Atomic<Int>(0)
}

private func sheddingRun(_ mode: SheddingMode) -> [(String, Double)] {
    let serverGroup = try! EventLoopGroup(loopCount: 1)
    let clientGroup = try! EventLoopGroup(loopCount: 1)
    defer {
        clientGroup.shutdownBlocking(gracePeriod: .seconds(2))
        serverGroup.shutdownBlocking(gracePeriod: .seconds(2))
    }
    let exporter = LoopMetricsExporter(group: serverGroup)
    let feeders = serverGroup.loops.map { Feeder(loop: $0) }
    var routes = HTTPService.routes(group: serverGroup, exporter: exporter, feeders: feeders)
    var configuration = HTTPServer.Configuration()
    switch mode {
    case .feederLag: configuration.loadShedding = .init(watchedFeeders: feeders)
    case .routeLimit: routes.limitConcurrency(of: "/work", to: 2)
    case .queueWaitOnly: configuration.loadShedding = .init()
    case .off: break
    }
    let server = try! HTTPServer(group: serverGroup, configuration: configuration, routes: routes)
    defer { server.close() }
    let loop = clientGroup.loops[0]
    let base = "http://127.0.0.1:\(server.port)"
    let workURL = "\(base)/work?n=\(sheddingWorkChunks)"

    // Capacity: two clients back to back (one would leave the loop idle between its requests).
    let capacity = blockingAwait { () async -> Double in
        let client = HTTPClient(loop: loop, configuration: .init(maxConnectionsPerHost: 2))
        defer { client.shutdown() }
        let end = nowNanoseconds() + UInt64(sheddingCapacitySeconds * 1e9)
        let done = await withTaskGroup(of: Int.self) { tasks in
            for _ in 0..<2 {
                tasks.addTask(executorPreference: loop) {
                    var count = 0
                    while nowNanoseconds() < end {
                        if let response = try? await client.get(workURL), response.status == 200 { count += 1 }
                    }
                    return count
                }
            }
            return await tasks.reduce(0, +)
        }
        return Double(done) / sheddingCapacitySeconds
    }
    guard capacity > 0 else { return [("capacity_per_s", 0)] }

    // The overload: 4 × capacity for 5 s, open-loop, and the prober.
    let rate = 4 * capacity
    let interval = Duration.nanoseconds(Int64(1e9 / rate))
    let client = HTTPClient(loop: loop, configuration: .init(maxConnectionsPerHost: 1_024, connectTimeout: .seconds(1),
                                                            responseTimeout: sheddingRequestBudget))
    let prober = HTTPClient(loop: loop, configuration: .init(maxConnectionsPerHost: 4))
    let tally = Tally()
    let budgetNanoseconds = sheddingRequestBudget.inMilliseconds * 1e6
    final class Timers: @unchecked Sendable { var work: TimerHandle?; var probe: TimerHandle? }
    let timers = Timers()
    let started = nowNanoseconds()
    let end = started + UInt64(sheddingSeconds * 1e9)
    let stopped = DispatchSemaphore(value: 0)
    loop.execute {
        timers.work = loop.schedule(every: interval) { timer in
            if nowNanoseconds() >= end {
                timer.cancel()
                stopped.signal()
                return
            }
            tally.outstanding.add(1, ordering: .relaxed)
            let arrival = nowNanoseconds()
            Task(executorPreference: loop) {
                var status = 0
                if let response = try? await client.get(workURL) { status = response.status }
                let latency = Double(nowNanoseconds() - arrival)
                // An answer after the request's budget (its pool wait included) is late: no answer.
                if latency > budgetNanoseconds { status = 0 }
                tally.answers.withLock { $0.append(Answer(status: status, milliseconds: latency / 1e6)) }
                tally.outstanding.subtract(1, ordering: .relaxed)
            }
        }
        timers.probe = loop.schedule(every: .milliseconds(20)) { timer in
            if nowNanoseconds() >= end {
                timer.cancel()
                return
            }
            let sent = nowNanoseconds()
            Task(executorPreference: loop) {
                if let response = try? await prober.get("\(base)/healthz"), response.status == 200 {
                    tally.health.withLock { $0.append(Double(nowNanoseconds() - sent) / 1e6) }
                } else {
                    tally.health.withLock { $0.append(.infinity) }
                }
            }
        }
    }
    stopped.wait()
    // The last arrivals' second, and a margin.
    let patience = nowNanoseconds() + 3_000_000_000
    while tally.outstanding.load(ordering: .relaxed) > 0 && nowNanoseconds() < patience { usleep(10_000) }
    client.shutdown()
    prober.shutdown()

    let all = tally.answers.withLock { $0 }
    let good = all.filter { $0.status == 200 }.count
    let shed = all.filter { $0.status == 503 }.map(\.milliseconds)
    let late = all.filter { $0.status == 0 }.count
    let arrivals = Double(max(1, all.count))
    return [
        ("goodput_fraction", Double(good) / sheddingSeconds / capacity),
        ("shed_p99_ms", percentile(shed, 0.99)),
        ("healthz_p99_ms", percentile(tally.health.withLock { $0 }, 0.99)),
        ("capacity_per_s", capacity),
        ("offered_per_s", rate),
        ("shed_fraction", Double(shed.count) / arrivals),
        ("late_fraction", Double(late) / arrivals),
    ]
}
