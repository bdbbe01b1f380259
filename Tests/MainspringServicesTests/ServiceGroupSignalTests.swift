import Foundation
@testable import MainspringServices
import MainspringCore
import MainspringTestSupport
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `ServiceGroup` with real signals, in a process of its own (`mainspring-fixture service-group
/// <mode>`, Tests/Fixture/ServiceGroupScenario.swift): three services `a`, `b`, `c` that
/// print their steps; the group's events are `event=` lines.
@Suite("ServiceGroup with real signals (subprocess)", .serialized)
struct ServiceGroupSignalTests {
    /// Starts the fixture in `mode` and reads its stdout up to (and including) `line`.
    private func start(_ mode: String, until line: String, environment: [String: String]? = nil) throws
        -> (ChildProcess, [String])
    {
        let child = try startExecutable("mainspring-fixture", arguments: ["service-group", mode], environment: environment)
        var seen: [String] = []
        while let next = child.readLine(timeout: .seconds(60)) {
            seen.append(next)
            if next == line { return (child, seen) }
        }
        let result = child.waitForExit(timeout: .seconds(5))
        Issue.record("never printed '\(line)': \(result.summary)")
        return (child, seen)
    }

    private static let startUp = [
        "event=starting a", "start a", "started a", "event=started a",
        "event=starting b", "start b", "started b", "event=started b",
        "event=starting c", "start c", "started c", "event=started c",
        "event=ready",
    ]

    /// The fixture's lines for service `name` asked to stop with the 20 s deadline and stopping
    /// cleanly: the group's step, the service's two, the group's record of its end.
    private static func cleanStop(_ name: String) -> [String] {
        ["event=stopping \(name) (deadline 20.0 seconds)", "stop \(name)", "stopped \(name)", "event=\(name): stopped"]
    }

    @Test("starts a, b, c in order; SIGTERM stops them c, b, a, each after the one after it returned; exit 0", arguments: [SIGTERM, SIGINT])
    func orderedStartAndReverseStop(signal: Int32) throws {
        let (child, _) = try start("order", until: "event=ready")
        child.send(signal)
        let result = child.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        let name = signal == SIGTERM ? "SIGTERM" : "SIGINT"
        let expected = Self.startUp + ["event=stopping: \(name)"]
            + Self.cleanStop("c") + Self.cleanStop("b") + Self.cleanStop("a")
            + ["reason=\(name)", "forced=false", "outcome-a=stopped", "outcome-b=stopped", "outcome-c=stopped"]
        #expect(Array(result.lines.map(String.init).dropLast()) == expected, "\(result.summary)")
    }

    @Test("a service past its deadline is cancelled and the group stops the rest: exit 11, its outcome says so")
    func deadline() throws {
        let (child, _) = try start("deadline", until: "event=ready")
        child.send(SIGTERM)
        let result = child.waitForExit(timeout: .seconds(60))
        #expect(result.status == 11, "\(result.summary)")
        let lines = result.lines.map(String.init)
        // Only the group's steps and the services' own lines before the cancellation (the
        // cancelled `b` prints "cancelled b" whenever its task gets to it).
        let steps = lines.filter { $0 != "cancelled b" && !$0.hasPrefix("error=") && !$0.hasPrefix("elapsed-ms=") }
        let expected = Self.startUp + ["event=stopping: SIGTERM"] + Self.cleanStop("c")
            + ["event=stopping b (deadline 0.3 seconds)", "stop b", "event=b: cancelled after its 0.3 seconds deadline"]
            + Self.cleanStop("a")
            + ["reason=SIGTERM", "forced=false", "outcome-a=stopped", "outcome-b=cancelled after its 0.3 seconds deadline",
               "outcome-c=stopped"]
        #expect(steps == expected, "\(result.summary)")
        #expect(result["error"]?.hasPrefix("the stop was not clean: SIGTERM; ") == true, "\(result.summary)")
    }

