#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// The one clock seam of a loop: every instant the library reads for a loop — its timers, its
/// scheduler's stamps and pass deadlines, feeder budgets, spin timeouts, sleeps — comes from
/// here.
///
/// A real loop reads the calibrated cycle counter (`FastClock`) for its dispatcher's
/// bookkeeping and `CLOCK_MONOTONIC` for deadlines, as before: the seam costs one predictable
/// branch on a nil reference. A simulated loop (`MainspringTesting`) reads its simulation's
/// `VirtualClock` for both, so that time moves only when the simulation moves it.
struct DispatchClock: SchedulerClock {
    let fast: FastClock
    /// The simulation's clock; nil on a real loop. Unmanaged, read without a retain: the loop
    /// keeps its simulation, which keeps its clock (`EventLoop.simulation`). (An `unowned`
    /// optional would be retained and released by every read, on real loops too.)
    let virtual: Unmanaged<VirtualClock>?

    init(fast: FastClock, virtual: VirtualClock?) {
        self.fast = fast
        self.virtual = virtual.map { Unmanaged.passUnretained($0) }
    }

    /// Now, on the dispatcher's scale (`FastClock`, or virtual nanoseconds).
    @inline(__always)
    func now() -> UInt64 {
        if let virtual { return virtual._withUnsafeGuaranteedRef { $0.nanoseconds } }
        return fast.now()
    }

    /// Now, on the deadlines' scale (`CLOCK_MONOTONIC`, or virtual nanoseconds).
    @inline(__always)
    func monotonicNow() -> UInt64 {
        if let virtual { return virtual._withUnsafeGuaranteedRef { $0.nanoseconds } }
        return monotonicNanoseconds()
    }
}

/// The virtual time of a simulation, moved only by the simulation (`advance`, jumping to the
/// next deadline, modelled CPU).
///
/// Its readings start at ``epoch``, not at zero, so that no reading of a simulated loop is ever
/// 0: the library uses 0 for "not stamped yet" in a few places, as a real clock (time since
/// boot) never reads it. `elapsed` is the time since the simulation started.
///
/// Any thread reads it (an atomic load); the thread that drives the simulation moves it.
@_spi(Simulation)
public final class VirtualClock: Sendable {
    /// The first reading: 1,000 s.
    public static let epoch: UInt64 = 1_000_000_000_000

    private let storage = Atomic<UInt64>(VirtualClock.epoch)

    public init() {}

    /// Now, on the loop's scale (``epoch`` at the start).
    @inline(__always)
    public var nanoseconds: UInt64 { storage.load(ordering: .relaxed) }

    /// Nanoseconds since the simulation started.
    public var elapsed: UInt64 { nanoseconds &- Self.epoch }

    /// Moves the clock forward to `instant`; an instant in the past leaves it where it is
    /// (virtual time never goes back).
    public func advance(to instant: UInt64) {
        if instant > nanoseconds { storage.store(instant, ordering: .relaxed) }
    }

    /// Moves the clock forward by `nanoseconds`.
    public func advance(by nanoseconds: UInt64) {
        storage.store(self.nanoseconds &+ nanoseconds, ordering: .relaxed)
    }
}

extension VirtualClock {
    /// The calendar date of a simulation's start, in seconds since 1970-01-01 UTC:
    /// 2026-01-01 00:00:00 UTC. A simulated loop's calendar time is this plus the virtual time,
    /// the same at every run.
    public static let calendarStart = 1_767_225_600

    /// The calendar time now, in whole seconds since 1970-01-01 UTC: ``calendarStart`` plus
    /// ``elapsed``.
    public var calendarSeconds: Int { Self.calendarStart + Int(elapsed / 1_000_000_000) }
}

extension EventLoop {
    /// Now, on the deadlines' scale: `CLOCK_MONOTONIC` nanoseconds on a real loop, virtual ones
    /// on a simulated loop. Any thread. (Package: the HTTP server's deadlines read it too.)
    @inline(__always)
    package func monotonicNow() -> UInt64 { timeSource.monotonicNow() }
}

extension EventLoop {
    /// The calendar time in whole seconds since 1970-01-01 UTC, as the loop sees it: the
    /// system's (`time()`, through the vDSO: no system call) on a real loop; on a simulated
    /// loop (`MainspringTesting`) 2026-01-01 00:00:00 UTC at the simulation's start plus the
    /// virtual time, so that what a program dates (an HTTP response's `Date`) is the same at
    /// every run of a seed. Any thread. (Package: the HTTP server dates its responses with it.)
    package func calendarSeconds() -> Int {
        timeSource.virtual?._withUnsafeGuaranteedRef { $0.calendarSeconds } ?? Int(time(nil))
    }

