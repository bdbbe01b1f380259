import CBaselines
import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP

/// http: Mainspring's HTTP server (one loop, the daemon's routes plus `/hello`) against a
/// plain-C evhttp server on one thread and nginx (one worker, `return 200`), all driven by
/// `wrk --latency` with 32 keep-alive connections on `GET /hello`. Then, for the first two, the
/// p99 of `GET /healthz` (wrk, 4 connections) while another client keeps `/work` requests of
/// about 20 ms of CPU each running back to back: fed through a `Feeder` on Mainspring,
/// computed inline in the callback in C. (nginx has no `/work`: its record is `/hello` only.)
let httpScenario = Scenario(
    name: "http",
    summary: "HTTP server vs plain-C evhttp and nginx: wrk on /hello (32 connections); /healthz p99 while /work runs"
) { runs in
    guard let wrk = findExecutable("wrk") else {
        FileHandle.standardError.write(Data("http: wrk is missing (make bench installs it): every variant is skipped\n".utf8))
        return []
    }
    var samples = Samples()
    let seconds = sized(3, smoke: 1)  // wrk's shortest run is a second
    let workChunks = 400  // WorkUnit ≈ 50 µs: about 20 ms per request
    for _ in 0..<runs {
        samples.add("mainspring", {
            let group = try! EventLoopGroup(loopCount: 1)
            let exporter = LoopMetricsExporter(group: group)
            var routes = HTTPService.routes(group: group, exporter: exporter)
            routes.get("/hello") { _ in .text("hello\n") }
            let server = try! HTTPServer(group: group, routes: routes)
            let loop = group.loops[0]
            let figures = measure(wrk: wrk, port: server.port, seconds: seconds, workChunks: workChunks,
                                  serverCPU: { threadCPUNanoseconds(of: loop) })
            server.close()
            group.shutdownBlocking(gracePeriod: .seconds(2))
            return figures
        }())
        samples.add("libevent-c", {
            var port: UInt16 = 0
            let handle = ms_baseline_http_start(&port)
            let figures = measure(wrk: wrk, port: port, seconds: seconds, workChunks: workChunks,
                                  serverCPU: { ms_baseline_http_cpu_ns(handle) })
            ms_baseline_http_stop(handle)
            return figures
        }())
        samples.add("nginx", {
            guard let nginx = OutsidePeer.nginx() else {
                FileHandle.standardError.write(Data("http: nginx did not start (make bench-tools installs nginx-light)\n".utf8))
                return []
            }
            let cpuBefore = nginx.cpuMicroseconds
            let hello = runWrk(wrk, ["-t2", "-c32", "-d\(seconds)s", "--latency", "http://127.0.0.1:\(nginx.port)/hello"])
            let cpuPerRequest = Double(nginx.cpuMicroseconds &- cpuBefore) / hello.requests
            nginx.stop()
            return [("requests_per_s", hello.rate), ("p99_ms", hello.p99), ("cpu_us_per_request", cpuPerRequest)]
        }())
    }
    return samples.records(scenario: "http")
}

private func measure(wrk: String, port: UInt16, seconds: Int, workChunks: Int, serverCPU: () -> UInt64)
    -> [(String, Double)]
{
    let cpuBefore = serverCPU()
    let hello = runWrk(wrk, ["-t2", "-c32", "-d\(seconds)s", "--latency", "http://127.0.0.1:\(port)/hello"])
    let cpuPerRequest = Double(serverCPU() &- cpuBefore) / 1_000 / hello.requests
    let stop = Guarded(false)
    let worker = Thread {
        while !stop.withLock({ $0 }) {
            guard let client = BenchClient(port: port) else { return }
            while !stop.withLock({ $0 }) {
                client.send("GET /work?n=\(workChunks) HTTP/1.1\r\nHost: bench\r\n\r\n")
                guard readHTTPResponse(client) else { break }
            }
        }
    }
    worker.start()
    usleep(sized(100_000, smoke: 20_000))
    let busy = runWrk(wrk, ["-t1", "-c4", "-d\(seconds)s", "--latency", "http://127.0.0.1:\(port)/healthz"])
    stop.withLock { $0 = true }
    usleep(200_000)
    return [("requests_per_s", hello.rate), ("p99_ms", hello.p99), ("cpu_us_per_request", cpuPerRequest),
            ("busy_health_p99_ms", busy.p99)]
}

/// CPU time (user and system, ns) `loop`'s thread has used so far, read on that thread.
func threadCPUNanoseconds(of loop: EventLoop) -> UInt64 {
    let result = Guarded<UInt64>(0)
    let done = DispatchSemaphore(value: 0)
    loop.execute(priority: .input) {
        var now = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
        result.withLock { $0 = UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec) }
        done.signal()
    }
    done.wait()
    return result.withLock { $0 }
}

