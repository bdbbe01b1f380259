import MainspringCore

/// One run of a group: the state machine that `run()` drives, on its task alone.
final class GroupRun {
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
