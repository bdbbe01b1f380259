import ExampleServices
import Foundation
import Mainspring
import MainspringTestSupport
import MainspringHTTP
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// mainspring-supervise's `Supervisor` (the very code the executable runs) on a simulated loop:
/// its children are registered programs, its health checks go over the simulated network, its
/// backoff and health interval run on virtual time — so "unhealthy from 10 s, restarted 100 ms
/// after it exits, healthy again at the next check" and the backoff's doubling are exact.
@Suite struct SupervisorSimulationTests {
    @Test func healthChecksAndRestartsHappenAtExactInstants() throws {
        let simulation = try Simulation(seed: 11)
        simulation.network.latency = .microseconds(100)
        let loop = simulation.loop
        // "web" answers its health URL with 200 for its first 10 s, then 503, and exits with 3 at 20 s.
        simulation.register(program: "web") { process in
            let started = simulation.now
            let accepted = Locked<[Connection]>([])
            // Its listener and connections close when it exits, as a real process's sockets do.
            _ = try Listener(.tcp(host: "127.0.0.1", port: 8000), on: process.loop) { connection in
                accepted.withLock { $0.append(connection) }
                connection.readLines { event in
                    guard case .line(let line) = event else { return connection.close() }
                    guard line.isEmpty else { return }
                    connection.write(simulation.now - started < .seconds(10)
                        ? "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                        : "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                }
            }
            try await process.sleep(for: .seconds(20))
            return 3
        }
        // "crashy" fails at once, every time.
        let crashyStarts = Locked<[Duration]>([])
        simulation.register(program: "crashy") { _ in
            crashyStarts.withLock { $0.append(simulation.now) }
            return 1
        }
        let config = SupervisorConfig(programs: [
            .init(name: "web", command: ["web"], health: "http://127.0.0.1:8000/health", grace: 1),
            .init(name: "crashy", command: ["crashy"], restart: .onFailure),
        ], healthInterval: 1)
        let stats = SupervisorStats()
        let client = HTTPClient(loop: loop, configuration: .init(connectTimeout: .seconds(1), responseTimeout: .seconds(1)))
        let lines = Locked<[String]>([])
        let supervisor = Supervisor(loop: loop, configPath: nil, config: config, stats: stats, client: client,
                                    output: { line in lines.withLock { $0.append(line) } })
        try supervisor.start()

        simulation.advance(by: .milliseconds(5_500))
        #expect(stats["web"]?.healthy == true, "checked at 1 s … 5 s: 200")
        simulation.advance(by: .seconds(10))  // 15.5 s
        #expect(stats["web"]?.healthy == false, "checked at 11 s … 15 s: 503")
        simulation.advance(by: .milliseconds(5_050))  // 20.55 s
        // It exited at 20 s after running 20 s (so no backoff built up): restarted 100 ms later.
        #expect(stats["web"]?.lastExitCode == 3 && stats["web"]?.starts == 2 && stats["web"]?.restarts == 1)
        #expect(lines.value.contains("supervisor: web \(Subprocess.ExitStatus.exited(3))"), "\(lines.value)")
        #expect(stats["web"]?.healthy == false, "not checked since it came back")
        simulation.advance(by: .seconds(1))  // 21.55 s: checked at 21 s, the new instance answers 200
        #expect(stats["web"]?.healthy == true)
        #expect(stats.render().contains("supervisor_health_up{program=\"web\"} 1"))

        // crashy: restarted after 100 ms, doubling per quick failure, at most 5 s.
        let expected: [Duration] = [0, 100, 300, 700, 1_500, 3_100, 6_300, 11_300, 16_300, 21_300].map { .milliseconds($0) }
        #expect(crashyStarts.value == expected)
        #expect(stats["crashy"]?.starts == 10 && stats["crashy"]?.lastExitCode == 1)

        // Stopping: web gets SIGTERM (its sleep ends) and nothing is started again.
        let stopped = Locked<Duration?>(nil)
        supervisor.stop { stopped.withLock { $0 = simulation.now } }
        simulation.advance(by: .seconds(10))
        #expect(stopped.value == .milliseconds(21_550), "web ended at its SIGTERM, well within its 1 s grace")
        let web = simulation.processes.filter { $0.executable == "web" }
        #expect(web.count == 2 && web.last?.receivedSignals == [SIGTERM])
        #expect(crashyStarts.value.count == 10, "no restart once stopping")
        client.shutdown()
        simulation.advance(by: .seconds(5))
        #expect(simulation.network.openStreamEnds == 0)
    }
}
