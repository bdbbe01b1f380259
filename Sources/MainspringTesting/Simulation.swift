@_spi(Simulation) import MainspringCore
import Foundation
import Synchronization

/// A whole program on virtual time: simulated event loops that run on the thread that drives
/// them, a clock that moves only when the simulation moves it, modelled CPU, and a seed that
/// decides every order a real loop leaves open — so timeouts, scheduling and fairness are tested
/// exactly, in microseconds, the same way every run.
///
/// ```swift
/// let simulation = try Simulation(seed: 42)
/// var fired: [Duration] = []
/// simulation.loop.schedule(after: .seconds(2)) { fired.append(simulation.now) }
/// simulation.advance(by: .seconds(1))   // nothing yet
/// simulation.advance(by: .seconds(1))   // fired == [.seconds(2)]
/// ```
///
/// ## Time
/// Virtual time starts at zero. Only two things take it: waiting (`advance(by:)`, and `run`
/// jumping to the next deadline when nothing is runnable) and modelled CPU (`consume(_:)`). A
/// post, a dispatch, a timer's arming take none. Every clock the library reads for a simulated
/// loop is this one: timers, `sleep(for:)`, the scheduler's poll interval and fairness rules,
/// `Feeder` budgets, stall detection, `LoopMetrics`, `Timeline` frames, spin timeouts,
/// `Queue.after`, subprocess grace periods, and `loop.clock` for your own code.
/// `Task.sleep`, `ContinuousClock` and `Date` read the machine's time, which the simulation
/// can neither see nor move: **inject `loop.clock` instead**, or such code waits for real and
/// is not deterministic.
///
/// ## Order
/// What a real loop promises is kept: FIFO per producer, priorities, timers due at one instant
/// in creation order, no handler re-entered. Where it promises nothing — which of several loops
/// runs next — the seed decides. The same seed and the same program give the same ``trace``: a
/// test that fails can print its seed, and `Simulation(seed:)` with it replays the failure.
///
/// ## Threads
/// The simulation's loops belong to the thread that drives it: the caller of ``advance(by:)``
/// and ``runUntilIdle()``, or the thread ``run(_:)`` drives from. Between two steps, any one
/// thread may use the loops (a test's body may resume on another thread after an `await`); two
/// threads may not drive it at once (precondition).
///
/// ## The network
/// `Listener`, `Connection` (connect by address, by name or by Unix path, `makePair(on:)`), what rides on
/// them (`HTTPClient`) and `DatagramSocket` run unchanged over the simulation's ``network``: in
/// memory, on virtual time, with its latency, segment size, window, partitions and resets, and
/// datagrams lost, duplicated or reordered as the seed chooses.
///
/// ## Nothing real mixed in
/// Real descriptors, signals and child processes (other than registered programs) on a simulated
/// loop are refused with `EventLoopError.simulatedLoop`, rather than mixing real I/O with
/// virtual time (whose timeouts would then fire spuriously).
public final class Simulation: @unchecked Sendable {
    /// The seed every choice of this simulation comes from.
    public let seed: UInt64
    /// The simulation's first loop (index 0 in the ``trace``).
    public let loop: EventLoop
    let core: SimulationCore
    /// The loops of groups made with `makeGroup(loopCount:)`, kept alive with the simulation.
    private let groups = Protected<[EventLoopGroup]>([])

    /// Makes a simulation with one loop.
    /// - Parameters:
    ///   - seed: decides every order the program leaves open; the same seed replays a run.
    ///   - configuration: the settings of the simulation's loops (poll interval, fairness,
    ///     metrics), as for a real loop.
    /// - Throws: `EventLoopError` when the loop cannot be made (it still has one real eventfd,
    ///   for posts from other threads: out of descriptors, say).
    public init(seed: UInt64 = 0, configuration: EventLoop.Configuration = .init()) throws {
        self.seed = seed
        let core = SimulationCore(seed: seed)
        self.core = core
        loop = try EventLoop(simulation: core, configuration: configuration)
        _ = core.add(loop)
        core.networkCore.setHost("127.0.0.1", for: loop)
        network = SimulatedNetwork(simulation: core)
    }

    /// The simulation's network: listeners and connections on its loops run over it, in memory
    /// and on virtual time, with its latency, segments and faults.
    public let network: SimulatedNetwork

    deinit {
        // What only this simulation reads (its programs, the record of those spawned) held its
        // loops and core in a cycle: let go (see `SimulationCore.simulationReleased`).
        core.simulationReleased()
    }

