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
    fileprivate func startWatchdog() {
        let manager = configuration.serviceManager
        guard let interval = manager.watchdogInterval, manager.notifier.isEnabled else { return }
        let watchdog = Watchdog(watching: manager.watchdogLoops, notifier: manager.notifier, interval: interval,
                                stallThreshold: manager.watchdogStallThreshold, onHealthChange: manager.onWatchdogHealthChange)
        shared.withLock { $0.watchdog = watchdog }
    }

    /// Stops the watchdog (before `STOPPING=1`): no ping goes out after this returns.
    fileprivate func stopWatchdog() {
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

/// One run of a group: the state machine that `run()` drives, on its task alone.
private final class GroupRun {
    enum End {
        case clean(ServiceGroup.Report)
        case failure(ServiceGroupError)
    }

    enum SlotPhase {
        case waiting
        case starting
        case running
        /// Since when, on the group's clock (``GroupRun/now()``).
        case stopping(since: Duration)
        case ended(ServiceGroup.Outcome, stopDuration: Duration?)
    }

    struct Slot {
        let member: ServiceGroup.Member
        var phase = SlotPhase.waiting
        var context: ServiceContext?
        var task: Task<Void, Never>?
        var deadlineTask: Task<Void, Never>?

        var hasEnded: Bool {
            if case .ended = phase { return true }
            return false
        }
    }

    let group: ServiceGroup
    let sink: AsyncStream<GroupEvent>.Continuation
    var slots: [Slot]
    /// The next member to start, while starting.
    var nextToStart = 0
    var isReady = false
    var stopReason: ServiceGroup.StopReason?
    /// The failure that stopped the group: the service, and its error (nil: it returned).
    var failure: (service: String, error: (any Error)?)?
    var forced = false
    var finished = false
    /// The loop whose executor the group's tasks prefer (``ServiceGroup/Configuration/loop``,
    /// else the simulation's whose task runs the group).
    let loop: EventLoop?
    /// The loop whose clock times the group: its loop, else its signal loop, else the loop of
    /// the simulation whose task runs it. nil only outside a simulation with neither
    /// configured: the continuous clock times it then (never virtual time).
    let clockLoop: EventLoop?
    /// Where the group's time starts when it has no clock loop (the continuous clock).
    let origin = ContinuousClock.now

    init(group: ServiceGroup, sink: AsyncStream<GroupEvent>.Continuation, clockLoop: EventLoop?) {
        self.group = group
        self.sink = sink
        // In a simulation's body or program, with no loop configured, the group's tasks run on
        // the simulation's loop, as its time does: off it they would run on real threads.
        self.loop = group.configuration.loop ?? EventLoop.simulationOfCurrentTask
        self.clockLoop = clockLoop
        slots = group.members.map { Slot(member: $0) }
    }

    /// The group's time: the clock loop's, or the continuous clock since the run began.
    func now() -> Duration {
        guard let clockLoop else { return origin.duration(to: .now) }
        return .nanoseconds(Int64(clamping: clockLoop.monotonicNow()))
    }

    /// A task preferring the group's loop (any executor without one).
    func task(_ body: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
        Task(executorPreference: loop, operation: body)
    }

    /// A task that sends `event` once `deadline` has passed on the group's clock — unless it is
    /// cancelled first (the service started or ended in time): then it sends nothing.
    func deadlineTask(_ deadline: Duration, _ event: GroupEvent) -> Task<Void, Never> {
        let sink = self.sink
        let loop = self.clockLoop
        return task {
            // Either sleep throws only when this task is cancelled: the check below then reports nothing.
            if let loop {
                try? await loop.sleep(for: deadline)
            } else {
                try? await Task.sleep(for: deadline)
            }
            if !Task.isCancelled { sink.yield(event) }
        }
    }

    func emit(_ event: ServiceGroup.Event) { group.configuration.onEvent?(event) }

    func drive(_ events: AsyncStream<GroupEvent>, triggered: Bool) async -> End {
        if triggered {
            beginStop(.triggered)
        } else {
            startNext()
        }
        if !finished {
            for await event in events {
                handle(event)
                if finished { break }
            }
            // The stream ends early only when the task running the group is cancelled.
            if !finished { force(.cancelled) }
        }
        for slot in slots { slot.deadlineTask?.cancel() }
        return end()
    }

    // MARK: Starting

    func startNext() {
        guard stopReason == nil else { return }
        guard nextToStart < slots.count else {
            becomeReady()
            return
        }
        let index = nextToStart
        nextToStart += 1
        let member = slots[index].member
        let sink = self.sink
        let context = ServiceContext(name: member.name) { sink.yield(.started(index)) }
        slots[index].context = context
        slots[index].phase = .starting
        emit(.starting(service: member.name))
        if let deadline = member.startDeadline ?? group.configuration.startDeadline {
            slots[index].deadlineTask = deadlineTask(deadline, .startDeadline(index))
        }
        slots[index].task = task {
            let result: Result<Void, any Error>
            do {
                try await member.service.run(context)
                result = .success(())
            } catch {
                result = .failure(error)
            }
            sink.yield(.ended(index, result))
        }
    }

    func becomeReady() {
        guard !isReady else { return }
        isReady = true
        let manager = group.configuration.serviceManager
        if manager.notifier.isEnabled {
            var notifications: [ServiceNotification] = [.ready]
            if let status = manager.readyStatus?() { notifications.append(.status(status)) }
            notify(notifications)
            group.startWatchdog()
        }
        emit(.ready)
        // A group of services that all ended on their own (`.ignore`) has nothing left to run.
        if slots.allSatisfy(\.hasEnded) { beginStop(.allServicesEnded) }
    }

    func notify(_ notifications: [ServiceNotification]) {
        do {
            try group.configuration.serviceManager.notifier.notify(notifications)
        } catch {
            emit(.notificationFailed(error))
        }
    }

    // MARK: Events

    func handle(_ event: GroupEvent) {
        switch event {
        case .started(let index):
            guard case .starting = slots[index].phase else { return }
            slots[index].deadlineTask?.cancel()
            slots[index].deadlineTask = nil
            slots[index].phase = .running
            emit(.started(service: slots[index].member.name))
            startNext()
        case .ended(let index, let result):
            ended(index, result)
        case .signal(let signal):
            if stopReason == nil {
                beginStop(.signal(signal))
            } else {
                force(.signal(signal))
            }
        case .trigger:
            beginStop(.triggered)
        case .cancelled:
            force(.cancelled)
        case .startDeadline(let index):
            guard case .starting = slots[index].phase, stopReason == nil else { return }
            let member = slots[index].member
            let deadline = member.startDeadline ?? group.configuration.startDeadline ?? .zero
            failure = (member.name, ServiceGroup.StartTimedOut(service: member.name, deadline: deadline))
            beginStop(.serviceFailed(member.name))
        case .deadline(let index):
            guard case .stopping(let since) = slots[index].phase else { return }
            let deadline = deadline(of: index)
            slots[index].task?.cancel()
            finish(index, .cancelledAfterDeadline(deadline), stopDuration: now() - since)
            advanceStop()
        }
    }

    func ended(_ index: Int, _ result: Result<Void, any Error>) {
        let slot = slots[index]
        switch slot.phase {
        case .ended, .waiting:
            return  // given up on already (deadline, force): its late end changes nothing
        case .stopping(let since):
            let outcome: ServiceGroup.Outcome
            switch result {
            case .success: outcome = .stopped
            case .failure(let error): outcome = .failed(error)
            }
            finish(index, outcome, stopDuration: now() - since)
        case .starting, .running:
            let wasStarting: Bool
            if case .starting = slot.phase { wasStarting = true } else { wasStarting = false }
            let name = slot.member.name
            switch result {
            case .failure(let error):
                finish(index, .failed(error), stopDuration: nil)
                if stopReason == nil {
                    failure = (name, error)
                    beginStop(.serviceFailed(name))
                }
            case .success:
                if wasStarting && slot.member.whenItReturns == .ignore { emit(.started(service: name)) }
                finish(index, .returned, stopDuration: nil)
                switch slot.member.whenItReturns {
                case .ignore:
                    if wasStarting { startNext() } else if isReady, slots.allSatisfy(\.hasEnded) {
                        beginStop(.allServicesEnded)
                    }
                case .stopGroup:
                    if stopReason == nil { beginStop(.serviceReturned(name)) }
                case .failGroup:
                    if stopReason == nil {
                        failure = (name, nil)
                        beginStop(.serviceReturned(name))
                    }
                }
            }
        }
        if stopReason != nil { advanceStop() }
    }

    func finish(_ index: Int, _ outcome: ServiceGroup.Outcome, stopDuration: Duration?) {
        slots[index].deadlineTask?.cancel()
        slots[index].deadlineTask = nil
        slots[index].phase = .ended(outcome, stopDuration: stopDuration)
        emit(.ended(service: slots[index].member.name, outcome))
    }

    // MARK: Stopping

    func beginStop(_ reason: ServiceGroup.StopReason) {
        guard stopReason == nil else { return }
        stopReason = reason
        let manager = group.configuration.serviceManager
        group.stopWatchdog()
        if manager.notifier.isEnabled {
            var notifications: [ServiceNotification] = [.stopping]
            if let status = manager.stoppingStatus?(reason) { notifications.append(.status(status)) }
            notify(notifications)
        }
        emit(.stopRequested(reason))
        for index in slots.indices {
            if case .waiting = slots[index].phase { slots[index].phase = .ended(.notStarted, stopDuration: nil) }
        }
        advanceStop()
    }

    /// Asks the last service still running to stop, unless it is stopping already; finishes
    /// once every service has ended.
    func advanceStop() {
        guard !finished else { return }
        guard let index = slots.lastIndex(where: { !$0.hasEnded }) else {
            finished = true
            return
        }
        switch slots[index].phase {
        case .starting, .running:
            let deadline = deadline(of: index)
            slots[index].phase = .stopping(since: now())
            emit(.stopping(service: slots[index].member.name, deadline: deadline))
            slots[index].deadlineTask?.cancel()  // a start deadline still pending
            slots[index].deadlineTask = deadlineTask(deadline, .deadline(index))
            slots[index].context?.requestStop()
        default:
            break  // stopping already: its end (or deadline) calls this again
        }
    }

    func deadline(of index: Int) -> Duration {
        slots[index].member.stopDeadline ?? group.configuration.stopDeadline
    }

    func force(_ reason: ServiceGroup.StopReason) {
        guard !finished else { return }
        if stopReason == nil {
            stopReason = reason
            group.stopWatchdog()
        }
        forced = true
        emit(.forced(reason))
        for index in slots.indices.reversed() where !slots[index].hasEnded {
            let since: Duration?
            if case .stopping(let start) = slots[index].phase { since = start } else { since = nil }
            if case .waiting = slots[index].phase {
                slots[index].phase = .ended(.notStarted, stopDuration: nil)
                continue
            }
            slots[index].task?.cancel()
            finish(index, .cancelledByForce, stopDuration: since.map { now() - $0 })
        }
        finished = true
    }

    // MARK: The end

    func end() -> End {
        let services = slots.map { slot -> ServiceGroup.Report.ServiceEnd in
            guard case .ended(let outcome, let duration) = slot.phase else {
                return .init(name: slot.member.name, outcome: .notStarted, stopDuration: nil)
            }
            return .init(name: slot.member.name, outcome: outcome, stopDuration: duration)
        }
        let report = ServiceGroup.Report(reason: stopReason ?? .cancelled, services: services, forced: forced)
        if let failure {
            if let error = failure.error {
                return .failure(.serviceFailed(service: failure.service, error: error, report: report))
            }
            return .failure(.serviceReturnedEarly(service: failure.service, report: report))
        }
        return report.isClean ? .clean(report) : .failure(.stopIncomplete(report))
    }
}
