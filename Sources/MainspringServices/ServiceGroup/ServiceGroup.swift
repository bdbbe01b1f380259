import MainspringCore

/// Runs a program's services: starts them in order, stops them in reverse order — on a signal,
/// on request, or when one fails — each within a deadline of its own, and keeps the service
/// manager informed (systemd's `READY=1`, `STOPPING=1` and watchdog).
///
/// ```swift
/// var configuration = ServiceGroup.Configuration()           // SIGTERM, SIGINT; 30 s each
/// configuration.serviceManager = try .fromEnvironment(watchdogLoops: loops.loops)
/// let group = ServiceGroup([
///     .init(Database(), stopDeadline: .seconds(10)),
///     .init(LineServer(group: loops)),                        // depends on the database
/// ], configuration: configuration)
/// let report = try await group.run()                          // on SIGTERM: server, then database
/// ```
///
/// **Starting.** Services start one at a time, in the order given: the group calls a
/// service's ``Service/run(_:)`` in a task of its own, and the next one once that service has
/// called ``ServiceContext/started()`` — so a service may rely on the ones before it. Once
/// the last has started, the group sends `READY=1` and starts the watchdog (when configured).
///
/// **Stopping.** The first of ``Configuration/stopSignals`` (or ``triggerShutdown()``, or a
/// failure) begins the stop: the watchdog stops, `STOPPING=1` goes out, services not started
/// yet never will be, and the started ones are asked to stop in reverse order — the last
/// first, the one before it once the last has returned. Each has its own deadline
/// (``Member/stopDeadline``, or ``Configuration/stopDeadline``); past it, its task is
/// cancelled, its outcome is ``Outcome/cancelledAfterDeadline(_:)``, and the group goes on to
/// the next one without waiting further. A second stop signal forces: every service still
/// running is cancelled at once and ``run()`` ends without waiting for them; so does
/// cancelling the task that runs ``run()``.
///
/// **Failures.** A service that throws while running stops the group (the others in reverse
/// order, as above) and ``run()`` throws ``ServiceGroupError/serviceFailed(service:error:report:)``
/// with its error. A service that returns before being asked to stop does what its
/// ``Member/whenItReturns`` says (by default it is a failure:
/// ``ServiceGroupError/serviceReturnedEarly(service:report:)``).
///
/// **Threads and cost.** ``run()`` from any task, once; it spends its time suspended, waking
/// for each start, stop, signal and deadline (one task per service, one for the signals, one
/// sleeping task per deadline running). ``triggerShutdown()`` from any thread. The stop
/// signals are watched on ``Configuration/signalLoop`` (``Configuration/loop``, or
/// `EventLoop.main`, by default) from the moment ``run()`` begins — before any service starts —
/// until it returns, when their previous dispositions are back.
///
/// **Time.** The deadlines and stop durations are on ``Configuration/loop``'s clock, and the
/// group's tasks prefer that loop; without one, on the machine's continuous clock and the global
/// executor. Give it a simulated loop (`MainspringTesting`) and a test of "past its 30 s deadline
/// the service is cancelled" takes no real time and sees exactly 30 s.
public final class ServiceGroup: Sendable {
    /// The services, in start order.
    public let members: [Member]
    /// How the group runs.
    public let configuration: Configuration

    private enum Phase {
        case idle(triggered: Bool)
        case running(AsyncStream<GroupEvent>.Continuation)
        case finished
    }

    private struct Shared {
        var phase = Phase.idle(triggered: false)
        var watchdog: Watchdog?
    }

    private let shared = Protected(Shared())

    /// A group of `members`, started in this order and stopped in reverse.
    public init(_ members: [Member], configuration: Configuration = .init()) {
        self.members = members
        self.configuration = configuration
    }

    /// A group of `services` with the default member settings (the group's stop deadline; a
    /// service returning on its own fails the group).
    public convenience init(services: [any Service], configuration: Configuration = .init()) {
        self.init(services.map { Member($0) }, configuration: configuration)
    }

    /// The watchdog the group runs for the service manager, while it runs one (between
    /// `READY=1` and `STOPPING=1`, when ``ServiceManager/watchdogInterval`` is set): for its
    /// ``Watchdog/health`` in status lines. Any thread.
    public var watchdog: Watchdog? { shared.withLock { $0.watchdog } }

