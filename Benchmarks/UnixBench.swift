import CBaselines
import ExampleServices
import Foundation
import Mainspring

/// unix: the daemon's line service on one loop answering `ECHO` — the callback `LineService`,
/// the daemon scenario's `mainspring`, over TCP loopback (`mainspring-tcp`) and over a Unix
/// stream socket (`mainspring-unix`); the async `AsyncLineService` (the core of
/// `mainspring-daemon --unix`, the daemon scenario's `mainspring-async`) over the Unix socket
/// (`mainspring-async-unix`) — vs the plain-C bufferevent echo service of the daemon scenario
/// on a Unix socket (`libevent-c-unix`). The daemon scenario's load: 32 client threads, one
/// connection each, windows of 16 pipelined requests, for 1.5 s.
let unixScenario = Scenario(
    name: "unix",
    summary: "daemon ECHO over a Unix socket vs TCP loopback vs C bufferevent echo on a Unix socket"
) { runs in
    var samples = Samples()
    let duration = Duration.milliseconds(sized(1_500, smoke: 100))
    let directory = NSTemporaryDirectory() + "mainspring-bench-unix-\(getpid())"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let path = directory + "/echo.sock"
    func figures(_ load: LoadResult) -> [(String, Double)] {
        [("requests_per_s", load.rate), ("p99_ms", load.p99), ("cpu_us_per_request", load.cpuPerRequest)]
    }
    for _ in 0..<runs {
        samples.add("mainspring-tcp", {
            let group = try! EventLoopGroup(loopCount: 1)
            let service = try! LineService(group: group, options: .init(idleTimeout: nil))
            let port = service.port
            let load = loadTest(connect: { BenchClient(port: port) }, duration: duration)
            service.shutdown(gracePeriod: .seconds(1))
            return figures(load)
        }())
        samples.add("mainspring-unix", {
            let group = try! EventLoopGroup(loopCount: 1)
            let service = try! LineService(group: group, endpoint: .unix(path: path), options: .init(idleTimeout: nil))
            let load = loadTest(connect: { BenchClient(unixPath: path) }, duration: duration)
            service.shutdown(gracePeriod: .seconds(1))
            return figures(load)
        }())
        samples.add("mainspring-async-unix", {
            let group = try! EventLoopGroup(loopCount: 1)
            let service = blockingAwait {
                try! await AsyncLineService(group: group, endpoint: .unix(path: path), options: .init(idleTimeout: nil))
            }
            let load = loadTest(connect: { BenchClient(unixPath: path) }, duration: duration)
            blockingAwait { await service.shutdown(gracePeriod: .seconds(1)) }
            return figures(load)
        }())
        try samples.add("libevent-c-unix", {
            guard let handle = ms_baseline_echo_start_unix(path) else {
                throw BenchError.variantFailed("unix: the C echo service cannot listen on \(path)")
            }
            let load = loadTest(connect: { BenchClient(unixPath: path) }, duration: duration)
            ms_baseline_echo_stop(handle)
            unlink(path)
            return figures(load)
        }())
    }
    return samples.records(scenario: "unix")
}
