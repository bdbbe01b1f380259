import Foundation
@testable import MainspringServices
import MainspringCore
import MainspringTestSupport
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `ServiceGroup` in-process and in virtual time: the group on a simulated loop
/// (``ServiceGroup/Configuration/loop``), so its services' tasks run on that loop and its
/// deadlines on its clock — every step happens in one order, at an exact instant, and a 30 s
/// deadline takes no real time. No signals (`stopSignals` empty): stopped by
/// `triggerShutdown()`, a failure, or cancellation. The services record their steps in one list.
@Suite("ServiceGroup in virtual time")
struct ServiceGroupTests {
    /// The steps of every service and of the group, in the order they happened, each with the
    /// simulation's time when it happened.
    final class Steps: Sendable {
        private let list = Locked<[(step: String, at: Duration)]>([])
        private let now: @Sendable () -> Duration
        init(_ simulation: Simulation) { now = { simulation.now } }
        func add(_ step: String) {
            let at = now()
            list.withLock { $0.append((step, at)) }
        }
        var all: [String] { list.value.map(\.step) }
        /// When `step` first happened.
        func time(of step: String) -> Duration? { list.value.first { $0.step == step }?.at }
    }

    /// A service that records its steps; `behaviour` says how it deviates. Stopping takes
    /// `stopTakes` of the loop's time (a sleep on `loop`).
    struct Recorder: Service {
        enum Behaviour: Sendable { case normal, neverStarts, failAfterStart, returnAfterStart, ignoreStop, throwWhileStopping }
        let name: String
        let steps: Steps
        var behaviour = Behaviour.normal
        var loop: EventLoop?
        var stopTakes = Duration.zero

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
                // Ends only when the group cancels its task (a sleep on the loop throws then). It
                // needs the loop: without one, the wait below would not wait at all.
                guard let loop else { preconditionFailure("Recorder \(name): .ignoreStop needs a loop to sleep on") }
                while !Task.isCancelled { try? await loop.sleep(for: .seconds(3_600)) }
                steps.add("cancelled \(name)")
            case .throwWhileStopping:
                throw DiskFull()
            default:
                if let loop, stopTakes > .zero { try await loop.sleep(for: stopTakes) }
                steps.add("stopped \(name)")
            }
        }
    }

    struct DiskFull: Error, CustomStringConvertible {
        var description: String { "disk full" }
    }

    /// What `group.run()` threw, when it is `serviceFailed`; anything else (or returning) is
    /// recorded as an issue, and nil.
    private static func serviceFailure(of group: ServiceGroup) async -> (service: String, error: any Error, report: ServiceGroup.Report)? {
        do {
            try await group.run()
            Issue.record("run() returned")
        } catch {
            if case .serviceFailed(let service, let failure, let report) = error { return (service, failure, report) }
            Issue.record("\(error)")
        }
        return nil
    }

    /// No signals, 60 s a service, the group on `simulation`'s loop; the group's `ready` and
    /// stop request are steps too.
    private func configuration(_ steps: Steps, _ simulation: Simulation) -> ServiceGroup.Configuration {
        var configuration = ServiceGroup.Configuration()
        configuration.stopSignals = []
        configuration.stopDeadline = .seconds(60)
        configuration.loop = simulation.loop
        configuration.onEvent = { event in
            switch event {
            case .ready: steps.add("ready")
            case .stopRequested(let reason): steps.add("stopping: \(reason)")
            default: break
            }
        }
        return configuration
    }

    /// Runs `group` in a task on `simulation`'s loop, waits `stopAfter` of virtual time, then
    /// lets `stop` stop it (by default `triggerShutdown()`), and returns how `run()` ended.
    private static func run(_ group: ServiceGroup, on simulation: Simulation, stopAfter: Duration = .seconds(5),
                            stop: @escaping @Sendable (ServiceGroup, Task<ServiceGroup.Report, any Error>) -> Void = { group, _ in group.triggerShutdown() })
        async throws -> Result<ServiceGroup.Report, any Error>
    {
        let loop = simulation.loop
        return try await simulation.run {
            let task = Task<ServiceGroup.Report, any Error>(executorPreference: loop) { try await group.run() }
            try await loop.sleep(for: stopAfter)
            stop(group, task)
            return await task.result
        }
    }

    @Test("triggerShutdown once every service started: reverse order, each after the one after it returned, with its exact stop time")
    func triggered() async throws {
        let simulation = try Simulation(seed: 1)
        let steps = Steps(simulation)
        let loop = simulation.loop
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                  .init(Recorder(name: "b", steps: steps, loop: loop, stopTakes: .seconds(1))),
                                  .init(Recorder(name: "c", steps: steps, loop: loop, stopTakes: .seconds(2)))],
                                 configuration: configuration(steps, simulation))
        let report = try await Self.run(group, on: simulation).get()
        #expect(steps.all == ["start a", "start b", "start c", "ready", "stopping: shutdown triggered",
                              "stop c", "stopped c", "stop b", "stopped b", "stop a", "stopped a"])
        // Starting takes no time; c stops 2 s after the trigger at 5 s, b 1 s after c, a at once.
        #expect(steps.time(of: "ready") == .zero)
        #expect(steps.time(of: "stop c") == .seconds(5) && steps.time(of: "stop b") == .seconds(7))
        #expect(steps.time(of: "stopped a") == .seconds(8) && simulation.now == .seconds(8))
        #expect(report.reason == .triggered && report.isClean && !report.forced)
        #expect(report.services.map(\.name) == ["a", "b", "c"])
        #expect(report.services.map(\.stopDuration) == [.zero, .seconds(1), .seconds(2)])
        #expect(report.services.allSatisfy { "\($0.outcome)" == "stopped" })
        // A group runs once.
        let again = try await simulation.run { () async -> Bool in
            do throws(ServiceGroupError) { try await group.run() } catch .alreadyRun { return true } catch { return false }
            return false
        }
        #expect(again, "a second run() throws alreadyRun")
    }

    @Test("triggerShutdown before run(): nothing starts, a clean report of services not started")
    func triggeredBeforeRun() async throws {
        let simulation = try Simulation(seed: 2)
        let steps = Steps(simulation)
        let group = ServiceGroup(services: [Recorder(name: "a", steps: steps)], configuration: configuration(steps, simulation))
        group.triggerShutdown()
        let report = try await simulation.run { try await group.run() }
        #expect(steps.all == ["stopping: shutdown triggered"])
        #expect(report.isClean && "\(report.services[0].outcome)" == "not started")
        #expect(simulation.now == .zero)
    }

    @Test("a service that throws stops the rest in reverse order; run() throws serviceFailed with its error")
    func failure() async throws {
        let simulation = try Simulation(seed: 3)
        let steps = Steps(simulation)
        let group = ServiceGroup(services: [Recorder(name: "a", steps: steps), Recorder(name: "b", steps: steps),
                                            Recorder(name: "c", steps: steps, behaviour: .failAfterStart)],
                                 configuration: configuration(steps, simulation))
        let failure = try await simulation.run { await Self.serviceFailure(of: group).map { ($0.service, "\($0.error)", $0.report) } }
        let (service, error, report) = try #require(failure)
        #expect(service == "c" && error == "disk full")
        #expect(report.reason == .serviceFailed("c"))
        #expect(report.services.map { "\($0.outcome)" } == ["stopped", "stopped", "failed: disk full"])
        // c started (so the group was ready) and failed at once; b and a stop after it, b first.
        #expect(steps.all == ["start a", "start b", "start c", "fail c", "ready", "stopping: c failed",
                              "stop b", "stopped b", "stop a", "stopped a"])
        #expect(simulation.now == .zero)
    }

    @Test("a service that does not call started() within its start deadline fails the group at that instant: it and the ones before it are stopped, the ones after never start")
    func startDeadline() async throws {
        let simulation = try Simulation(seed: 4)
        let steps = Steps(simulation)
        var configuration = configuration(steps, simulation)
        configuration.startDeadline = .seconds(600)  // the member's own deadline wins
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                  .init(Recorder(name: "b", steps: steps, behaviour: .neverStarts), startDeadline: .milliseconds(200)),
                                  .init(Recorder(name: "c", steps: steps))],
                                 configuration: configuration)
        let failure = try await simulation.run { await Self.serviceFailure(of: group).map { ($0.service, $0.error as? ServiceGroup.StartTimedOut, "\($0.error)", $0.report) } }
        let (service, timedOut, description, report) = try #require(failure)
        #expect(service == "b")
        #expect(timedOut?.service == "b" && timedOut?.deadline == .milliseconds(200))
        #expect(description == "b did not start within 0.2 seconds")
        #expect(report.reason == .serviceFailed("b"))
        #expect(report.services.map { "\($0.outcome)" } == ["stopped", "stopped", "not started"])
        #expect(steps.all == ["start a", "start b", "stopping: b failed", "stop b", "stopped b", "stop a", "stopped a"])
        // Exactly at b's deadline, not the group's 600 s.
        #expect(steps.time(of: "stopping: b failed") == .milliseconds(200))
        #expect(simulation.now == .milliseconds(200))
    }

    @Test("a group given no loop keeps its time on the loop run() is called on: its deadlines are a simulation's virtual time, exact")
    func noLoopConfiguredUsesTheCallersLoop() async throws {
        let simulation = try Simulation(seed: 6)
        let steps = Steps(simulation)
        var configuration = configuration(steps, simulation)
        configuration.loop = nil  // nor a signal loop: run() is called in the simulation's body
        configuration.startDeadline = .seconds(90)
        let loop = simulation.loop
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                  .init(Recorder(name: "b", steps: steps, behaviour: .neverStarts))],
                                 configuration: configuration)
        let (failed, report) = try await simulation.run { () async -> (String?, ServiceGroup.Report?) in
            let failure = await Self.serviceFailure(of: group)
            return (failure.map { "\($0.error)" }, failure?.report)
        }
        #expect(failed == "b did not start within 90.0 seconds")
        #expect(steps.time(of: "stopping: b failed") == .seconds(90))
        #expect(simulation.now == .seconds(90))
        #expect(report?.services.map { "\($0.outcome)" } == ["stopped", "stopped"])
        withExtendedLifetime(loop) {}
    }

    @Test("a service that returns early: a failure by default, a clean stop with .stopGroup, nothing with .ignore")
    func earlyReturn() async throws {
        let simulation = try Simulation(seed: 5)
        let steps = Steps(simulation)
        let failing = ServiceGroup(services: [Recorder(name: "a", steps: steps),
                                              Recorder(name: "b", steps: steps, behaviour: .returnAfterStart)],
                                   configuration: configuration(steps, simulation))
        let failed = try await simulation.run { () async -> String in
            do throws(ServiceGroupError) {
                try await failing.run()
                return "returned"
            } catch {
                guard case .serviceReturnedEarly(let service, let report) = error else { return "\(error)" }
                return "\(service) returned early: \(report.reason), a \(report.services[0].outcome)"
            }
        }
        #expect(failed == "b returned early: b returned, a stopped")

        let stopping = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                     .init(Recorder(name: "b", steps: steps, behaviour: .returnAfterStart), whenItReturns: .stopGroup)],
                                    configuration: configuration(steps, simulation))
        let report = try await simulation.run { try await stopping.run() }
        #expect(report.reason == .serviceReturned("b") && report.isClean)
        #expect(report.services.map { "\($0.outcome)" } == ["stopped", "returned"])

        // .ignore: b's end changes nothing; the group runs until asked, and stops a and c alone.
        let ignoring = ServiceGroup([.init(Recorder(name: "a", steps: steps)),
                                     .init(Recorder(name: "b", steps: steps, behaviour: .returnAfterStart), whenItReturns: .ignore),
                                     .init(Recorder(name: "c", steps: steps))],
                                    configuration: configuration(steps, simulation))
        let before = steps.all.count
        let ignored = try await Self.run(ignoring, on: simulation, stopAfter: .seconds(10)).get()
        #expect(Array(steps.all.dropFirst(before)) == ["start a", "start b", "return b", "start c", "ready",
                                                         "stopping: shutdown triggered", "stop c", "stopped c", "stop a", "stopped a"])
        #expect(ignored.isClean && ignored.services.map { "\($0.outcome)" } == ["stopped", "returned", "stopped"])
    }

    @Test("a service past its stop deadline is cancelled exactly then and the group goes on; a service that throws while stopping is in the report")
    func deadlineAndStopFailure() async throws {
        let simulation = try Simulation(seed: 6)
        let steps = Steps(simulation)
        let loop = simulation.loop
        var configuration = configuration(steps, simulation)
        configuration.stopDeadline = .seconds(30)  // c's; b has its own
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps, behaviour: .throwWhileStopping)),
                                  .init(Recorder(name: "b", steps: steps, behaviour: .ignoreStop, loop: loop), stopDeadline: .milliseconds(100)),
                                  .init(Recorder(name: "c", steps: steps, behaviour: .ignoreStop, loop: loop))],
                                 configuration: configuration)
        let result = try await Self.run(group, on: simulation, stopAfter: .seconds(1))
        guard case .failure(let error) = result, case .stopIncomplete(let report) = error as? ServiceGroupError else {
            Issue.record("\(result)")
            return
        }
        #expect(report.services.map { "\($0.outcome)" }
                == ["failed: disk full", "cancelled after its 0.1 seconds deadline", "cancelled after its 30.0 seconds deadline"])
        // c from 1 s to 31 s (the group's deadline), b from 31 s to 31.1 s (its own), a at once.
        #expect(report.services.map(\.stopDuration) == [.zero, .milliseconds(100), .seconds(30)])
        #expect(steps.time(of: "stop c") == .seconds(1) && steps.time(of: "stop b") == .seconds(31))
        #expect(steps.time(of: "stop a") == .milliseconds(31_100))
        #expect(simulation.now == .milliseconds(31_100))
        simulation.runUntilIdle()
        #expect(Set(steps.all).isSuperset(of: ["cancelled b", "cancelled c"]), "the cancelled services' tasks ended: \(steps.all)")
    }

    @Test("cancelling the task running the group forces: every service cancelled at once, stopIncomplete")
    func cancellationForces() async throws {
        let simulation = try Simulation(seed: 7)
        let steps = Steps(simulation)
        let loop = simulation.loop
        let group = ServiceGroup([.init(Recorder(name: "a", steps: steps, behaviour: .ignoreStop, loop: loop)),
                                  .init(Recorder(name: "b", steps: steps))],
                                 configuration: configuration(steps, simulation))
        let result = try await Self.run(group, on: simulation, stopAfter: .seconds(3)) { _, task in task.cancel() }
        guard case .failure(let error) = result, case .stopIncomplete(let report) = error as? ServiceGroupError else {
            Issue.record("\(result)")
            return
        }
        #expect(report.reason == .cancelled && report.forced)
        #expect(report.services.map { "\($0.outcome)" } == ["cancelled by a forced stop", "cancelled by a forced stop"])
        #expect(simulation.now == .seconds(3), "no deadline waited for")
    }

    @Test("READY=1 after the last service started, STOPPING=1 with its status before the first is asked to stop")
    func notifications() async throws {
        let simulation = try Simulation(seed: 8)
        let fake = try FakeNotifySocket()
        let steps = Steps(simulation)
        var configuration = configuration(steps, simulation)
        var manager = ServiceGroup.ServiceManager(notifier: try ServiceNotifier(address: fake.address))
        manager.readyStatus = { "up" }
        manager.stoppingStatus = { "down: \($0)" }
        configuration.serviceManager = manager
        let group = ServiceGroup(services: [Recorder(name: "a", steps: steps), Recorder(name: "b", steps: steps)],
                                 configuration: configuration)
        _ = try await Self.run(group, on: simulation).get()
        // The group sends READY=1 just before its `ready` event, STOPPING=1 just before its stop request.
        #expect(steps.all == ["start a", "start b", "ready", "stopping: shutdown triggered", "stop b", "stopped b", "stop a", "stopped a"])
        let stopping = await fake.waitFor { $0.contains("STOPPING=1") }
        #expect(stopping?.value(of: "STATUS") == "down: shutdown triggered", "\(fake.messages)")
        #expect(fake.messages.map(\.text) == ["READY=1\nSTATUS=up", "STOPPING=1\nSTATUS=down: shutdown triggered"])
    }
}
