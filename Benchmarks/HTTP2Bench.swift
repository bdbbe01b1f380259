import Foundation
import Mainspring
import MainspringHTTP

/// http2: `h2load` on `GET /hello` against Mainspring's HTTP/2 (h2c with prior knowledge, one
/// loop) and against `nghttpd --no-tls` (one worker, serving a file `hello`), 32 connections of
/// 16 streams each; and Mainspring's HTTP/1.1 on the same server with the same 32 connections,
/// one request at a time each (`h2load --h1`, no pipelining: how HTTP/1.1 clients talk), so that
/// the two Mainspring variants say what multiplexing buys. Each run is a fixed number of requests
/// (1,000,000 over HTTP/2, 300,000 over HTTP/1.1: a few seconds each); `requests_per_s` is
/// h2load's own rate, `cpu_us_per_request` the server's CPU time over the run divided by the
/// requests (Mainspring's loop thread; nghttpd's whole process).
let http2Scenario = Scenario(
    name: "http2",
    summary: "HTTP/2: h2load -c 32 -m 16 on /hello vs nghttpd (h2c), and Mainspring's HTTP/1.1 with the same 32 connections"
) { runs in
    guard let h2load = findExecutable("h2load") else {
        FileHandle.standardError.write(Data(
            "http2: h2load is missing (make bench-tools installs nghttp2-client): every variant is skipped\n".utf8))
        return []
    }
    var samples = Samples()
    let load = ["-c", "32", "-t", "1"]
    // In a smoke run, a hundred requests a connection over HTTP/2, twenty over HTTP/1.1.
    let multiplexed = load + ["-n", sized("1000000", smoke: "3200"), "-m", "16"]
    let oneAtATime = load + ["-n", sized("300000", smoke: "640"), "--h1", "-m", "1"]
    for _ in 0..<runs {
        try samples.add("mainspring", measureMainspring(h2load, multiplexed))
        try samples.add("mainspring-http1", measureMainspring(h2load, oneAtATime))
        try samples.add("nghttpd", {
            guard let nghttpd = OutsidePeer.nghttpd() else {
                FileHandle.standardError.write(Data("http2: nghttpd did not start (make bench-tools installs nghttp2-server)\n".utf8))
                return []
            }
            defer { nghttpd.stop() }
            let cpuBefore = nghttpd.cpuMicroseconds
            let result = try runH2load(h2load, multiplexed + ["http://127.0.0.1:\(nghttpd.port)/hello"])
            let cpu = Double(nghttpd.cpuMicroseconds &- cpuBefore) / result.requests
            return [("requests_per_s", result.rate), ("cpu_us_per_request", cpu)]
        }())
    }
    return samples.records(scenario: "http2")
}

/// Mainspring's server on one loop, `/hello`, under `h2load` with `arguments`.
private func measureMainspring(_ h2load: String, _ arguments: [String]) throws -> [(String, Double)] {
    let group = try! EventLoopGroup(loopCount: 1)
    var routes = HTTPRoutes()
    routes.get("/hello") { _ in .text("hello\n") }
    let server = try! HTTPServer(group: group, routes: routes)
    let loop = group.loops[0]
    defer {
        server.close()
        group.shutdownBlocking(gracePeriod: .seconds(2))
    }
    let cpuBefore = threadCPUNanoseconds(of: loop)
    let result = try runH2load(h2load, arguments + ["http://127.0.0.1:\(server.port)/hello"])
    let cpu = Double(threadCPUNanoseconds(of: loop) &- cpuBefore) / 1_000 / result.requests
    return [("requests_per_s", result.rate), ("cpu_us_per_request", cpu)]
}

/// What h2load measured: requests per second, and requests that succeeded.
struct H2loadResult {
    var rate: Double
    var requests: Double
}

/// Runs h2load and reads its summary ("finished in 3.00s, 41234.50 req/s, …", "requests: …
/// succeeded, …"). Throws, with h2load's output, when a request failed or no rate came out: the
/// scenario fails, the rest of the run goes on.
func runH2load(_ path: String, _ arguments: [String]) throws -> H2loadResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    do { try process.run() } catch { throw BenchError.variantFailed("h2load could not start: \(error)") }
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    let text = String(decoding: data, as: UTF8.self)
    func number(after marker: String, in line: Substring) -> Double? {
        guard let range = line.range(of: marker) else { return nil }
        return Double(line[range.upperBound...].prefix { $0.isNumber || $0 == "." })
    }
    var rate = 0.0, succeeded = 0.0, failed = 0.0
    for line in text.split(separator: "\n") {
        if line.hasPrefix("finished in"), let comma = line.range(of: "s, ") {
            rate = Double(line[comma.upperBound...].prefix { $0.isNumber || $0 == "." }) ?? 0
        }
        if line.hasPrefix("requests:") {
            succeeded = number(after: "done, ", in: line) ?? 0
            failed = number(after: "succeeded, ", in: line) ?? 0
        }
    }
    guard rate > 0, failed == 0 else {
        throw BenchError.variantFailed("h2load \(arguments.joined(separator: " ")) failed:\n\(text)")
    }
    return H2loadResult(rate: rate, requests: max(1, succeeded))
}

extension OutsidePeer {
    /// nghttpd (Debian's `nghttp2-server`) as the http2 scenario's peer: h2c (`--no-tls`), one
    /// worker, serving `hello` (6 bytes) from `.build/bench-nghttpd`. Nil when nghttpd is not
    /// installed or does not start.
    static func nghttpd() -> OutsidePeer? {
        guard let nghttpd = find("nghttpd", in: ["/usr/sbin/nghttpd", "/usr/bin/nghttpd"]) else { return nil }
        let folder = URL(fileURLWithPath: FileManager.default.currentDirectoryPath).appendingPathComponent(".build/bench-nghttpd")
        try? FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try? "hello\n".write(to: folder.appendingPathComponent("hello"), atomically: true, encoding: .utf8)
        return OutsidePeer(executable: nghttpd) { port in
            ["--no-tls", "-n", "1", "-a", "127.0.0.1", "-d", folder.path, String(port)]
        }
    }
}
