@_spi(Simulation) import MainspringCore
import Synchronization

/// The engine of a `Simulation`: its virtual clock, its loops, the seeded choices, the trace.
///
/// Everything but the clock and the driver's thread is touched only by the thread that drives
/// the simulation (`withDriving`), which is why it is `@unchecked Sendable`: the loops call it
/// back on that thread, from inside their dispatch.
final class SimulationCore: LoopSimulating, @unchecked Sendable {
    let clock = VirtualClock()

    /// The simulation's loops, by index (held weakly: the `Simulation` and its groups hold them).
    private var loops: [WeakLoop] = []
    private var indices: [ObjectIdentifier: Int] = [:]
    /// Loops whose dispatch pass the driver is inside of (their thread is busy): not run again
    /// until it returns, except by a nested spin of their own.
    private var dispatching: Set<Int> = []
    private var random: SplitMix64
    private(set) var trace: [SimulationTrace.Entry] = []
    /// Whether dispatches are traced (on by default; off for long soak runs).
    var isTracing = true

    /// The thread driving the simulation right now, and how deeply.
    private let driver = Protected(Driver())

    private struct Driver {
        var thread: UInt = 0
        var depth = 0
    }

    private struct WeakLoop {
        weak var loop: EventLoop?
    }

    /// The programs `Subprocess.launch` runs on the simulation's loops, by executable name.
    var programs: [String: @Sendable (SimulatedProcess) async throws -> Int32] = [:]
    /// Every program spawned so far, in order.
    private(set) var processes: [SimulatedProcess] = []
    private var nextProcessIdentifier: Int32 = 1_000_000

    /// The simulation's network: its streams' bytes move between the loops' dispatches.
    let networkCore: NetworkCore

    init(seed: UInt64) {
        random = SplitMix64(seed: seed)
        programRandom = SplitMix64(seed: seed ^ 0x5EED_F0E5_0F_C0DE)
        networkCore = NetworkCore(clock: clock, seed: seed)
    }

    /// The stream of the code under test (`nextRandom`): apart from the scheduler's, so that
    /// drawing from it leaves the loops' order as it was.
    private var programRandom: SplitMix64

    func nextRandom() -> UInt64 { programRandom.next() }

    var network: (any SimulatedNetworking)? { networkCore }

    func makeProgram(executable: String, arguments: [String], environment: [String: String]?,
                     on loop: EventLoop) -> (any SimulatedChild)?
    {
        let name = executable.split(separator: "/").last.map(String.init) ?? executable
        guard let body = programs[executable] ?? programs[name] else { return nil }
        nextProcessIdentifier += 1
        let process = SimulatedProcess(executable: executable, arguments: arguments, environment: environment,
                                       processIdentifier: nextProcessIdentifier, loop: loop, simulation: self,
                                       body: body)
        processes.append(process)
        return SimulatedChildProcess(process)
    }

    // MARK: Loops

    func add(_ loop: EventLoop) -> Int {
        let index = loops.count
        loops.append(WeakLoop(loop: loop))
        indices[ObjectIdentifier(loop)] = index
        return index
    }

    func index(of loop: EventLoop) -> Int { indices[ObjectIdentifier(loop)] ?? -1 }

    /// Closes what `owner` (a program that ended) opened on any of the simulation's loops, as
    /// the kernel closes a process's descriptors. On the driving thread.
    func closeSources(openedBy owner: any SimulatedOwner) {
        for (_, loop) in liveLoops { loop.closeSources(openedBy: owner) }
    }

    /// The loops still alive, with their indices (lazily: no array per look).
    private var liveLoops: some Sequence<(Int, EventLoop)> {
        loops.enumerated().lazy.compactMap { index, entry in entry.loop.map { (index, $0) } }
    }

    // MARK: Driving

