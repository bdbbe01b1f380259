import ExampleServices
import Foundation
import Mainspring
import MainspringTestSupport
import MainspringHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The HTTP server on a Unix socket, its `/metrics` read by Prometheus' own parser, `/healthz`
/// with a wedged loop, and `mainspring-daemon`'s HTTP port (the servers and curl of
/// HTTPTests.swift).
@Suite("HTTP server: Unix sockets, /metrics, /healthz, the daemon", .serialized)
struct HTTPServerEndpointTests {
    @Test("on a Unix socket: curl --unix-socket gets answers; the file has its mode and goes at close()")
    func unixSocket() async throws {
        let path = uniqueTestPath("http.sock")
        var configuration = HTTPServer.Configuration()
        configuration.unixPath = path
        configuration.unixMode = 0o600
        let server = try HTTPTestServer(configuration: configuration)
        var status = stat()
        #expect(lstat(path, &status) == 0 && status.st_mode & S_IFMT == S_IFSOCK && status.st_mode & 0o777 == 0o600,
                "mode \(String(status.st_mode, radix: 8))")
        #expect(server.port == 0)
        // Several requests on one connection, then a second connection: both loops serve it.
        let result = try await curlRequest(["--unix-socket", path, "http://localhost/hello", "http://localhost/healthz"])
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stdout == "hello\nok\n")
        let later = try await curlRequest(["--unix-socket", path, "http://localhost/later"])
        #expect(later.stdout.hasSuffix("on its loop: true true\n"), "\(later.summary)")
        // A live socket is not replaced: a second server on the path is refused, naming it.
        let live = #expect(throws: HTTPServerError.self) { _ = try HTTPTestServer(loops: 1, configuration: configuration) }
        if case .unixSocketPathInUse(let failedPath, let reason)? = live {
            #expect(failedPath == path && reason.contains("listening"), "\(reason)")
        } else {
            Issue.record("not unixSocketPathInUse: \(String(describing: live))")
        }
        #expect(lstat(path, &status) == 0, "the refused server removed the live server's file")
        await server.server.closeAndWait()
        #expect(access(path, F_OK) != 0, "the socket file outlived close()")
        await server.group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("on a Unix socket: a stale socket file is replaced, a regular file is left alone, a shutdown removes the file")
    func unixSocketFiles() async throws {
        // A stale socket: bound, then its socket closed (nobody listens; the file stays).
        let path = uniqueTestPath("stale-http.sock")
        let stale = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { bytes in
            for (i, byte) in path.utf8.enumerated() { bytes[i] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(stale, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        try #require(bound == 0 && listen(stale, 1) == 0)
        close(stale)
        var configuration = HTTPServer.Configuration()
        configuration.unixPath = path
        let server = try HTTPTestServer(loops: 1, configuration: configuration)
        let result = try await curlRequest(["--unix-socket", path, "http://localhost/hello"])
        #expect(result.stdout == "hello\n", "\(result.summary)")
        // A group shutdown without close(): the file goes with the server's last loop.
        await server.group.shutdown(gracePeriod: .seconds(2))
        #expect(access(path, F_OK) != 0, "the socket file outlived the group's shutdown")

        // A regular file at the path is neither replaced nor removed.
        let regular = uniqueTestPath("not-a-socket")
        try "keep me".write(toFile: regular, atomically: false, encoding: .utf8)
        configuration.unixPath = regular
        let refused = #expect(throws: HTTPServerError.self) { _ = try HTTPTestServer(loops: 1, configuration: configuration) }
        if case .unixSocketPathInUse(_, let reason)? = refused {
            #expect(reason.contains("regular file"), "\(reason)")
        } else {
            Issue.record("not unixSocketPathInUse: \(String(describing: refused))")
        }
        #expect(try String(contentsOfFile: regular, encoding: .utf8) == "keep me")

        // A path too long for sun_path: named once, with the limit.
        configuration.unixPath = "/tmp/" + String(repeating: "x", count: 120)
        #expect(throws: HTTPServerError.invalidAddress("\(configuration.unixPath!) (125 bytes; a Unix socket path holds at most 107)")) {
            _ = try HTTPTestServer(loops: 1, configuration: configuration)
        }
    }

    @Test("/metrics parses with the Prometheus client library, histograms are cumulative, counters end in _total")
    func metricsParse() async throws {
        let server = try HTTPTestServer()
        defer { server.stop() }
        _ = try await curlRequest(["\(server.base)/work?n=20", "\(server.base)/nope"])
        let scrape = try await curlRequest(["-i", "\(server.base)/metrics"])
        #expect(scrape.stdout.contains("Content-Type: text/plain; version=0.0.4"))
        let body = try await curlRequest(["\(server.base)/metrics"])
        let script = """
            import sys
            from prometheus_client.parser import text_string_to_metric_families
            text = sys.stdin.read()
            families = {f.name: f for f in text_string_to_metric_families(text)}
            seen = set()
            for line in text.splitlines():
                if line.startswith('# TYPE '):
                    name = line.split()[2]
                    assert name not in seen, 'family twice: ' + name
                    seen.add(name)
                    if line.split()[3] == 'counter':
                        assert name.endswith('_total'), 'counter without _total: ' + name
                    assert name.startswith('mainspring_'), name
            hist = families['mainspring_loop_queue_wait_seconds']
            assert hist.type == 'histogram'
            series = {}
            for s in hist.samples:
                key = (s.labels['loop'], s.labels['priority'])
                series.setdefault(key, {'buckets': [], 'count': None})
                if s.name.endswith('_bucket'):
                    series[key]['buckets'].append((float(s.labels['le']), s.value))
                elif s.name.endswith('_count'):
                    series[key]['count'] = s.value
            assert len(series) == 6, series.keys()
            for key, v in series.items():
                values = [b[1] for b in sorted(v['buckets'])]
                assert values == sorted(values), ('not cumulative', key, values)
                assert values[-1] == v['count'], ('+Inf != count', key)
            requests = {s.labels['code']: s.value for s in families['mainspring_http_requests'].samples if s.name.endswith('_total')}
            assert requests['2xx'] >= 1 and requests['4xx'] >= 1, requests
            assert len(families['mainspring_loop_callbacks'].samples) == 6
            print('families', len(families))
            """
        let parsed = try await runProgram("python3", arguments: ["-c", script], stdin: body.stdout)
        #expect(parsed.status == 0, "\(parsed.summary)")
        #expect(parsed.stdout.hasPrefix("families"))
    }

    @Test("/healthz: 503 naming the loop while one loop is wedged in a long callback, 200 before and after")
    func healthUnderStall() async throws {
        let server = try HTTPTestServer(loops: 2)
        defer { server.stop() }
        #expect(try await curlRequest(["\(server.base)/healthz"]).stdout == "ok\n")
        let released = Locked(false)
        server.group.loops[1].execute {
            // A blocking callback, as a careless handler would write it, until the test has seen
            // the 503 (at most 30 s: with a build beside the suite, 10 s passed before a probe's
            // curl got its answer, and the loop was healthy again by then).
            let start = ContinuousClock.now
            while !released.value && ContinuousClock.now - start < .seconds(30) { usleep(1_000) }
        }
        var saw503 = ""
        for _ in 0..<40 where saw503.isEmpty {
            let probe = try await curlRequest(["--max-time", "1", "-w", " %{http_code}", "\(server.base)/healthz"])
            if probe.stdout.hasSuffix(" 503") { saw503 = probe.stdout }
            try await Task.sleep(for: .milliseconds(100))
        }
        released.withLock { $0 = true }
        #expect(saw503.hasPrefix("loop 1 is stuck"), "\(saw503)")
        var healthyAgain = false
        for _ in 0..<40 where !healthyAgain {
            healthyAgain = try await curlRequest(["--max-time", "1", "\(server.base)/healthz"]).stdout == "ok\n"
            if !healthyAgain { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(healthyAgain)
    }

    @Test("mainspring-daemon --http-port 0: prints the bound port, serves /healthz, /echo (HTTP/1.1 and h2c), /work and /metrics, exits 0 on SIGTERM")
    func daemonHTTPSide() async throws {
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--http-port", "0", "--loops", "2"])
        _ = await daemon.readLine(timeout: .seconds(30))
        let banner = try #require(daemon.readLine(timeout: .seconds(30)), "no HTTP banner")
        #expect(banner.hasPrefix("http listening on 127.0.0.1:"), "\(banner)")
        let port = try #require(banner.split(separator: ":").last.flatMap { UInt16($0) })
        let base = "http://127.0.0.1:\(port)"
        #expect(try await curlRequest(["\(base)/healthz"]).stdout == "ok\n")
        #expect(try await curlRequest(["-d", "ping", "\(base)/echo"]).stdout == "ping")
        // HTTP/2 on the same port: h2c with prior knowledge.
        let h2 = try await curlRequest(["--http2-prior-knowledge", "-w", " %{http_version}", "-d", "ping", "\(base)/echo"])
        #expect(h2.stdout == "ping 2", "\(h2.summary)")
        let work = try await curlRequest(["\(base)/work?n=50"])
        #expect(work.stdout.hasSuffix("result 50 \(WorkUnit.checksum(chunks: 50))\n"), "\(work.stdout)")
        let metrics = try await curlRequest(["\(base)/metrics"])
        #expect(metrics.stdout.contains("mainspring_loop_queue_wait_seconds_bucket{loop=\"1\",priority=\"input\",le=\"+Inf\"}"))
        #expect(metrics.stdout.contains("mainspring_http_requests_total{code=\"2xx\"}"))
        let bad = try await curlRequest(["-o", "/dev/null", "-w", "%{http_code}", "\(base)/work?n=zero"])
        #expect(bad.stdout == "400")
        daemon.send(SIGTERM)
        let exit = await daemon.waitForExit(timeout: .seconds(30))
        #expect(exit.status == 0 && !exit.crashedBySignal, "\(exit.summary)")
    }
}