    @Test("a second signal forces: the service that ignores its stop and the ones still waiting are cancelled at once; exit 11")
    func secondSignalForces() throws {
        let (child, _) = try start("force", until: "event=ready")
        child.send(SIGTERM)
        var line: String?
        repeat { line = child.readLine(timeout: .seconds(60)) } while line != nil && line != "stop c"
        child.send(SIGINT)
        let result = child.waitForExit(timeout: .seconds(60))
        #expect(result.status == 11, "\(result.summary)")
        let lines = result.lines.map(String.init)
        let expected = Self.startUp + ["event=stopping: SIGTERM", "event=stopping c (deadline 60.0 seconds)", "stop c",
                                       "event=forced: SIGINT"]
        #expect(Array(lines.prefix(expected.count)) == expected, "\(result.summary)")
        // Then the group's events; the services' own lines after the force (each cancelled task
        // unwinds whenever it runs) may come between them.
        let events = lines.dropFirst(expected.count).filter { $0.hasPrefix("event=") }
        #expect(events == ["event=c: cancelled by a forced stop", "event=b: cancelled by a forced stop",
                           "event=a: cancelled by a forced stop"], "\(result.summary)")
        #expect(result["forced"] == "true", "\(result.summary)")
        #expect(result["outcome-a"] == "cancelled by a forced stop" && result["outcome-c"] == "cancelled by a forced stop",
                "\(result.summary)")
        #expect((result.int("elapsed-ms") ?? .max) < 50_000, "did not wait for c's 60 s deadline: \(result.summary)")
    }

    @Test("a service that throws stops the group (the others in reverse order) and run() throws its error: exit 10")
    func failingService() throws {
        let (child, _) = try start("fail", until: "event=ready")
        child.send(SIGUSR1)
        let result = child.waitForExit(timeout: .seconds(60))
        #expect(result.status == 10, "\(result.summary)")
        let lines = result.lines.map(String.init).filter { !$0.hasPrefix("error=") && !$0.hasPrefix("elapsed-ms=") }
        let expected = Self.startUp + ["fail b", "event=b: failed: disk full", "event=stopping: b failed"]
            + Self.cleanStop("c") + Self.cleanStop("a")
            + ["reason=b failed", "forced=false", "outcome-a=stopped", "outcome-b=failed: disk full", "outcome-c=stopped"]
        #expect(lines == expected, "\(result.summary)")
        #expect(result["error"]?.hasPrefix("b failed: disk full (b failed; ") == true, "\(result.summary)")
    }

    @Test("SIGTERM during start-up: the service starting is asked to stop, the ones after it never start")
    func signalDuringStart() throws {
        let (child, _) = try start("start-signal", until: "start b")
        child.send(SIGTERM)
        let result = child.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        let expected = ["event=starting a", "start a", "started a", "event=started a", "event=starting b", "start b",
                        "event=stopping: SIGTERM"]
            + Self.cleanStop("b") + Self.cleanStop("a")
            + ["reason=SIGTERM", "forced=false", "outcome-a=stopped", "outcome-b=stopped", "outcome-c=not started"]
        #expect(Array(result.lines.map(String.init).dropLast()) == expected, "\(result.summary)")
    }

    @Test("systemd: READY=1 with its status once every service started, WATCHDOG=1 while running, STOPPING=1 on SIGTERM and no ping after it")
    func serviceManager() throws {
        let fake = try FakeNotifySocket()
        let (child, _) = try start("notify", until: "event=ready",
                                   environment: ["NOTIFY_SOCKET": fake.address, "WATCHDOG_USEC": "200000"])
        // READY=1 went out before the group said `ready`.
        let ready = try #require(fake.waitFor(timeout: .seconds(5)) { $0.contains("READY=1") }, "\(fake.messages)")
        #expect(ready.value(of: "STATUS") == "serving a, b and c", "\(ready)")
        #expect(fake.messages.first?.contains("READY=1") == true, "nothing before READY=1: \(fake.messages)")
        #expect(fake.waitFor { _ in fake.messages.filter { $0.text == "WATCHDOG=1" }.count >= 3 } != nil, "\(fake.messages)")
        child.send(SIGTERM)
        let result = child.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        let stopping = try #require(fake.waitFor(timeout: .seconds(5)) { $0.contains("STOPPING=1") }, "\(fake.messages)")
        #expect(stopping.value(of: "STATUS") == "stopping on SIGTERM", "\(stopping)")
        let stoppingIndex = try #require(fake.messages.firstIndex { $0.contains("STOPPING=1") })
        #expect(!fake.messages.dropFirst(stoppingIndex).contains { $0.text == "WATCHDOG=1" }, "\(fake.messages)")
        #expect(fake.messages.filter { $0.contains("READY=1") }.count == 1, "\(fake.messages)")
    }
}