    /// ``calendarSeconds()`` in milliseconds: the system's calendar (`CLOCK_REALTIME`) on a real
    /// loop, the simulation's start plus the virtual time on a simulated one. Any thread.
    /// (Package: the KV example's key expiry reads it.)
    package func calendarMilliseconds() -> Int64 {
        if let clock = timeSource.virtual?._withUnsafeGuaranteedRef({ $0 }) {
            return Int64(VirtualClock.calendarStart) * 1_000 + Int64(clock.elapsed / 1_000_000)
        }
        return realtimeMilliseconds()
    }
}

/// What drives simulated loops (`MainspringTesting`'s `Simulation`): owns their virtual clock,
/// decides what happens when a loop waits with nothing runnable, and records every dispatch.
@_spi(Simulation)
public protocol LoopSimulating: AnyObject, Sendable {
    /// The simulation's virtual clock, shared by all its loops.
    var clock: VirtualClock { get }

    /// `loop` waits (it runs or spins) with nothing runnable at the current instant: run the
    /// simulation's other loops and move virtual time to the next deadline, no later than
    /// `deadline` (virtual ns; nil: no limit). Returns false when nothing can ever become
    /// runnable: no loop has work, and no deadline is armed.
    func waitForWork(on loop: EventLoop, until deadline: UInt64?) -> Bool

    /// Whether `willDispatch` wants to hear of dispatches (the trace is on): when it is off, no
    /// label is made.
    var isTracing: Bool { get }

    /// One dispatch on `loop`, about to run at the current virtual instant: `kind` is what runs
    /// ("work", "task", "actor", or a source's kind) and `label` says which.
    func willDispatch(on loop: EventLoop, kind: String, label: String)

    /// A loop-thread-only call on `loop` from a thread that does not own it: whether the
    /// calling thread may take the simulation's loops over (nothing drives them right now).
    func adoptCallingThread(for loop: EventLoop) -> Bool

    /// Runs what is runnable on the simulation's loops now (loops inside a dispatch pass up the
    /// stack excepted), as the calling thread: a simulated group's `shutdown` uses it, so that
    /// its report is complete when it returns.
    func driveUntilIdle()

    /// The program registered under `executable` for a spawn on `loop`, not started yet; nil
    /// when none is (the spawn then fails as for a missing program).
    func makeProgram(executable: String, arguments: [String], environment: [String: String]?,
                     on loop: EventLoop) -> (any SimulatedChild)?

    /// The simulation's network (see `SimulatedNetworking`); nil: sockets are refused.
    var network: (any SimulatedNetworking)? { get }

    /// The next number of the simulation's stream for the code under test (a client's
    /// backoff jitter): from the seed, so that a replay draws the same.
    func nextRandom() -> UInt64
}

extension EventLoop {
    /// A random number in `0..<1` for the code running on this loop (a backoff's jitter): from
    /// the system's generator on a real loop, from the simulation's seed on a simulated one (a
    /// replay draws the same). Any thread for a real loop; the driving thread for a simulated one.
    /// `package`: MainspringHTTP's retries.
    package func randomUnit() -> Double {
        let bits = simulation?.nextRandom() ?? UInt64.random(in: .min ... .max)
        return Double(bits >> 11) / Double(1 << 53)
    }
}

/// The scheduler's clock on a simulated loop: virtual time, and every dispatch told to the
/// simulation (its trace).
struct SimulatedDispatchClock: SchedulerClock {
    unowned(unsafe) let loop: EventLoop
    unowned(unsafe) let simulation: any LoopSimulating
    /// The simulation's clock, read without a retain or a witness call (twice per callback).
    private let clock: Unmanaged<VirtualClock>
    /// Who opened the loop's sources: a dispatch's callback opens for its source's opener.
    private let ownership: SimulatedOwnerships?

    init(loop: EventLoop, simulation: any LoopSimulating) {
        self.loop = loop
        self.simulation = simulation
        clock = Unmanaged.passUnretained(simulation.clock)
        ownership = loop.world.ownership
    }

    @inline(__always)
    func now() -> UInt64 { clock._withUnsafeGuaranteedRef { $0.nanoseconds } }

    static var tracesDispatches: Bool { true }

    func willRun(_ job: borrowing ReadyRecord.Job) {
        ownership?.willDispatch(job)
        guard simulation.isTracing else { return }
        switch job {
        case .work, .loopWork: simulation.willDispatch(on: loop, kind: "work", label: "execute")
        case .source(let source): simulation.willDispatch(on: loop, kind: "source", label: source.traceLabel)
        case .taskJob: simulation.willDispatch(on: loop, kind: "task", label: "job")
        case .actorJob: simulation.willDispatch(on: loop, kind: "actor", label: "job")
        case .done: break
        }
    }

