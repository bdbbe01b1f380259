import CBaselines
import Foundation
import Mainspring
import MainspringHTTP

/// http-client: requests per second of three clients against one server — the plain-C evhttp
/// server of the `http` scenario (`ms_baseline_http_start`, one thread), `GET /hello` — with 32
/// keep-alive requests in flight, so that only the client differs:
///
/// - `mainspring`: one `HTTPClient` on a loop of its own (`maxConnectionsPerHost` 32), 32 tasks
///   that prefer that loop, each `get` after `get`.
/// - `wrk`: `wrk -t1 -c32` (one thread of epoll and a request prepared once: a load
///   generator, the ceiling of a client).
/// - `libevent-c`: 32 evhttp_connections on one event_base, each re-issuing its request from the
///   completion callback (`ms_baseline_http_client`).
///
/// And HTTP/2 against HTTP/1.1, both against Mainspring's own server (one loop, on a thread of
/// its own; it speaks both), 32 tasks each:
///
/// - `mainspring-http1-pool8`: `HTTPClient` with its default pool, 8 connections.
/// - `mainspring-h2`: `HTTPClient` with `http2PriorKnowledge`: one connection, 32 streams.
///
/// Each counts the responses completed in 3 s after a 300 ms warm-up (wrk: its own 3 s run,
/// connects included). `server_busy_pct`: the server thread's CPU time over the measured time —
/// near 100 the server is the limit, not the client.
let httpClientScenario = Scenario(
    name: "http-client",
    summary: "HTTPClient vs wrk vs C evhttp client: GET /hello, 32 keep-alive requests in flight, one C evhttp server"
) { runs in
    let wrk = findExecutable("wrk")
    if wrk == nil {
        FileHandle.standardError.write(Data("http-client: wrk is missing (make bench installs it): its variant is skipped\n".utf8))
    }
    var samples = Samples()
    for _ in 0..<runs {
        samples.add("mainspring", againstCServer { port in httpClientRequests(port: port) })
        if let wrk {
            samples.add("wrk", againstCServer { port in
                let started = nowNanoseconds()
                let result = runWrk(wrk, ["-t1", "-c\(clientConcurrency)", "-d\(max(1, clientMilliseconds / 1000))s",
                                          "http://127.0.0.1:\(port)/hello"])
                return (result.rate, Double(nowNanoseconds() - started) / 1e9)
            })
        }
        samples.add("libevent-c", againstCServer { port in
            var seconds = 0.0
            var failures: Int64 = 0
            let count = ms_baseline_http_client(port, Int32(clientConcurrency), Int32(clientWarmupMilliseconds),
                                                Int32(clientMilliseconds), &seconds, &failures)
            return (failures == 0 && count > 0 ? Double(count) / seconds : .nan,
                    Double(clientWarmupMilliseconds + clientMilliseconds) / 1e3)
        })
        samples.add("mainspring-http1-pool8", againstMainspringServer { port in
            httpClientRequests(port: port, configuration: .init(maxConnectionsPerHost: 8))
        })
        samples.add("mainspring-h2", againstMainspringServer { port in
            var configuration = HTTPClient.Configuration()
            configuration.http2PriorKnowledge = true
            return httpClientRequests(port: port, configuration: configuration)
        })
    }
    return samples.records(scenario: "http-client")
}

private let clientConcurrency = 32
private var clientWarmupMilliseconds: Int { sized(300, smoke: 20) }
private var clientMilliseconds: Int { sized(3_000, smoke: 100) }

/// Starts the C server, runs `client` against its port (which returns its rate and the seconds
/// it ran), stops the server: the figures and the server's share of one core meanwhile.
private func againstCServer(_ client: (UInt16) -> (rate: Double, seconds: Double)) -> [(String, Double)] {
    var port: UInt16 = 0
    let server = ms_baseline_http_start(&port)
    let cpuBefore = ms_baseline_http_cpu_ns(server)
    let (rate, seconds) = client(port)
    let busy = Double(ms_baseline_http_cpu_ns(server) &- cpuBefore) / 1e9 / seconds * 100
    ms_baseline_http_stop(server)
    return [("requests_per_s", rate), ("server_busy_pct", busy)]
}

/// Mainspring's server on one loop of its own (HTTP/1.1 and h2c), `/hello`, for `client`: the
/// figures and the server loop's share of one core meanwhile.
private func againstMainspringServer(_ client: (UInt16) -> (rate: Double, seconds: Double)) -> [(String, Double)] {
    let group = try! EventLoopGroup(loopCount: 1)
    var routes = HTTPRoutes()
    routes.get("/hello") { _ in .text("hello\n") }
    let server = try! HTTPServer(group: group, routes: routes)
    let loop = group.loops[0]
    let cpuBefore = threadCPUNanoseconds(of: loop)
    let (rate, seconds) = client(server.port)
    let busy = Double(threadCPUNanoseconds(of: loop) &- cpuBefore) / 1e9 / seconds * 100
    server.close()
    group.shutdownBlocking(gracePeriod: .seconds(2))
    return [("requests_per_s", rate), ("server_busy_pct", busy)]
}