    /// Stops the group gracefully, as the first stop signal would: services not started yet
    /// are not started, the started ones are asked to stop in reverse order. Any thread, any
    /// time: before ``run()`` it makes the run stop at once (starting nothing); after the
    /// stop began, or after the run, it does nothing (it never forces). Costs one lock and,
    /// while running, one event for the group's task.
    public func triggerShutdown() {
        let running = shared.withLock { shared -> AsyncStream<GroupEvent>.Continuation? in
            switch shared.phase {
            case .idle:
                shared.phase = .idle(triggered: true)
                return nil
            case .running(let events): return events
            case .finished: return nil
            }
        }
        running?.yield(.trigger)  // outside the lock: it may resume the group's task
    }

    /// Runs the group: watches the stop signals, starts the services in order, and returns
    /// once they have all stopped — or been given up on — after a stop request.
    ///
    /// - Returns: the report of a clean stop (every service stopped, returned, or never
    ///   started, and nothing forced): why it stopped and how each service ended.
    /// - Throws: ``ServiceGroupError``: a service failed (``ServiceGroupError/serviceFailed(service:error:report:)``,
    ///   ``ServiceGroupError/serviceReturnedEarly(service:report:)``), the stop was not clean
    ///   (``ServiceGroupError/stopIncomplete(_:)``), the signals could not be watched, or the
    ///   group already ran.
    @discardableResult
    public func run() async throws(ServiceGroupError) -> Report {
        let (events, sink) = AsyncStream<GroupEvent>.makeStream()
        let claimed = shared.withLock { shared -> Bool? in
            guard case .idle(let triggered) = shared.phase else { return nil }
            shared.phase = .running(sink)
            return triggered
        }
        guard let triggered = claimed else { throw .alreadyRun }
        defer {
            let watchdog = shared.withLock { shared in
                shared.phase = .finished
                defer { shared.watchdog = nil }
                return shared.watchdog
            }
            watchdog?.stop()
            sink.finish()
        }
        // The signals first, before any service starts: a SIGTERM during start-up stops the group.
        var signalTask: Task<Void, Never>?
        if !configuration.stopSignals.isEmpty {
            let loop = configuration.signalLoop ?? configuration.loop ?? EventLoop.main
            let signals: EventLoop.Signals
            do {
                signals = try await loop.signals(configuration.stopSignals)
            } catch {
                throw .cannotWatchSignals(error)
            }
            signalTask = Task(executorPreference: configuration.loop) {
                for await signal in signals { sink.yield(.signal(signal)) }
            }
        }

        let run = GroupRun(group: self, sink: sink, clockLoop: configuration.loop ?? configuration.signalLoop ?? EventLoop.simulationOfCurrentTask)
        let outcome = await withTaskCancellationHandler {
            await run.drive(events, triggered: triggered)
        } onCancel: {
            sink.yield(.cancelled)
        }
        // The signals' previous dispositions are back once the watching task has ended.
        signalTask?.cancel()
        await signalTask?.value
        switch outcome {
        case .clean(let report): return report
        case .failure(let error): throw error
        }
    }

    /// Starts the watchdog (with `READY=1`).
    func startWatchdog() {
        let manager = configuration.serviceManager
        guard let interval = manager.watchdogInterval, manager.notifier.isEnabled else { return }
        let watchdog = Watchdog(watching: manager.watchdogLoops, notifier: manager.notifier, interval: interval,
                                stallThreshold: manager.watchdogStallThreshold, onHealthChange: manager.onWatchdogHealthChange)
        shared.withLock { $0.watchdog = watchdog }
    }

    /// Stops the watchdog (before `STOPPING=1`): no ping goes out after this returns.
    func stopWatchdog() {
        let watchdog = shared.withLock { shared in
            defer { shared.watchdog = nil }
            return shared.watchdog
        }
        watchdog?.stop()
    }
}

/// What the group's task hears from the services, the signals, the deadlines and the caller.
enum GroupEvent: Sendable {
    case started(Int)
    case ended(Int, Result<Void, any Error>)
    case signal(Int32)
    case trigger
    case cancelled
    /// Member `index`'s stop deadline passed (for its `generation`th stop request: only one).
    case deadline(Int)
    /// Member `index` had not called `started()` by its start deadline.
    case startDeadline(Int)
}