    func didRun() { ownership?.dispatchEnded() }
}

extension EventLoop {
    /// This loop's time as a Swift `Clock`: monotonic time on a real loop, the simulation's
    /// virtual time on a simulated one (`MainspringTesting`). Any thread.
    ///
    /// Inject it wherever your code would read `ContinuousClock` or call `Task.sleep`: those
    /// read the machine's time, which a simulation cannot see or move, so code that uses them
    /// waits for real in a test and is not deterministic. `clock.sleep(for:)` is
    /// ``sleep(for:)`` on this loop (one of its timers).
    public var clock: LoopClock { LoopClock(loop: self) }

    /// Takes a simulated loop over for the calling thread (`MainspringTesting`: the thread that
    /// drives the simulation right now). Does nothing on a real loop.
    @_spi(Simulation)
    public func adoptCallingThreadForSimulation() {
        guard simulation != nil, !isOrphaned else { return }
        ownerThread.store(currentThreadID(), ordering: .releasing)
    }
}

/// A loop's time as a Swift `Clock` (see ``EventLoop/clock``): `CLOCK_MONOTONIC` on a real loop,
/// virtual time on a simulated one. Sleeping is one of the loop's timers, so it only ends while
/// the loop runs; it throws `CancellationError` when the task is cancelled.
public struct LoopClock: Clock, Sendable {
    /// An instant on a loop's clock: nanoseconds on its scale (since boot on a real loop; on a
    /// simulated one, from an epoch of 1,000 s at the simulation's start). Instants of different loops compare only
    /// when the loops share a clock (real loops do; loops of one simulation do).
    public struct Instant: InstantProtocol, Sendable, Hashable, Comparable {
        /// Nanoseconds on the clock's scale.
        public let nanoseconds: UInt64

        public init(nanoseconds: UInt64) { self.nanoseconds = nanoseconds }

        public func advanced(by duration: Duration) -> Instant {
            let step = duration.clampedSignedNanoseconds
            if step >= 0 { return Instant(nanoseconds: nanoseconds &+ UInt64(step)) }
            let back = step.magnitude
            return Instant(nanoseconds: nanoseconds > back ? nanoseconds - back : 0)
        }

        public func duration(to other: Instant) -> Duration {
            other.nanoseconds >= nanoseconds
                ? .nanoseconds(Int64(clamping: other.nanoseconds - nanoseconds))
                : .nanoseconds(-Int64(clamping: nanoseconds - other.nanoseconds))
        }

        public static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.nanoseconds < rhs.nanoseconds }
    }

    /// The loop whose time this is.
    public let loop: EventLoop

    public var now: Instant { Instant(nanoseconds: loop.monotonicNow()) }

    /// One nanosecond: deadlines keep their nanoseconds (libevent's own timer has microseconds,
    /// and a real timer fires within tens of microseconds of its deadline).
    public var minimumResolution: Duration { .nanoseconds(1) }

    /// Suspends the calling task until `deadline` on this loop's clock (one of the loop's
    /// timers; `tolerance` is ignored). Throws `CancellationError` when the task is cancelled.
    public func sleep(until deadline: Instant, tolerance: Duration? = nil) async throws {
        try await loop.sleep(for: now.duration(to: deadline))
    }
}

/// A program that stands in for a child process on a simulated loop (`MainspringTesting`).
@_spi(Simulation)
public protocol SimulatedChild: AnyObject, Sendable {
    /// The process ID the simulation gave it (never a real process's: signals go to the
    /// program, not to `kill(2)`).
    var processIdentifier: Int32 { get }
    /// Starts the program with its ends of its standard input, output and error (nil: not a
    /// pipe — `.inherit`, `.null`; a merged standard error is its standard output's connection);
    /// `exited` is called once, with how it ended.
    func start(standardStreams: [Connection?], exited: @escaping @Sendable (Subprocess.ExitStatus) -> Void)
    /// Delivers `signal` to the program. Any thread; must not call back into the process
    /// synchronously (post to the loop).
    func deliver(signal: Int32)
}

extension LoopSimulating {
    /// No programs: every spawn on the simulation's loops fails as a missing program does.
    public func makeProgram(executable: String, arguments: [String], environment: [String: String]?,
                            on loop: EventLoop) -> (any SimulatedChild)?
    {
        nil
    }
}
