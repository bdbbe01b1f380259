import CTLSBaselines
import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP
import MainspringTLS

/// tls: the daemon's line service over TLS on one loop (`LineService` with a `TLSServerContext`)
/// and HTTPS (`HTTPServer` with the same context) against plain-C libevent servers on
/// `bufferevent_openssl` (evhttp's bevcb for HTTPS), on one thread each. RSA-2048 certificates
/// made by the openssl command at bench time; TLS 1.3, no session resumption: every connection
/// is a full handshake. The same blocking OpenSSL client (C) drives both servers.
///
/// - `handshakes_per_s`: 4 client threads connecting, handshaking, one ECHO, closing, back to back.
/// - `requests_per_s`, `p99_ms`: 32 established connections, windows of 16 pipelined ECHOs.
/// - `https_requests_per_s`, `https_p99_ms`: `wrk` over HTTPS on `/hello`, 32 keep-alive connections.
/// - `storm_echo_p99_ms`, `storm_handshakes_per_s`: ECHO latency on 8 established connections
///   (one request in flight each, 1 ms apart) while one thread keeps 64 non-blocking
///   handshakes in flight (`ms_tls_storm`) — a handshake storm. Mainspring runs handshake steps as `.normal` loop work, after input;
///   libevent runs them inside the readiness callbacks, in the same pass as the echoes.
let tlsScenario = Scenario(
    name: "tls",
    summary: "TLS line service and HTTPS vs C bufferevent_openssl: handshakes/s, echo, wrk https, echo p99 in a handshake storm"
) { runs in
    guard let openssl = findExecutable("openssl") else {
        FileHandle.standardError.write(Data(
            "tls: the openssl command is missing (apt-get install openssl): every variant is skipped\n".utf8))
        return []
    }
    let wrk = findExecutable("wrk")
    let files = try BenchCertificate(openssl: openssl)
    defer { files.remove() }
    var samples = Samples()
    let seconds = sized(2, smoke: 1)  // wrk's shortest run is a second
    for _ in 0..<runs {
        samples.add("mainspring", {
            let context = try! TLSServerContext(configuration: .init(certificateFile: files.certificate, keyFile: files.key))
            let group = try! EventLoopGroup(loopCount: 1)
            let service = try! LineService(group: group, options: .init(idleTimeout: nil), tls: context)
            var figures = measureTLSEcho(port: service.port, caFile: files.certificate)
            service.shutdown(gracePeriod: .seconds(1))
            if let wrk {
                let group = try! EventLoopGroup(loopCount: 1)
                defer { group.shutdownBlocking(gracePeriod: .seconds(2)) }
                var routes = HTTPRoutes()
                routes.get("/hello") { _ in .text("hello\n") }
                let server = try! HTTPServer(group: group, routes: routes, tls: context)
                let result = runWrk(wrk, ["-t2", "-c32", "-d\(seconds)s", "--latency", "https://127.0.0.1:\(server.port)/hello"])
                figures += [("https_requests_per_s", result.rate), ("https_p99_ms", result.p99)]
                server.close()
            }
            return figures
        }())
        samples.add("libevent-c", {
            var port: UInt16 = 0
            guard let echo = ms_tls_echo_start(files.certificate, files.key, &port) else { return [] }
            var figures = measureTLSEcho(port: port, caFile: files.certificate)
            ms_tls_server_stop(echo)
            if let wrk, let http = ms_tls_http_start(files.certificate, files.key, &port) {
                let result = runWrk(wrk, ["-t2", "-c32", "-d\(seconds)s", "--latency", "https://127.0.0.1:\(port)/hello"])
                figures += [("https_requests_per_s", result.rate), ("https_p99_ms", result.p99)]
                ms_tls_server_stop(http)
            }
            return figures
        }())
    }
    return samples.records(scenario: "tls")
}

/// Established connections probing latency during the storm.
private let stormProbes = 8

