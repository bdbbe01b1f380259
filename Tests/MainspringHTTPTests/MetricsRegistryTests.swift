import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringHTTP
import Testing

/// promtool (Debian's `prometheus` package), or nil.
private let promtool: String? = {
    let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":").map(String.init)
    return directories.map { "\($0)/promtool" }.first { FileManager.default.isExecutableFile(atPath: $0) }
}()

/// The text `registry` adds to a scrape.
private func rendered(_ registry: MetricsRegistry) -> String {
    var text = PrometheusText()
    registry.render(into: &text)
    return text.output
}

@Suite("The application's metrics: MetricsRegistry")
struct MetricsRegistryTests {
    @Test("counters, gauges and histograms with labels render in the Prometheus text format, in the order registered")
    func rendering() throws {
        let registry = MetricsRegistry()
        let requests = try registry.counter("app_requests_total", help: "Requests.", labels: ["command", "outcome"])
        let depth = try registry.gauge("app_queue_depth", help: "Queued \"jobs\"\nnow.")
        let latency = try registry.histogram("app_latency_seconds", help: "Latency.", buckets: [0.01, 0.1, 1])
        requests.series("GET", "ok").increment()
        requests.series("GET", "ok").increment(by: 2)
        requests.series("SET", "err\"or").increment()
        requests.series("GET", "ok").increment(by: -5)  // a counter never goes down
        depth.set(4)
        depth.add(-1.5)
        for value in [0.005, 0.01, 0.05, 0.5, 2, 30] { latency.observe(value) }
        latency.observe(.milliseconds(20))
        #expect(rendered(registry) == """
            # HELP app_requests_total Requests.
            # TYPE app_requests_total counter
            app_requests_total{command="GET",outcome="ok"} 3
            app_requests_total{command="SET",outcome="err\\"or"} 1
            # HELP app_queue_depth Queued "jobs"\\nnow.
            # TYPE app_queue_depth gauge
            app_queue_depth 2.5
            # HELP app_latency_seconds Latency.
            # TYPE app_latency_seconds histogram
            app_latency_seconds_bucket{le="0.01"} 2
            app_latency_seconds_bucket{le="0.1"} 4
            app_latency_seconds_bucket{le="1"} 5
            app_latency_seconds_bucket{le="+Inf"} 7
            app_latency_seconds_sum 32.585
            app_latency_seconds_count 7

            """)
    }

    @Test("registration: names and labels checked, a counter ends in _total, the same metric twice is the same, another is an error")
    func registration() throws {
        let registry = MetricsRegistry()
        #expect(throws: MetricsError.invalidName("app_requests", "a counter's name ends in _total")) {
            _ = try registry.counter("app_requests", help: "")
        }
        #expect(throws: MetricsError.self) { _ = try registry.gauge("9lives", help: "") }
        #expect(throws: MetricsError.self) { _ = try registry.gauge("app-dash", help: "") }
        #expect(throws: MetricsError.self) { _ = try registry.gauge("app_ok", help: "", labels: ["__reserved"]) }
        #expect(throws: MetricsError.self) { _ = try registry.gauge("app_ok", help: "", labels: ["a", "a"]) }
        #expect(throws: MetricsError.self) { _ = try registry.histogram("app_h", help: "", labels: ["le"]) }
        #expect(throws: MetricsError.invalidBuckets("app_h")) { _ = try registry.histogram("app_h", help: "", buckets: [1, 0.5]) }
        #expect(throws: MetricsError.invalidBuckets("app_h")) { _ = try registry.histogram("app_h", help: "", buckets: [.infinity]) }
        let first = try registry.counter("app_events_total", help: "Events.", labels: ["kind"])
        let again = try registry.counter("app_events_total", help: "Events.", labels: ["kind"])
        #expect(first === again)
        #expect(throws: MetricsError.alreadyRegistered("app_events_total")) {
            _ = try registry.counter("app_events_total", help: "Other help.", labels: ["kind"])
        }
        #expect(throws: MetricsError.alreadyRegistered("app_events_total")) {
            _ = try registry.gauge("app_events_total", help: "Events.", labels: ["kind"])
        }
        #expect(rendered(registry).components(separatedBy: "# TYPE").count == 2, "one family, no series yet")
    }

    @Test("updates from many threads at once are all counted")
    func concurrentUpdates() async throws {
        let registry = MetricsRegistry()
        let counter = try registry.counter("app_hits_total", help: "Hits.", labels: ["shard"])
        let gauge = try registry.gauge("app_level", help: "Level.")
        let histogram = try registry.histogram("app_sizes", help: "Sizes.", buckets: [1, 10])
        await withTaskGroup(of: Void.self) { tasks in
            for task in 0..<8 {
                tasks.addTask {
                    let shard = counter.series("\(task % 2)")
                    for _ in 0..<10_000 {
                        shard.increment()
                        gauge.add(1)
                        histogram.observe(5)
                    }
                }
            }
        }
        #expect(counter.series("0").value == 40_000 && counter.series("1").value == 40_000)
        #expect(gauge.series().value == 80_000)
        #expect(histogram.series().count == 80_000 && histogram.series().sum == 400_000)
    }

    @Test("mainspring-daemon's /metrics carries its request counter, and promtool check metrics finds nothing to say",
          .enabled(if: promtool != nil, "promtool is not installed (Debian: apt-get install prometheus; `make test-tools` installs it)"))
    func daemonMetricsPassPromtool() async throws {
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--http-port", "0", "--loops", "2"])
        let lineBanner = try #require(daemon.readLine(timeout: .seconds(30)), "no line-service banner")
        let linePort = try #require(lineBanner.split(separator: " ").dropFirst(2).first?.split(separator: ":").last.flatMap { UInt16($0) },
                                    "\(lineBanner)")
        let banner = try #require(daemon.readLine(timeout: .seconds(30)), "no HTTP banner")
        let port = try #require(banner.split(separator: ":").last.flatMap { UInt16($0) }, "\(banner)")
        let client = try TestClient(port: linePort)
        for index in 0..<7 {
            client.send("ECHO \(index)\n")
            #expect(client.readLine() == "\(index)")
        }
        let scrape = try await runProgram("curl", arguments: ["-sS", "http://127.0.0.1:\(port)/metrics"])
        #expect(scrape.stdout.contains("\n# TYPE mainspring_daemon_requests_total counter\nmainspring_daemon_requests_total 7\n"),
                "\(scrape.stdout.suffix(400))")
        let check = try await runProgram("promtool", arguments: ["check", "metrics"], stdin: scrape.stdout)
        #expect(check.status == 0 && check.stdout.isEmpty && check.stderr.isEmpty, "\(check.summary)")
        daemon.send(SIGTERM)
        let exit = await daemon.waitForExit(timeout: .seconds(30))
        #expect(exit.status == 0, "\(exit.summary)")
    }
}