    /// Virtual time since the simulation started.
    public var now: Duration { Duration(nanoseconds: core.clock.elapsed) }

    /// Moves virtual time forward by `duration`, running everything that falls due on the way
    /// **in deadline order, each callback seeing the clock at its own deadline** (a timer due at
    /// 3 s runs with `now == 3 s`, even inside `advance(by: .seconds(10))`), on every loop of
    /// the simulation; returns at the new instant with nothing left runnable. A negative
    /// duration counts as zero (it only runs what is runnable now). Synchronous; the calling
    /// thread drives the simulation.
    public func advance(by duration: Duration) {
        core.withDriving {
            core.advance(to: core.clock.nanoseconds &+ duration.clampedNanoseconds)
        }
    }

    /// Runs what is runnable at the current instant, on every loop, until nothing is left —
    /// without moving time (timers due later stay armed). Synchronous; the calling thread drives
    /// the simulation.
    public func runUntilIdle() {
        core.withDriving { _ = core.runUntilIdle() }
    }

    /// Makes the callback in progress take `duration` of virtual time, as if it computed that
    /// long: the scheduler, its poll interval, `Feeder` budgets, `backgroundShare`, stall
    /// detection, `LoopMetrics` and `FairnessReport` all see it, and so does every timer due
    /// meanwhile (it fires late, as on a busy loop). Call it inside a callback, a fed chunk or a
    /// task's slice on a simulated loop. The loops of one simulation share one modelled CPU: the
    /// time passes for all of them. A negative duration counts as zero.
    public func consume(_ duration: Duration) {
        core.clock.advance(by: duration.clampedNanoseconds)
    }

    /// One entry per dispatch so far, in order: the virtual instant, the loop's index, the kind
    /// of what ran ("work", "task", "actor", "source") and which ("execute", "job", the source's
    /// kind such as "TimerSource"). Two simulations of one program with one seed have equal
    /// traces. Read it on the driving thread, between steps.
    public var trace: [SimulationTrace.Entry] { core.trace }

    /// Whether dispatches are recorded in ``trace`` (default on; turn it off for long runs, whose
    /// trace would grow with every callback).
    public var isTracing: Bool {
        get { core.isTracing }
        set { core.isTracing = newValue }
    }

    /// Registers `body` as the program `Subprocess.launch` runs, on this simulation's loops, for
    /// the executable `name` (matched as given, or by its last path component): it gets its
    /// ``SimulatedProcess`` (arguments, output, virtual-time sleep, signals) and returns its
    /// exit code. A spawn of a name nobody registered fails as a missing program does
    /// (`SubprocessError.cannotStart`, `ENOENT`). Registering a name again replaces it.
    public func register(program name: String,
                         _ body: @escaping @Sendable (SimulatedProcess) async throws -> Int32)
    {
        core.withDriving { core.programs[name] = body }
    }

    /// Every program spawned on the simulation so far, in order. Read it on the driving thread,
    /// between steps.
    public var processes: [SimulatedProcess] { core.processes }

    /// An `EventLoopGroup` of `loopCount` loops simulated on the driving thread: code written
    /// for a group — listeners on it, actors pinned to its loops, `Task(executorPreference:)`,
    /// `submit`, posts between loops — runs unchanged, and the seed decides which loop runs
    /// when several could. The loops share the simulation's clock and modelled CPU; their
    /// indices in the ``trace`` follow ``loop`` (0) in creation order.
    ///
    /// `shutdown(gracePeriod:)` (or `shutdownBlocking(gracePeriod:)`) on such a group runs the
    /// loops' shutdowns on virtual time before it returns (call it from the test, or from a task
    /// on a loop outside the group).
    ///
    /// One limit of simulating several loops on one thread: a loop that spins (`spin(until:)`,
    /// and so each loop's graceful shutdown) holds the thread while it waits. Other loops run
    /// inside its waits, but one that is itself spinning further up the stack resumes only
    /// when the inner spin returns, so its timers can fire late (never early).
    /// - Throws: `EventLoopError` when a loop cannot be made.
    ///
    /// The group's loops are one host of the simulated network, `host` (a dotted IPv4
    /// address): its listeners listen there, its connections come from there, and
    /// ``SimulatedNetwork/partition(_:_:)`` and ``SimulatedNetwork/reset(_:_:)`` name it.
    /// ``loop`` is host `127.0.0.1`.
    public func makeGroup(loopCount: Int, host: String = "127.0.0.1", configuration: EventLoop.Configuration = .init())
        throws -> EventLoopGroup
    {
        var made: [EventLoop] = []
        for _ in 0..<max(1, loopCount) {
            let member = try EventLoop(simulation: core, configuration: configuration)
            _ = core.add(member)
            core.withDriving { core.networkCore.setHost(host, for: member) }
            made.append(member)
        }
        let group = EventLoopGroup(simulatedLoops: made)
        groups.withLock { $0.append(group) }
        return group
    }