/// Reads one response (sized or chunked) from a blocking client; false on error or EOF.
func readHTTPResponse(_ client: BenchClient) -> Bool {
    var chunked = false
    var length = 0
    while let line = client.readLine() {
        let text = line.hasSuffix("\r") ? line.dropLast() : line
        if text.isEmpty { break }
        let lower = text.lowercased()
        if lower.hasPrefix("transfer-encoding:") && lower.contains("chunked") { chunked = true }
        if lower.hasPrefix("content-length:") { length = Int(lower.dropFirst(15).trimmingCharacters(in: .whitespaces)) ?? 0 }
    }
    if chunked {
        while let line = client.readLine() {
            let size = Int(line.hasSuffix("\r") ? String(line.dropLast()) : String(line), radix: 16) ?? -1
            if size < 0 { return false }
            if size == 0 { return client.readLine() != nil }
            guard client.readBytes(size + 2) else { return false }
        }
        return false
    }
    return client.readBytes(length)
}

struct WrkResult {
    var rate = Double.nan
    var p99 = Double.nan
    /// Requests completed in all (`N requests in …`).
    var requests = Double.nan
}

/// Runs wrk and reads `Requests/sec`, the requests completed and the 99% latency (in ms).
func runWrk(_ path: String, _ arguments: [String]) -> WrkResult {
    guard let text = standardOutput(of: path, arguments) else { return WrkResult() }
    var result = WrkResult()
    for line in text.split(separator: "\n") {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        if fields.first == "Requests/sec:", fields.count > 1 { result.rate = Double(fields[1]) ?? .nan }
        if fields.first == "99%", fields.count > 1 { result.p99 = milliseconds(String(fields[1])) }
        if fields.count > 2, fields[1] == "requests", fields[2] == "in" { result.requests = Double(fields[0]) ?? .nan }
    }
    return result
}

/// wrk's latency text (`812.00us`, `1.23ms`, `2.00s`) in milliseconds.
private func milliseconds(_ text: String) -> Double {
    for (suffix, factor) in [("us", 0.001), ("ms", 1.0), ("s", 1000.0)] where text.hasSuffix(suffix) {
        return (Double(text.dropLast(suffix.count)) ?? .nan) * factor
    }
    return .nan
}

func findExecutable(_ name: String) -> String? {
    for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
        let candidate = "\(directory)/\(name)"
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
    }
    return nil
}

// MARK: Counted runs (`mainspring-bench --counts http`)

/// The request of the counted http runs: `GET /hello`, keep-alive, one at a time.
private let helloRequest = "GET /hello HTTP/1.1\r\nHost: bench\r\n\r\n"
private let helloWarmup = 200

private func helloRequests(_ client: BenchClient, _ count: Int) throws {
    for _ in 0..<count {
        client.send(helloRequest)
        guard readHTTPResponse(client) else { throw BenchError.usage("http counts: bad or no response") }
    }
}

/// The server of the `http` scenario (one loop, the daemon's routes plus `/hello`), one
/// keep-alive client: warm-up requests, then `items` requests while the loop spins inside the
/// counted region (a nested spin in a posted closure: only the loop's thread is counted).
func countedHTTPMainspring(_ items: Int, configuration: EventLoop.Configuration) throws -> [String: Double] {
    let group = try EventLoopGroup(loopCount: 1, configuration: configuration)
    let exporter = LoopMetricsExporter(group: group)
    var routes = HTTPService.routes(group: group, exporter: exporter)
    routes.get("/hello") { _ in .text("hello\n") }
    let server = try HTTPServer(group: group, routes: routes)
    defer {
        server.close()
        group.shutdownBlocking(gracePeriod: .seconds(5))
    }
    guard let client = BenchClient(port: server.port) else { throw BenchError.usage("http counts: no connection") }
    try helloRequests(client, helloWarmup)
    let loop = group.loops[0]
    final class Flag: @unchecked Sendable { var done = false }
    let flag = Flag()
    let started = DispatchSemaphore(value: 0)
    let finished = DispatchSemaphore(value: 0)
    let polls = Guarded((before: 0, after: 0))
    loop.execute {
        polls.withLock { $0.before = loop.metrics.polls }
        countedRegion {
            started.signal()
            loop.spin(until: { flag.done })
        }
        polls.withLock { $0.after = loop.metrics.polls }
        finished.signal()
    }
    started.wait()
    try helloRequests(client, items)
    loop.execute { flag.done = true }
    finished.wait()
    return ["polls": Double(polls.withLock { $0.after - $0.before })]
}

/// The C evhttp server, one keep-alive client; its thread's whole dispatch is counted.
func countedHTTPC(_ items: Int) throws -> [String: Double] {
    var port: UInt16 = 0
    let handle = ms_count_http_start(&port)
    defer { ms_baseline_http_stop(handle) }
    guard let client = BenchClient(port: port) else { throw BenchError.usage("http counts: no connection") }
    try helloRequests(client, helloWarmup)
    try helloRequests(client, items)
    return [:]
}
