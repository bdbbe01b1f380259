import Foundation
import Mainspring

/// `service-group <mode>`: a `ServiceGroup` of three services, `a`, `b` and `c`, stopped by the
/// signals the test sends. Each service writes its own steps on stdout (`start a`,
/// `started a`, `stop a`, `stopped a`), the group's events are `event=…` lines, and the end is
/// `reason=…`, `outcome-<name>=…` and `error=…` lines. Exit status: 0 after a clean stop, 10
/// when a service failed, 11 for a stop that was not clean (deadline, forced), 12 for a
/// service that returned early.
///
/// Modes (what differs from three services that start, then stop when asked):
/// - `order`: nothing; the test sends SIGTERM (or SIGINT) once `event=ready` is out.
/// - `deadline`: `b` ignores the stop request (it waits to be cancelled) and has 300 ms.
/// - `force`: `c` ignores the stop request and has 60 s: the test's second signal forces.
/// - `fail`: `b` throws "disk full" when the process gets SIGUSR1.
/// - `start-signal`: `b` never reports started: the test's SIGTERM comes during start-up.
/// - `notify`: the group talks to `$NOTIFY_SOCKET` (READY/STOPPING, the watchdog over the main
///   loop when `$WATCHDOG_USEC` is set).
@MainActor
func serviceGroupScenario() throws {
    let mode = CommandLine.arguments.dropFirst(2).first ?? "order"
    let main = EventLoop.main
    // SIGUSR1 for `fail`: watched before anything starts, so that the test's signal finds it.
    let failSignal = mode == "fail" ? try main.signals([SIGUSR1]) : nil

    func service(_ name: String, deadline: Duration? = nil) -> ServiceGroup.Member {
        ServiceGroup.Member(name: name, stopDeadline: deadline) { context in
            say("start \(name)")
            switch (mode, name) {
            case ("start-signal", "b"):
                await context.stopRequested()
                say("stop \(name)")
                say("stopped \(name)")
                return
            case ("fail", "b"):
                say("started \(name)")
                context.started()
                for await _ in failSignal! {
                    say("fail \(name)")
                    throw DiskFull()
                }
                return
            default:
                break
            }
            say("started \(name)")
            context.started()
            await context.stopRequested()
            say("stop \(name)")
            if (mode, name) == ("deadline", "b") || (mode, name) == ("force", "c") {
                // Ignores the request: only cancellation ends it.
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3_600)) }
                say("cancelled \(name)")
                return
            }
            say("stopped \(name)")
        }
    }

    var configuration = ServiceGroup.Configuration()
    configuration.stopDeadline = .seconds(20)
    configuration.onEvent = { event in say("event=\(event)") }
    if mode == "notify" {
        var manager = try ServiceGroup.ServiceManager.fromEnvironment(watchdogLoops: [main])
        manager.readyStatus = { "serving a, b and c" }
        manager.stoppingStatus = { reason in "stopping on \(reason)" }
        configuration.serviceManager = manager
    }
    let members = [
        service("a"),
        service("b", deadline: mode == "deadline" ? .milliseconds(300) : nil),
        service("c", deadline: mode == "force" ? .seconds(60) : nil),
    ]
    let group = ServiceGroup(members, configuration: configuration)

    let status = Guarded<Int32>(1)
    Task { @MainActor in
        let started = ContinuousClock.now
        let report: ServiceGroup.Report?
        do throws(ServiceGroupError) {
            report = try await group.run()
            status.value = 0
        } catch {
            say("error=\(error)")
            report = error.report
            switch error {
            case .serviceFailed: status.value = 10
            case .stopIncomplete: status.value = 11
            case .serviceReturnedEarly: status.value = 12
            case .alreadyRun, .cannotWatchSignals: status.value = 1
            }
        }
        if let report {
            say("reason=\(report.reason)")
            say("forced=\(report.forced)")
            for end in report.services { say("outcome-\(end.name)=\(end.outcome)") }
        }
        say("elapsed-ms=\(Int((ContinuousClock.now - started) / .milliseconds(1)))")
        main.stop()
    }
    try main.run()
    exit(status.value)
}

struct DiskFull: Error, CustomStringConvertible {
    var description: String { "disk full" }
}

/// One stdout line, in one write (lines of concurrent tasks do not mix).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// A value behind a lock.
final class Guarded<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}