    /// Runs `body` as a task that prefers the simulation's ``loop``, driving the simulation on a
    /// thread of its own until the body returns (its value) or throws (rethrown): whenever
    /// nothing is runnable, virtual time jumps to the next deadline, so a body that sleeps an
    /// hour returns at once.
    ///
    /// When nothing is runnable, no deadline is armed and the body has not returned, nothing can
    /// ever happen: `run` throws ``SimulationError/deadlock(at:waiting:)``, whose description
    /// says "deadlock" and names what is still waiting. (Work on other executors — a default
    /// actor, `Task.detached` — is given a quarter of a second of real time to come back before
    /// that verdict; it is not deterministic, and virtual time does not wait for it while
    /// deadlines are armed.)
    public func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
            let thread = Thread { [self] in
                continuation.resume(with: drive(body))
            }
            thread.name = "mainspring.simulation"
            thread.start()
        }
    }

    /// ``run(_:)`` on the calling thread: runs `body` as a task that prefers the simulation's
    /// ``loop`` and drives the simulation here until the body returns (its value) or throws
    /// (rethrown) — with the same deadlock verdict. For synchronous code (a soak, a benchmark,
    /// a synchronous test) that has async steps to take between `advance(by:)` calls. The
    /// calling thread blocks meanwhile: do not call it from a task of the cooperative pool in
    /// a process that needs that thread.
    public func runSynchronously<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        try drive(body).get()
    }

    /// The driving loop of `run`, on its thread.
    private func drive<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) -> Result<T, Error> {
        let outcome = Outcome<T>()
        return core.withDriving {
            let task = SimulationContext.$loop.withValue(loop) { Task(executorPreference: loop) {
                let result: Result<T, Error>
                do { result = .success(try await body()) } catch { result = .failure(error) }
                outcome.value.withLock { $0 = result }
            } }
            let finished = { outcome.value.withLock { $0 != nil } }
            while !finished() {
                core.runUntilIdle()
                if finished() { break }
                if let next = core.earliestDeadline() {
                    core.clock.advance(to: next)
                    continue
                }
                if core.waitForCrossThreadWork(extra: finished) { continue }
                task.cancel()
                return .failure(SimulationError.deadlock(at: now, waiting: "the body of run (a suspended task); \(core.openSourcesReport())"))
            }
            return outcome.value.withLock { $0! }
        }
    }
}

extension Simulation: CustomStringConvertible {
    /// "Simulation(seed: 42) at 1.5 seconds": put it in a failing test's message, and
    /// `Simulation(seed: 42)` replays the run.
    public var description: String { "Simulation(seed: \(seed)) at \(now)" }
}

/// The result of `run`'s body, set on the loop, read by the driver.
private final class Outcome<T: Sendable>: Sendable {
    let value = Protected<Result<T, Error>?>(nil)
}

/// What went wrong in a simulation.
public enum SimulationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// At virtual instant `at`, nothing was runnable and no deadline was armed, while `waiting`
    /// (the body of `run`, the loops' open sources) still waited: nothing could ever happen.
    case deadlock(at: Duration, waiting: String)

    public var description: String {
        switch self {
        case let .deadlock(at, waiting):
            return "deadlock at \(at) of virtual time: nothing is runnable and no deadline is armed; still waiting: \(waiting)"
        }
    }
}

/// The record of a simulation's dispatches (see ``Simulation/trace``).
public enum SimulationTrace {
    /// One dispatch: when, on which loop, what.
    public struct Entry: Sendable, Equatable, Hashable, CustomStringConvertible {
        /// The virtual instant it ran at.
        public let instant: Duration
        /// The loop's index in its simulation (0 is ``Simulation/loop``).
        public let loop: Int
        /// What ran: "work" (a posted closure), "task" or "actor" (a job of Swift concurrency),
        /// or "source" (a timer, a watcher, a connection…).
        public let kind: String
        /// Which: "execute", "job", or the source's kind ("TimerSource").
        public let label: String

        public init(instant: Duration, loop: Int, kind: String, label: String) {
            self.instant = instant
            self.loop = loop
            self.kind = kind
            self.label = label
        }

        public var description: String { "\(instant) loop \(loop) \(kind) \(label)" }
    }
}