/// HTTPClient: `clientConcurrency` tasks on the client's loop, `get` after `get`; the responses
/// completed after the warm-up and before the end, per second. Nan if any request failed.
private func httpClientRequests(port: UInt16, configuration: HTTPClient.Configuration? = nil)
    -> (rate: Double, seconds: Double)
{
    let group = try! EventLoopGroup(loopCount: 1)
    defer { group.shutdownBlocking(gracePeriod: .seconds(2)) }
    let loop = group.loops[0]
    let client = HTTPClient(loop: loop, configuration: configuration ?? .init(maxConnectionsPerHost: clientConcurrency))
    let url = "http://127.0.0.1:\(port)/hello"
    let started = nowNanoseconds()
    let measuredFrom = started + UInt64(clientWarmupMilliseconds) * 1_000_000
    let end = measuredFrom + UInt64(clientMilliseconds) * 1_000_000
    let (completed, failed) = blockingAwait {
        await withTaskGroup(of: (Int, Int).self) { tasks in
            for _ in 0..<clientConcurrency {
                tasks.addTask(executorPreference: loop) {
                    var completed = 0
                    var failed = 0
                    while true {
                        do {
                            let response = try await client.get(url)
                            if response.status != 200 { failed += 1 }
                        } catch {
                            failed += 1
                        }
                        let now = nowNanoseconds()
                        if now >= end { break }
                        if now >= measuredFrom { completed += 1 }
                    }
                    return (completed, failed)
                }
            }
            return await tasks.reduce(into: (0, 0)) { $0.0 += $1.0; $0.1 += $1.1 }
        }
    }
    client.shutdown()
    let seconds = Double(clientMilliseconds) / 1e3
    return (failed == 0 && completed > 0 ? Double(completed) / seconds : .nan, Double(end - started) / 1e9)
}

// MARK: Counted runs (`mainspring-bench --counts http-client`)

/// Warm-up requests before the counted ones (connection made, pool and buffers grown).
private let countedClientWarmup = 200

/// HTTPClient on a loop of its own against the C server, one request at a time: warm-up
/// requests, then `items` requests from a task on the loop while the loop spins inside the
/// counted region (only the client's loop thread is counted, not the server's).
func countedHTTPClientMainspring(_ items: Int, configuration: EventLoop.Configuration) throws -> [String: Double] {
    var port: UInt16 = 0
    let server = ms_baseline_http_start(&port)
    defer { ms_baseline_http_stop(server) }
    let group = try EventLoopGroup(loopCount: 1, configuration: configuration)
    defer { group.shutdownBlocking(gracePeriod: .seconds(5)) }
    let loop = group.loops[0]
    let client = HTTPClient(loop: loop)
    defer { client.shutdown() }
    let url = "http://127.0.0.1:\(port)/hello"
    final class Run: @unchecked Sendable {
        var done = false
        var failed = 0
    }
    let run = Run()
    let finished = DispatchSemaphore(value: 0)
    loop.execute {
        let requests: @Sendable (Int) async -> Void = { count in
            for _ in 0..<count {
                let status = (try? await client.get(url))?.status
                if status != 200 { run.failed += 1 }
            }
        }
        // The warm-up, then the counted requests: each a task on the loop, run by a spin.
        run.done = false
        Task(executorPreference: loop) {
            await requests(countedClientWarmup)
            run.done = true
        }
        loop.spin(until: { run.done })
        run.done = false
        countedRegion {
            Task(executorPreference: loop) {
                await requests(items)
                run.done = true
            }
            loop.spin(until: { run.done })
        }
        finished.signal()
    }
    finished.wait()
    if run.failed > 0 { throw BenchError.usage("http-client counts: \(run.failed) requests failed") }
    return [:]
}

/// The C evhttp client, one connection, one request at a time (`ms_count_http_client`).
func countedHTTPClientC(_ items: Int) throws -> [String: Double] {
    var port: UInt16 = 0
    let server = ms_baseline_http_start(&port)
    defer { ms_baseline_http_stop(server) }
    let failed = ms_count_http_client(port, Int64(countedClientWarmup), Int64(items))
    if failed > 0 { throw BenchError.usage("http-client counts: \(failed) requests failed") }
    return [:]
}
