import Foundation
import Mainspring
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

/// `ServiceGroup` in-process: no signals (`stopSignals` empty), stopped by `triggerShutdown()`,
/// a failure, or cancellation. The services record their steps in one list.
@Suite("ServiceGroup in-process")
struct ServiceGroupTests {
    /// The steps of every service and of the group, in the order they happened.
    final class Steps: Sendable {
        private let list = Locked<[String]>([])
        func add(_ step: String) { list.withLock { $0.append(step) } }
        var all: [String] { list.value }
    }

    /// A service that records its steps; `behaviour` says how it deviates.
    struct Recorder: Service {
        enum Behaviour: Sendable { case normal, neverStarts, failAfterStart, returnAfterStart, ignoreStop, throwWhileStopping }
        let name: String
        let steps: Steps
        var behaviour = Behaviour.normal

        func run(_ context: ServiceContext) async throws {
            steps.add("start \(name)")
            if behaviour != .neverStarts { context.started() }
            switch behaviour {
            case .failAfterStart:
                steps.add("fail \(name)")
                throw DiskFull()
            case .returnAfterStart:
                steps.add("return \(name)")
                return
            default:
                break
            }
            await context.stopRequested()
            steps.add("stop \(name)")
            switch behaviour {
            case .ignoreStop:
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3_600)) }
            case .throwWhileStopping:
                throw DiskFull()
            default:
                steps.add("stopped \(name)")
            }
        }
    }

    struct DiskFull: Error, CustomStringConvertible {
        var description: String { "disk full" }
    }

    /// What `group.run()` threw, when it is `serviceFailed`; anything else (or returning) is
    /// recorded as an issue, and nil.
    private func serviceFailure(of group: ServiceGroup) async -> (service: String, error: any Error, report: ServiceGroup.Report)? {
        do {
            try await group.run()
            Issue.record("run() returned")
        } catch {
            if case .serviceFailed(let service, let failure, let report) = error { return (service, failure, report) }
            Issue.record("\(error)")
        }
        return nil
    }

    /// How long a group may take to start its services here: they are tasks on the cooperative
    /// pool, which the suite's other tests keep busy (two threads on two cores; runs were seen
    /// where a group waited 25 s for one). Generous: a test waits only as long as it must.
    static let startBound = Duration.seconds(120)

    private func configuration(_ steps: Steps) -> ServiceGroup.Configuration {
        var configuration = ServiceGroup.Configuration()
        configuration.stopSignals = []
        configuration.stopDeadline = .seconds(60)
        configuration.onEvent = { event in
            switch event {
            case .ready: steps.add("ready")
            case .stopRequested(let reason): steps.add("stopping: \(reason)")
            default: break
            }
        }
        return configuration
    }

    @Test("triggerShutdown once every service started: reverse order, a clean report with each service's stop time")
    func triggered() async throws {
        let steps = Steps()
        var configuration = configuration(steps)
        let group = Locked<ServiceGroup?>(nil)
        let inner = configuration.onEvent
        configuration.onEvent = { event in
            inner?(event)
            if case .ready = event { group.value?.triggerShutdown() }
        }
        let services = ["a", "b", "c"].map { Recorder(name: $0, steps: steps) }
        group.withLock { $0 = ServiceGroup(services: services, configuration: configuration) }
        let report = try await group.value!.run()
        #expect(steps.all == ["start a", "start b", "start c", "ready", "stopping: shutdown triggered",
                              "stop c", "stopped c", "stop b", "stopped b", "stop a", "stopped a"])
        #expect(report.reason == .triggered && report.isClean && !report.forced)
        #expect(report.services.map(\.name) == ["a", "b", "c"])
        #expect(report.services.allSatisfy { $0.stopDuration != nil && "\($0.outcome)" == "stopped" })
        // A group runs once.
        await #expect(throws: ServiceGroupError.self) { try await group.value!.run() }
        group.withLock { $0 = nil }  // the group's onEvent holds this box: break the cycle (LeakSanitizer)
    }

    @Test("triggerShutdown before run(): nothing starts, a clean report of services not started")
    func triggeredBeforeRun() async throws {
        let steps = Steps()
        let group = ServiceGroup(services: [Recorder(name: "a", steps: steps)], configuration: configuration(steps))
        group.triggerShutdown()
        let report = try await group.run()
        #expect(steps.all == ["stopping: shutdown triggered"])
        #expect(report.isClean && "\(report.services[0].outcome)" == "not started")
    }

    @Test("a service that throws stops the rest in reverse order; run() throws serviceFailed with its error")
    func failure() async throws {
        let steps = Steps()
        let group = ServiceGroup(services: [Recorder(name: "a", steps: steps), Recorder(name: "b", steps: steps),
                                            Recorder(name: "c", steps: steps, behaviour: .failAfterStart)],
                                 configuration: configuration(steps))
        if let (service, failure, report) = await serviceFailure(of: group) {
            #expect(service == "c" && failure is DiskFull)
            #expect(report.reason == .serviceFailed("c"))
            #expect(report.services.map { "\($0.outcome)" } == ["stopped", "stopped", "failed: disk full"])
        }
        // c failed before (or while) the group became ready; b and a stop after it, b first.
        let all = steps.all
        #expect((all.firstIndex(of: "stop b") ?? .max) < (all.firstIndex(of: "stop a") ?? .min), "\(all)")
        #expect((all.firstIndex(of: "fail c") ?? .max) < (all.firstIndex(of: "stop b") ?? .min), "\(all)")
    }

    @Test("a service that does not call started() within its start deadline fails the group: it and the ones before it are stopped, the ones after never start")
    func startDeadline() async throws {
        let steps = Steps()
        var configuration = configuration(steps)
        configuration.startDeadline = .seconds(600)  // the member's own deadline wins
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                  .init(Recorder(name: "b", steps: steps, behaviour: .neverStarts), startDeadline: .milliseconds(200)),
                                  .init(Recorder(name: "c", steps: steps))],
                                 configuration: configuration)
        let began = ContinuousClock.now
        if let (service, failure, report) = await serviceFailure(of: group) {
            #expect(service == "b")
            let timedOut = failure as? ServiceGroup.StartTimedOut
            #expect(timedOut?.service == "b" && timedOut?.deadline == .milliseconds(200))
            #expect("\(failure)" == "b did not start within 0.2 seconds")
            #expect(report.reason == .serviceFailed("b"))
            #expect(report.services.map { "\($0.outcome)" } == ["stopped", "stopped", "not started"])
        }
        // Never before the deadline; well before the group's own 600 s.
        #expect(ContinuousClock.now - began >= .milliseconds(200))
        #expect(ContinuousClock.now - began < .seconds(60))
        #expect(steps.all == ["start a", "start b", "stopping: b failed", "stop b", "stopped b", "stop a", "stopped a"])
    }

    @Test("a service that returns early: a failure by default, a clean stop with .stopGroup, nothing with .ignore")
    func earlyReturn() async throws {
        let steps = Steps()
        let failing = ServiceGroup(services: [Recorder(name: "a", steps: steps),
                                              Recorder(name: "b", steps: steps, behaviour: .returnAfterStart)],
                                   configuration: configuration(steps))
        await #expect {
            try await failing.run()
        } throws: { error in
            guard case ServiceGroupError.serviceReturnedEarly(let service, let report) = error else { return false }
            return service == "b" && report.reason == .serviceReturned("b") && "\(report.services[0].outcome)" == "stopped"
        }

        let stopping = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                     .init(Recorder(name: "b", steps: steps, behaviour: .returnAfterStart), whenItReturns: .stopGroup)],
                                    configuration: configuration(steps))
        let report = try await stopping.run()
        #expect(report.reason == .serviceReturned("b") && report.isClean)
        #expect(report.services.map { "\($0.outcome)" } == ["stopped", "returned"])

        // .ignore: b's end changes nothing; the group runs until asked, and stops a alone.
        let ignoring = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                     .init(Recorder(name: "b", steps: steps, behaviour: .returnAfterStart), whenItReturns: .ignore),
                                     .init(Recorder(name: "c", steps: steps))],
                                    configuration: configuration(steps))
        let task = Task { try await ignoring.run() }
        #expect(await eventually { steps.all.filter { $0 == "start c" }.count == 1 }, "\(steps.all)")
        ignoring.triggerShutdown()
        let ignored = try await task.value
        #expect(ignored.isClean && ignored.services.map { "\($0.outcome)" } == ["stopped", "returned", "stopped"])
    }

    @Test("a service past its deadline is cancelled, the group goes on; a service that throws while stopping is in the report")
    func deadlineAndStopFailure() async throws {
        let steps = Steps()
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps, behaviour: .throwWhileStopping)),
                                  .init(Recorder(name: "b", steps: steps, behaviour: .ignoreStop), stopDeadline: .milliseconds(100)),
                                  .init(Recorder(name: "c", steps: steps))],
                                 configuration: configuration(steps))
        let started = ContinuousClock.now
        let task = Task { try await group.run() }
        #expect(await eventually(timeout: Self.startBound) { steps.all.contains("ready") })
        group.triggerShutdown()
        let result = await task.result
        guard case .failure(let error) = result, let report = (error as? ServiceGroupError)?.report,
              case .stopIncomplete = error as? ServiceGroupError
        else {
            Issue.record("\(result)")
            return
        }
        #expect(report.services.map { "\($0.outcome)" } == ["failed: disk full", "cancelled after its 0.1 seconds deadline", "stopped"])
        #expect((report.services[1].stopDuration ?? .zero) >= .milliseconds(100))
        #expect(ContinuousClock.now - started < .seconds(50), "c's and a's deadlines were not waited for")
        let all = steps.all
        #expect((all.firstIndex(of: "stop b") ?? .max) < (all.firstIndex(of: "stop a") ?? .min), "\(all)")
    }

    @Test("cancelling the task running the group forces: every service cancelled at once, stopIncomplete")
    func cancellationForces() async throws {
        let steps = Steps()
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps, behaviour: .ignoreStop)),
                                  .init(Recorder(name: "b", steps: steps))],
                                 configuration: configuration(steps))
        let task = Task { try await group.run() }
        #expect(await eventually(timeout: Self.startBound) { steps.all.contains("ready") })
        task.cancel()
        let result = await task.result
        guard case .failure(let error) = result, case .stopIncomplete(let report) = error as? ServiceGroupError else {
            Issue.record("\(result)")
            return
        }
        #expect(report.reason == .cancelled && report.forced)
        #expect(report.services.map { "\($0.outcome)" } == ["cancelled by a forced stop", "cancelled by a forced stop"])
    }

    @Test("READY=1 after the last service started, STOPPING=1 with its status before the first is asked to stop")
    func notifications() async throws {
        let fake = try FakeNotifySocket()
        let steps = Steps()
        var configuration = configuration(steps)
        var manager = ServiceGroup.ServiceManager(notifier: try ServiceNotifier(address: fake.address))
        manager.readyStatus = { "up" }
        manager.stoppingStatus = { "down: \($0)" }
        configuration.serviceManager = manager
        let group = ServiceGroup(services: [Recorder(name: "a", steps: steps), Recorder(name: "b", steps: steps)],
                                 configuration: configuration)
        let task = Task { try await group.run() }
        let ready = await fake.waitFor(timeout: Self.startBound) { $0.contains("READY=1") }
        #expect(ready?.value(of: "STATUS") == "up", "\(fake.messages)")
        #expect(steps.all.contains("start b"), "READY=1 only once b started: \(steps.all)")
        #expect(!steps.all.contains("stop b"))
        group.triggerShutdown()
        _ = try await task.value
        let stopping = await fake.waitFor { $0.contains("STOPPING=1") }
        #expect(stopping?.value(of: "STATUS") == "down: shutdown triggered", "\(fake.messages)")
        #expect(fake.messages.map(\.text) == ["READY=1\nSTATUS=up", "STOPPING=1\nSTATUS=down: shutdown triggered"])
    }
}