    /// Runs `body` as the simulation's driver on the calling thread: every loop is bound to it
    /// for the duration. One thread at a time (precondition); nested calls are fine.
    func withDriving<T>(_ body: () throws -> T) rethrows -> T {
        let claimed = claimDriver()
        precondition(claimed, "MainspringTesting: a simulation is driven by one thread at a time; another thread is driving it now")
        defer { releaseDriver() }
        return try body()
    }

    /// Makes the calling thread the driver (one level deeper, if it is already), and every loop
    /// its own; false, and nothing done, when another thread is driving.
    private func claimDriver() -> Bool {
        let me = currentThreadID()
        let (claimed, outermost) = driver.withLock { driver -> (Bool, Bool) in
            guard driver.thread == 0 || driver.thread == me else { return (false, false) }
            driver.thread = me
            driver.depth += 1
            return (true, driver.depth == 1)
        }
        if outermost { for (_, loop) in liveLoops { loop.adoptCallingThreadForSimulation() } }
        return claimed
    }

    /// Ends one level of `claimDriver`: the outermost frees the simulation for any thread.
    private func releaseDriver() {
        driver.withLock { driver in
            driver.depth -= 1
            if driver.depth == 0 { driver.thread = 0 }
        }
    }

    /// The `Simulation` was released: lets go of what only it reads — the programs registered
    /// with it and the record of those spawned (`Simulation.processes`). Kept, they held the
    /// core, and with it every loop, for ever: a spawned program holds its loop
    /// (`SimulatedProcess.loop`), the loop its core, the core the program — a cycle; a registered
    /// body that captures a loop makes another. Nothing is let go while another thread drives
    /// the simulation (through a loop it still holds): that thread may be reading them.
    func simulationReleased() {
        guard claimDriver() else { return }
        defer { releaseDriver() }
        programs = [:]
        processes = []
    }

    func driveUntilIdle() {
        withDriving { _ = runUntilIdle() }
    }

    func adoptCallingThread(for loop: EventLoop) -> Bool {
        let me = currentThreadID()
        let free = driver.withLock { $0.thread == 0 || $0.thread == me }
        guard free else { return false }
        for (_, loop) in liveLoops { loop.adoptCallingThreadForSimulation() }
        return true
    }

    /// Runs every loop's runnable work at the current instant, loop by loop in a seeded order,
    /// until none is left. Returns how many callbacks ran.
    /// With `limit`, stops once modelled CPU has taken the clock past it (what is still
    /// runnable then runs at the next step).
    @discardableResult
    func runUntilIdle(notPast limit: UInt64? = nil) -> Int {
        var ran = 0
        var networkTurn = clock.nanoseconds
        while clock.nanoseconds <= (limit ?? .max) {
            if deliverOverdue(since: &networkTurn) { continue }
            if let (index, loop) = pickRunnable() {
                ran += iterate(index, loop)
            } else if !networkCore.runOneDue() {
                break
            }
        }
        return ran
    }

    /// At one instant the loops run until idle before the network moves (each segment of a
    /// split write reaches its reader on its own). Once modelled CPU has moved the clock since
    /// the network's last turn (`networkTurn`), though, what fell due meanwhile is taken and
    /// delivered before the next iteration, as a kernel would while the loops compute: a loop
    /// that always has work (a fed job) does not hold the network up. Returns whether it did.
    private func deliverOverdue(since networkTurn: inout UInt64) -> Bool {
        guard clock.nanoseconds != networkTurn else { return false }
        networkTurn = clock.nanoseconds
        var moved = false
        while networkCore.runOneDue() { moved = true }
        return moved
    }

    /// One iteration of `loop`, marked as dispatching.
    private func iterate(_ index: Int, _ loop: EventLoop) -> Int {
        dispatching.insert(index)
        defer { dispatching.remove(index) }
        return loop.runSimulatedIteration()
    }

