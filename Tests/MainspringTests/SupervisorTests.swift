import Foundation
import Mainspring
import MainspringTestSupport
import MainspringHTTP
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("mainspring-supervise (end to end)", .serialized)
struct SupervisorTests {
    @Test("runs, prefixes and restarts children, checks their health, serves /metrics and /healthz, reloads a replaced config, stops in order on SIGTERM")
    func endToEnd() async throws {
        let directory = freshDirectory("supervise")
        let config = directory + "/supervise.json"
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        var routes = HTTPRoutes()
        routes.get("/ok") { _ in .text("ok") }
        let healthTarget = try await HTTPServer(loop: loop, routes: routes)
        func write(_ programs: String) throws {
            try "{\"healthInterval\": 0.2, \"programs\": [\(programs)]}".write(toFile: config + ".tmp", atomically: false, encoding: .utf8)
            guard rename(config + ".tmp", config) == 0 else { throw POSIXError(.EIO) }
        }
        let steady = """
            {"name": "steady", "command": ["/bin/sh", "-c", "echo steady $$; exec sleep 1000"], "restart": "never",
             "health": "http://127.0.0.1:\(healthTarget.port)/ok"}
            """
        let stubborn = """
            {"name": "stubborn", "command": ["/bin/sh", "-c", "trap '' TERM; echo stubborn $$; while :; do sleep 0.05; done"],
             "restart": "never", "grace": 0.3}
            """
        let crasher = #"{"name": "crasher", "command": ["/bin/sh", "-c", "echo crash; exit 3"], "restart": "always"}"#
        try write([steady, stubborn, crasher].joined(separator: ","))

        let binary = try executableURL("mainspring-supervise").path
        let supervisor = try await Subprocess.launch(.init(executable: binary, arguments: ["--http-port", "0", config]), on: loop)
        let lines = Locked<[String]>([])
        let reader = Task {
            for try await event in supervisor.standardOutput!.lines {
                if case .line(let text) = event { lines.withLock { $0.append(text) } }
            }
        }
        func waitFor(_ what: String, _ condition: @escaping ([String]) -> Bool) async -> Bool {
            // Generous: a run with a second build beside it waited 20 s for a restart.
            let met = await eventually(timeout: .seconds(90)) { condition(lines.value) }
            if !met { Issue.record("never saw \(what); output: \(lines.value.suffix(20))") }
            return met
        }
        func pid(of name: String) -> Int32? {
            lines.value.first { $0.hasPrefix("[\(name)] \(name) ") }.flatMap { Int32($0.split(separator: " ").last ?? "") }
        }
        guard await waitFor("the port", { $0.contains { $0.hasPrefix("listening on 127.0.0.1:") } }),
              let port = lines.value.first(where: { $0.hasPrefix("listening on") })?.split(separator: ":").last
        else {
            supervisor.signal(SIGKILL)
            return
        }
        let base = "http://127.0.0.1:\(port)"
        #expect(await waitFor("three crashes", { $0.filter { $0 == "[crasher] crash" }.count >= 3 }),
                "the crashing child restarted (with backoff)")
        #expect(await waitFor("steady and stubborn", { lines in
            lines.contains { $0.hasPrefix("[steady] steady ") } && lines.contains { $0.hasPrefix("[stubborn] stubborn ") }
        }))

        let client = HTTPClient(loop: loop)
        #expect(try await client.get(base + "/healthz").status == 200)
        var metrics = ""
        let reported = await eventuallyAsync {
            metrics = (try? await client.get(base + "/metrics").text) ?? ""
            return metrics.contains("supervisor_health_up{program=\"steady\"} 1")
                && metrics.contains("supervisor_last_exit_code{program=\"crasher\"} 3")
        }
        #expect(reported, "\(metrics.prefix(2_000))")
        let restarts = metrics.split(separator: "\n").first { $0.hasPrefix("supervisor_restarts_total{program=\"crasher\"}") }
            .flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
        #expect(restarts >= 2)
        #expect(metrics.contains("supervisor_output_lines_total{program=\"steady\"} 1"))
        #expect(metrics.contains("mainspring_loop_"), "the loops' own metrics")

        // Replace the file (write elsewhere, rename over): crasher goes, late arrives.
        let late = #"{"name": "late", "command": ["/bin/echo", "late arrival"], "restart": "never"}"#
        try write([steady, stubborn, late].joined(separator: ","))
        #expect(await waitFor("the reload", { $0.contains("[late] late arrival") && $0.contains("supervisor: configuration reloaded") }))
        let crashesAfterReload = lines.value.filter { $0 == "[crasher] crash" }.count
        // A file that does not parse changes nothing.
        try write("{ broken")
        #expect(await waitFor("the refused reload", { $0.contains { $0.hasPrefix("supervisor: configuration not reloaded") } }))

        let steadyPID = try #require(pid(of: "steady"))
        let stubbornPID = try #require(pid(of: "stubborn"))
        let started = ContinuousClock.now
        supervisor.signal(SIGTERM)
        #expect(await supervisor.exit == .exited(0))
        let waited = ContinuousClock.now - started
        _ = try? await reader.value
        #expect(waited >= .milliseconds(290), "stubborn ignored SIGTERM: SIGKILL after its 0.3 s grace (\(waited))")
        #expect(processIsGoneOrDead(steadyPID) && processIsGoneOrDead(stubbornPID), "every child stopped")
        let output = lines.value
        let stopOrder = output.filter { $0.hasPrefix("supervisor: stopping ") && !$0.contains("signal") }
        #expect(stopOrder == ["supervisor: stopping steady", "supervisor: stopping stubborn", "supervisor: stopping late"],
                "stopped in the configuration's order")
        #expect(output.filter { $0 == "[crasher] crash" }.count <= crashesAfterReload + 1, "crasher not restarted once removed")
        #expect(output.last == "supervisor: stopped")
        client.shutdown()
        await healthTarget.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
