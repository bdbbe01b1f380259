import Foundation
import Mainspring
import MainspringHTTP
import Synchronization

/// shutdown: `HTTPServer.shutdown(gracePeriod:)` with 1,000 requests in flight. A one-loop
/// server's `/hold` handlers wait at a gate; 1,000 clients (an `HTTPClient` on a loop of its
/// own, a connection each) send one request each; once the server counts all 1,000 in flight,
/// the shutdown begins (a 10 s grace) and, 50 ms later, the gate opens: every handler answers.
/// Figures:
///
/// - `in_flight`: requests in flight when the shutdown began (1,000 is the point).
/// - `aborted`: what the server's `ShutdownReport` says it cut (0: every one drained).
/// - `client_errors`: requests that did not get `200` (a refusal, a cut connection).
/// - `stop_after_last_ms`: from the last response a client read to `shutdown` returning —
///   how long the server lingers once drained.
/// - `finished`: the report's count of requests that finished within the grace.
let shutdownScenario = Scenario(
    name: "shutdown",
    summary: "HTTPServer.shutdown(gracePeriod:) with 1,000 requests in flight: aborted, client errors, stop after the last response"
) { runs in
    var samples = Samples()
    for _ in 0..<runs { samples.add("mainspring", shutdownRun(requests: sized(1_000, smoke: 20))) }
    return samples.records(scenario: "shutdown")
}

/// Handlers parked until `open()`; those that come after it pass at once.
private final class Gate: @unchecked Sendable {
    private let lock = NSLock()
    private var isOpen = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    func wait() async {
        await withCheckedContinuation { continuation in
            lock.lock()
            if isOpen {
                lock.unlock()
                continuation.resume()
                return
            }
            waiting.append(continuation)
            lock.unlock()
        }
    }

    func open() {
        lock.lock()
        isOpen = true
        let all = waiting
        waiting = []
        lock.unlock()
        for continuation in all { continuation.resume() }
    }
}

func shutdownRun(requests: Int) -> [(String, Double)] {
    let serverGroup = try! EventLoopGroup(loopCount: 1)
    let clientGroup = try! EventLoopGroup(loopCount: 1)
    defer {
        clientGroup.shutdownBlocking(gracePeriod: .seconds(2))
        serverGroup.shutdownBlocking(gracePeriod: .seconds(2))
    }
    let gate = Gate()
    var routes = HTTPRoutes()
    routes.get("/hold") { _ async in
        await gate.wait()
        return .text("drained\n")
    }
    let server = try! HTTPServer(group: serverGroup, routes: routes)
    let loop = clientGroup.loops[0]
    let url = "http://127.0.0.1:\(server.port)/hold"
    let client = HTTPClient(loop: loop, configuration: .init(maxConnectionsPerHost: requests, requestTimeout: .seconds(60)))
    defer { client.shutdown() }
    final class Tally: Sendable {
        let lastResponse = Atomic<UInt64>(0)
        let errors = Atomic<Int>(0)
        let pending: Atomic<Int>
        let shutdownReturned = Atomic<UInt64>(0)
        let report = Mutex<HTTPServer.ShutdownReport?>(nil)
        let allAnswered = DispatchSemaphore(value: 0)
        let stopped = DispatchSemaphore(value: 0)
        init(_ requests: Int) { pending = Atomic(requests) }
    }
    let tally = Tally(requests)
    for _ in 0..<requests {
        Task(executorPreference: loop) {
            let status = (try? await client.get(url))?.status ?? 0
            if status == 200 {
                tally.lastResponse.max(nowNanoseconds(), ordering: .relaxed)
            } else {
                tally.errors.add(1, ordering: .relaxed)
            }
            if tally.pending.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 { tally.allAnswered.signal() }
        }
    }
    // Every request with the server (a generous wait on a loaded machine).
    let patience = nowNanoseconds() + 60_000_000_000
    while server.statistics.snapshot.requestsInFlight < requests && nowNanoseconds() < patience { usleep(2_000) }
    let inFlight = server.statistics.snapshot.requestsInFlight
    Task {
        let drained = await server.shutdown(gracePeriod: .seconds(10))
        tally.shutdownReturned.store(nowNanoseconds(), ordering: .releasing)
        tally.report.withLock { $0 = drained }
        tally.stopped.signal()
    }
    usleep(50_000)
    gate.open()
    tally.stopped.wait()
    _ = tally.allAnswered.wait(timeout: .now() + 30)
    let last = tally.lastResponse.load(ordering: .relaxed)
    let returned = tally.shutdownReturned.load(ordering: .acquiring)
    let drained = tally.report.withLock { $0 }
    return [
        ("in_flight", Double(inFlight)),
        ("aborted", Double(drained?.aborted ?? -1)),
        ("finished", Double(drained?.finished ?? -1)),
        ("client_errors", Double(tally.errors.load(ordering: .relaxed))),
        ("stop_after_last_ms", last > 0 ? (Double(returned) - Double(last)) / 1e6 : .nan),
    ]
}
