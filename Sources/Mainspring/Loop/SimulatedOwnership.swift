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

/// Who opened each source of one simulated loop that a simulated program opened: the loop's
/// simulated world keeps it (`SimulatedWorld.ownership`); a kernel's world has none. Loop
/// thread only (the thread driving the simulation).
final class SimulatedOwnerships {
    /// The owner of each owned source, with when it was opened.
    var records: [ObjectIdentifier: SimulatedOwnership.Record] = [:]
    /// Numbers the records, so that closing follows opening order.
    var sequence: UInt64 = 0
    /// The owner of the source being dispatched right now, if a program opened it (what its
    /// callback opens is the program's too); nil between dispatches.
    var dispatchingOwner: (any SimulatedOwner)?
    /// The owners of the dispatches a nested spin interrupted, innermost last (each dispatch
    /// restores its caller's when it ends).
    var interruptedOwners: [(any SimulatedOwner)?] = []

    /// Who is opening sources right now: the current task's owner, else the owner of the
    /// dispatch in progress.
    var current: (any SimulatedOwner)? { SimulatedOwnership.current ?? dispatchingOwner }

    func record(_ owner: any SimulatedOwner, of source: Source) {
        sequence &+= 1
        records[ObjectIdentifier(source)] = SimulatedOwnership.Record(owner: owner, sequence: sequence)
    }

    /// The dispatch pass is about to run `job`: what it opens is its source's owner's (a
    /// posted closure's, a task job's: nobody's here; a task carries its owner itself). The
    /// owner of a dispatch this one runs inside (a nested spin) is kept for `dispatchEnded`.
    func willDispatch(_ job: borrowing ReadyRecord.Job) {
        interruptedOwners.append(dispatchingOwner)
        guard !records.isEmpty else {
            dispatchingOwner = nil
            return
        }
        switch job {
        case .source(let source): dispatchingOwner = records[ObjectIdentifier(source)]?.owner
        default: dispatchingOwner = nil
        }
    }

    /// The dispatch of `willDispatch` ended: the owner is its caller's again (nil after a
    /// pass's own dispatch: code between dispatches — the test's, the network's — opens for
    /// nobody).
    func dispatchEnded() {
        dispatchingOwner = interruptedOwners.popLast() ?? nil
    }
}

extension EventLoop {
    /// Who is opening sources on this simulated loop right now: the current task's owner, else
    /// the owner of the dispatch in progress. nil on a real loop.
    /// `package`: MainspringTLS carries it from a connect to the connection its handshake makes.
    package var currentSimulatedOwner: (any SimulatedOwner)? { world.ownership?.current }

    /// The program that opened `source` on this simulated loop, if one did.
    func simulatedOwner(of source: Source) -> (any SimulatedOwner)? {
        guard let ownership = world.ownership, !ownership.records.isEmpty else { return nil }
        return ownership.records[ObjectIdentifier(source)]?.owner
    }

    /// Makes `source` `owner`'s (what it opens; a connection accepted by an owned listener,
    /// made on this loop from a post). An owner that has ended gets nothing: the source closes
    /// on the next turn (a killed program's task runs on until it notices its cancellation:
    /// nothing it opens meanwhile outlives the turn).
    func setSimulatedOwner(_ owner: any SimulatedOwner, of source: Source) {
        guard let ownership = world.ownership, !source.isClosed else { return }
        if owner.hasEnded {
            executeNextTurn(priority: .input) { source.close() }
            return
        }
        ownership.record(owner, of: source)
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
        guard let ownership = world.ownership else { return 0 }
        let owned = ownership.records.filter { $0.value.owner === owner }.sorted { $0.value.sequence < $1.value.sequence }
        let closing = owned.compactMap { sources[$0.key] }
        for (id, _) in owned { ownership.records[id] = nil }
        if let current = ownership.dispatchingOwner, current === owner { ownership.dispatchingOwner = nil }
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
