/// What a simulated program opens dies with it (`MainspringTesting`).
///
/// A real process's descriptors belong to it: when it exits, or is killed, the kernel closes
/// them — its peers read the end of the stream (or a reset, where input was left unread), its
/// ports are free again — and none of its code runs any more. A simulated program is a task on
/// the loop that spawned it, so the simulation does that itself: every source the program opens
/// (connections, listeners, datagram sockets, timers) is recorded as its own, and closed when
/// it ends, before its exit is reported.
///
/// A source is the program's when it is opened
/// - inside the program's task or a task it starts (`SimulatedOwnership.current`, a task-local
///   value the simulation sets around the program's task), or
/// - by the callback of a source that is the program's (a timer's handler, a listener's
///   accept), or accepted by one of its listeners (on whichever loop of a group).
///
/// Only simulated loops record owners: on a real loop `register` pays one test of a stored
/// flag, and the dispatch pass has no code for it (the real clock does not trace dispatches).

/// Something that owns sources on simulated loops: a simulated program (`MainspringTesting`).
@_spi(Simulation)
public protocol SimulatedOwner: AnyObject, Sendable {
    /// Whether the owner has ended: what it opens from then on (its task was cancelled, not
    /// stopped) is closed on the loop's next turn.
    var hasEnded: Bool { get }
}

/// The owner of what the current task opens on a simulated loop.
@_spi(Simulation)
public enum SimulatedOwnership {
    /// Set by the simulation around a program's task: what the task (and the tasks it starts)
    /// opens on a simulated loop is the program's.
    @TaskLocal public static var current: (any SimulatedOwner)?

    /// One owned source: its owner, and when it was opened (closing follows that order, so a
    /// seed replays it).
    struct Record {
        let owner: any SimulatedOwner
        let sequence: UInt64
    }
}

extension EventLoop {
    /// Records who opens `source` on this simulated loop, if a program does.
    func noteSimulatedOwner(of source: Source) {
        if let owner = currentSimulatedOwner { setSimulatedOwner(owner, of: source) }
    }

    private func record(_ owner: any SimulatedOwner, of source: Source) {
        simulatedOwnerSequence &+= 1
        simulatedOwners[ObjectIdentifier(source)] = SimulatedOwnership.Record(owner: owner, sequence: simulatedOwnerSequence)
    }

    /// The dispatch pass is about to run `job`: what it opens is its source's owner's (a
    /// posted closure's, a task job's: nobody's here; a task carries its owner itself). The
    /// owner of a dispatch this one runs inside (a nested spin) is kept for `noteDispatchEnded`.
    func noteDispatch(of job: borrowing ReadyRecord.Job) {
        interruptedOwners.append(dispatchingOwner)
        guard !simulatedOwners.isEmpty else {
            dispatchingOwner = nil
            return
        }
        switch job {
        case .source(let source): dispatchingOwner = simulatedOwners[ObjectIdentifier(source)]?.owner
        default: dispatchingOwner = nil
        }
    }

    /// The dispatch of `noteDispatch` ended: the owner is its caller's again (nil after a
    /// pass's own dispatch: code between dispatches — the test's, the network's — opens for
    /// nobody).
    func noteDispatchEnded() {
        dispatchingOwner = interruptedOwners.popLast() ?? nil
    }

    /// Who is opening sources on this simulated loop right now: the current task's owner, else
    /// the owner of the dispatch in progress. nil on a real loop.
    /// `package`: MainspringTLS carries it from a connect to the connection its handshake makes.
    package var currentSimulatedOwner: (any SimulatedOwner)? {
        guard isSimulated else { return nil }
        return SimulatedOwnership.current ?? dispatchingOwner
    }

    /// The program that opened `source` on this simulated loop, if one did.
    func simulatedOwner(of source: Source) -> (any SimulatedOwner)? {
        guard isSimulated, !simulatedOwners.isEmpty else { return nil }
        return simulatedOwners[ObjectIdentifier(source)]?.owner
    }

    /// Makes `source` `owner`'s (what it opens; a connection accepted by an owned listener,
    /// made on this loop from a post). An owner that has ended gets nothing: the source closes
    /// on the next turn (a killed program's task runs on until it notices its cancellation:
    /// nothing it opens meanwhile outlives the turn).
    func setSimulatedOwner(_ owner: any SimulatedOwner, of source: Source) {
        guard isSimulated, !source.isClosed else { return }
        if owner.hasEnded {
            executeNextTurn(priority: .input) { source.close() }
            return
        }
        record(owner, of: source)
    }

    /// Makes `connection` `owner`'s (a connection a layer made once its handshake ended, for
    /// the connect that `owner` started).
    /// `package`: MainspringTLS, for its simulated handshakes.
    package func setSimulatedOwner(_ owner: (any SimulatedOwner)?, of connection: Connection) {
        guard let owner else { return }
        setSimulatedOwner(owner, of: connection.source)
    }

    /// Closes every source that `owner` opened on this simulated loop, as the kernel closes a
    /// process's descriptors when it ends: a connection at once (what it had not handed to its
    /// socket is lost; the peer reads the end of the stream, or a reset where input was left
    /// unread), a listener (connections waiting in its backlog are reset), a datagram socket (its
    /// port is free), a timer (it never fires). Returns how many it closed. On the thread driving
    /// the simulation.
    @_spi(Simulation)
    @discardableResult
    public func closeSources(openedBy owner: any SimulatedOwner) -> Int {
        guard isSimulated else { return 0 }
        let owned = simulatedOwners.filter { $0.value.owner === owner }.sorted { $0.value.sequence < $1.value.sequence }
        let closing = owned.compactMap { sources[$0.key] }
        for (id, _) in owned { simulatedOwners[id] = nil }
        if let current = dispatchingOwner, current === owner { dispatchingOwner = nil }
        for source in closing { source.close() }
        return closing.count
    }
}

/// The simulation a task belongs to (`MainspringTesting`): set around a simulation's body and
/// its programs' tasks, inherited by the tasks they start.
@_spi(Simulation)
public enum SimulationContext {
    /// The simulated loop whose clock is the task's time.
    @TaskLocal public static var loop: EventLoop?
}

extension EventLoop {
    /// The simulated loop of the simulation whose task calls this (nil outside one): what a
    /// component with no loop of its own keeps its time on in a simulation.
    /// `package`: `ServiceGroup`, run without a loop.
    package static var simulationOfCurrentTask: EventLoop? { SimulationContext.loop }
}