    /// A loop with work at the current instant that is not inside a dispatch pass already
    /// (`allowing` is: it is the one spinning); the seed chooses among several.
    private func pickRunnable(allowing spinning: Int? = nil) -> (Int, EventLoop)? {
        var candidates: [(Int, EventLoop)] = []
        for (index, loop) in liveLoops where (index == spinning || !dispatching.contains(index)) && loop.hasRunnableWork {
            candidates.append((index, loop))
        }
        switch candidates.count {
        case 0: return nil
        case 1: return candidates[0]
        default: return candidates[Int(random.next() % UInt64(candidates.count))]
        }
    }

    /// The earliest deadline armed on any loop that may run (not inside a dispatch pass, or
    /// `allowing`).
    func earliestDeadline(allowing spinning: Int? = nil) -> UInt64? {
        var earliest: UInt64?
        for (index, loop) in liveLoops where index == spinning || !dispatching.contains(index) {
            if let deadline = loop.nextDeadline, deadline < (earliest ?? .max) { earliest = deadline }
        }
        if let network = networkCore.nextEventTime, network < (earliest ?? .max) { earliest = network }
        return earliest
    }

    /// Runs everything due up to `target`, in deadline order, each callback seeing the clock
    /// at its own deadline; then leaves the clock at `target` (or later, if modelled CPU took
    /// it past).
    func advance(to target: UInt64) {
        runUntilIdle(notPast: target)
        while clock.nanoseconds < target, let next = earliestDeadline(), next <= target {
            clock.advance(to: next)
            runUntilIdle(notPast: target)
        }
        clock.advance(to: target)
        runUntilIdle(notPast: target)
    }

    // MARK: LoopSimulating

    func waitForWork(on loop: EventLoop, until deadline: UInt64?) -> Bool {
        let spinning = index(of: loop)
        var networkTurn = clock.nanoseconds
        while true {
            if loop.hasRunnableWork { return true }
            if let deadline, clock.nanoseconds >= deadline { return true }
            if deliverOverdue(since: &networkTurn) { continue }
            if let (index, other) = pickRunnable(allowing: spinning), index != spinning {
                _ = iterate(index, other)
                continue
            }
            if networkCore.runOneDue() { continue }
            guard let next = earliestDeadline(allowing: spinning) else {
                guard let deadline else { return waitForCrossThreadWork() }
                clock.advance(to: deadline)
                return true
            }
            clock.advance(to: deadline.map { min($0, next) } ?? next)
            networkTurn = clock.nanoseconds  // a jump to a deadline is not modelled CPU
        }
    }

    func willDispatch(on loop: EventLoop, kind: String, label: String) {
        guard isTracing else { return }
        trace.append(SimulationTrace.Entry(instant: Duration(nanoseconds: clock.elapsed),
                                           loop: index(of: loop), kind: kind, label: label))
    }

    /// Nothing is runnable and no deadline is armed: before calling it a deadlock, give work
    /// posted from outside the simulation (a task that hopped to another executor and is on its
    /// way back) a moment of real time to arrive. Returns whether some arrived.
    func waitForCrossThreadWork(extra done: () -> Bool = { false }) -> Bool {
        for attempt in 0..<Self.crossThreadGraceSteps {
            if done() || liveLoops.contains(where: { $0.1.hasRunnableWork }) { return true }
            if attempt > 0 { usleep(1_000) }
        }
        return false
    }

    /// 250 steps of 1 ms: the real time a deadlock verdict waits for cross-thread work.
    static let crossThreadGraceSteps = 250

    /// What is still open on each loop, for a deadlock report.
    func openSourcesReport() -> String {
        let parts = liveLoops.compactMap { index, loop -> String? in
            let open = loop.openSourceSummary
            return open.isEmpty ? nil : "loop \(index): \(open.joined(separator: ", "))"
        }
        let all = parts + [networkCore.summary].compactMap { $0 }
        return all.isEmpty ? "no open sources" : all.joined(separator: "; ")
    }
}

#if canImport(Glibc)
import Glibc
#endif