/// The line-service figures of one server (see `tlsScenario`).
private func measureTLSEcho(port: UInt16, caFile: String) -> [(String, Double)] {
    let duration: UInt64 = sized(1_500_000_000, smoke: 100_000_000)
    // Handshakes back to back.
    let handshakes = Guarded(0)
    runThreads(4, for: duration) { _, deadline in
        var count = 0
        while nowNanoseconds() < deadline {
            guard let client = TLSBenchClient(port: port, caFile: caFile), client.send("ECHO x\n"), client.readLine()
            else { continue }
            count += 1
        }
        handshakes.withLock { $0 += count }
    }
    // Established connections, pipelined.
    let echoes = Guarded<(count: Int, latencies: [Double])>((0, []))
    runThreads(32, for: duration) { _, deadline in
        guard let client = TLSBenchClient(port: port, caFile: caFile) else { return }
        var latencies: [Double] = []
        let window = String(repeating: "ECHO pipelined request\n", count: 16)
        while nowNanoseconds() < deadline {
            let sent = nowNanoseconds()
            guard client.send(window) else { return }
            for _ in 0..<16 {
                guard client.readLine() else { return }
                latencies.append(Double(nowNanoseconds() - sent) / 1e6)
            }
        }
        echoes.withLock {
            $0.count += latencies.count
            $0.latencies += latencies
        }
    }
    // Echo latency in a handshake storm: one thread keeps 64 non-blocking handshakes in flight.
    let storm = Guarded<(handshakes: Int, latencies: [Double])>((0, []))
    runThreads(1 + stormProbes, for: duration) { index, deadline in
        if index == 0 {
            let count = Int(ms_tls_storm(port, caFile, 64, deadline))
            storm.withLock { $0.handshakes += count }
        } else {
            guard let client = TLSBenchClient(port: port, caFile: caFile) else { return }
            var latencies: [Double] = []
            while nowNanoseconds() < deadline {
                let sent = nowNanoseconds()
                guard client.send("ECHO latency probe\n"), client.readLine() else { return }
                latencies.append(Double(nowNanoseconds() - sent) / 1e6)
                usleep(1_000)
            }
            storm.withLock { $0.latencies += latencies }
        }
    }
    let seconds = Double(duration) / 1e9
    let (count, latencies) = echoes.withLock { $0 }
    let (stormHandshakes, stormLatencies) = storm.withLock { $0 }
    return [("handshakes_per_s", Double(handshakes.withLock { $0 }) / seconds),
            ("requests_per_s", Double(count) / seconds), ("p99_ms", percentile(latencies, 0.99)),
            ("storm_echo_p99_ms", percentile(stormLatencies, 0.99)),
            ("storm_handshakes_per_s", Double(stormHandshakes) / seconds)]
}

/// Runs `count` threads of `body` (each given its index and the shared deadline, `duration` ns
/// from now) and waits for all of them.
private func runThreads(_ count: Int, for duration: UInt64, _ body: @escaping @Sendable (Int, UInt64) -> Void) {
    let deadline = nowNanoseconds() + duration
    let finished = DispatchGroup()
    for index in 0..<count {
        finished.enter()
        Thread {
            body(index, deadline)
            finished.leave()
        }.start()
    }
    finished.wait()
}

/// A blocking TLS client over `ms_tls_client_*` (OpenSSL), reading lines.
final class TLSBenchClient {
    private let handle: UnsafeMutableRawPointer
    private var buffer: [UInt8] = []
    private var start = 0

    init?(port: UInt16, caFile: String) {
        guard let handle = ms_tls_client_connect(port, caFile) else { return nil }
        self.handle = handle
    }

    deinit { ms_tls_client_close(handle) }

    func send(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { ms_tls_client_write(handle, $0.baseAddress!, Int32($0.count)) == 0 }
    }

    /// Reads through the next newline; false at the end or on failure.
    func readLine() -> Bool {
        while true {
            if let newline = buffer[start...].firstIndex(of: 0x0A) {
                consume(through: newline)
                return true
            }
            guard fill() else { return false }
        }
    }

    /// The next line, without its newline (`--counts` checks each reply); nil at the end or on
    /// failure.
    func readLineText() -> Substring? {
        while true {
            if let newline = buffer[start...].firstIndex(of: 0x0A) {
                let line = Substring(decoding: buffer[start..<newline], as: UTF8.self)
                consume(through: newline)
                return line
            }
            guard fill() else { return nil }
        }
    }

    private func consume(through newline: Int) {
        start = newline + 1
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
    }

    /// One read into the buffer; false at the end or on failure.
    private func fill() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16_384)
        let n = chunk.withUnsafeMutableBytes { ms_tls_client_read(handle, $0.baseAddress!, Int32($0.count)) }
        if n <= 0 { return false }
        buffer += chunk[0..<Int(n)]
        return true
    }
}

/// A self-signed RSA-2048 certificate for 127.0.0.1 and localhost (its own trust root), made
/// with the openssl command in a fresh directory.
struct BenchCertificate {
    let directory: String
    var certificate: String { directory + "/certificate.pem" }
    var key: String { directory + "/key.pem" }

    /// The files made earlier in `directory`.
    init(directory: String) { self.directory = directory }

    init(openssl: String) throws {
        var template = Array((NSTemporaryDirectory() + "/mainspring-tls-bench.XXXXXX").utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw BenchError.usage("tls: cannot make a temporary directory")
        }
        directory = String(cString: made)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: openssl)
        process.arguments = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                             "-keyout", directory + "/key.pem", "-out", directory + "/certificate.pem"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw BenchError.usage("tls: openssl req failed (status \(process.terminationStatus))")
        }
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }
}
