#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization

/// What a `Subprocess` reaches its child through, as the loop's world made it: a kernel's
/// process (`KernelChild`: its pid, pidfd and group), or a simulation's program
/// (`SimulatedChildHandle`). Every call is made under `ProcessShared`'s lock, so that a signal
/// never reaches a reaped child's number.
protocol ChildProcess: AnyObject, Sendable {
    /// The pidfd the loop watches for the exit; -1: none (polled), or the exit is reported.
    var exitDescriptor: Int32 { get }
    /// Whether the child reports its own exit (a simulation's program), rather than being
    /// watched and reaped (a kernel's process).
    var reportsItsExit: Bool { get }
    /// The exit, if the child ended (reaped now); nil while it runs.
    func reapIfExited() -> Subprocess.ExitStatus?
    /// Gives up the pidfd once the child is reaped, for the caller to close once nothing polls
    /// it any more (-1: none).
    func takeExitDescriptor() -> Int32
    /// Sends `signal` to the child: 0 or the errno.
    func signal(_ signal: Int32) -> Int32
    /// Sends `signal` to the process group the child leads (if it leads one), even once reaped.
    func signalGroup(_ signal: Int32)
    /// Whether the group the child leads still has members.
    var groupExists: Bool { get }
}

/// A kernel's process: signals by pidfd (or pid), reaped with `waitid`.
final class KernelChild: ChildProcess, @unchecked Sendable {
    let pid: Int32
    let group: Int32?
    /// The pidfd (-1: none, polling; or given up once reaped). Under `ProcessShared`'s lock.
    private var descriptor: Int32

    init(pid: Int32, group: Int32?, descriptor: Int32) {
        self.pid = pid
        self.group = group
        self.descriptor = descriptor
    }

    var exitDescriptor: Int32 { descriptor }
    var reportsItsExit: Bool { false }

    func takeExitDescriptor() -> Int32 {
        defer { descriptor = -1 }
        return descriptor
    }

    /// Reaps the child through its pidfd (or by number without one): its status, or nil while
    /// it runs.
    func reapIfExited() -> Subprocess.ExitStatus? {
        var result = descriptor >= 0 ? reapExited(processDescriptor: descriptor) : reapExited(process: pid)
        if case .failed(let code) = result, code == EINVAL, descriptor >= 0 {
            // A kernel with pidfds but without waitid's P_PIDFD (5.3): by number, which is
            // still ours (the child is not reaped).
            result = reapExited(process: pid)
        }
        switch result {
        case .running: return nil
        case .reaped(.exited(let code)): return .exited(code)
        case .reaped(.signaled(let signal)): return .signaled(signal)
        case .failed:
            // ECHILD: reaped by someone else (SIGCHLD ignored, a waitpid(-1)). Any other
            // failure cannot be waited out either: the exit is reported as unknown rather
            // than never.
            return .reapedElsewhere
        }
    }

    func signal(_ signal: Int32) -> Int32 {
        descriptor >= 0 ? sendSignal(signal, toProcessDescriptor: descriptor) : sendSignal(signal, toProcess: pid)
    }

    func signalGroup(_ signal: Int32) {
        if let group { _ = sendSignal(signal, toProcessGroup: group) }
    }

    var groupExists: Bool { group.map(processGroupExists) ?? false }
}

/// A simulation's program (`MainspringTesting`): signals go to it (never to `kill(2)`: its
/// process ID is the simulation's), and it reports its own exit.
final class SimulatedChildHandle: ChildProcess, Sendable {
    let program: any SimulatedChild
    /// Its exit, once reported (by the program, on the loop; read under `ProcessShared`'s lock).
    private let exit = Protected<Subprocess.ExitStatus?>(nil)

    init(_ program: any SimulatedChild) { self.program = program }

    var exitDescriptor: Int32 { -1 }
    var reportsItsExit: Bool { true }
    func takeExitDescriptor() -> Int32 { -1 }
    func reapIfExited() -> Subprocess.ExitStatus? { exit.withLock { $0 } }

    /// The program ended with `status` (the loop reaps it at its next check).
    func exited(_ status: Subprocess.ExitStatus) { exit.withLock { $0 = status } }

    func signal(_ signal: Int32) -> Int32 {
        program.deliver(signal: signal)
        return 0
    }

    /// A program is its own group (it starts no processes of its own): `ProcessShared.kill`
    /// reaches it through `signal`.
    func signalGroup(_ signal: Int32) {}
    var groupExists: Bool { false }
}

/// What every thread may do to a child: signal it, reap it, wait for its exit. One lock guards
/// the child's handle, the status and the waiters, and reaping happens under it: a signal sent
/// under the same lock therefore never reaches a reaped child's number, reused or not.
final class ProcessShared: Sendable {
    let pid: Int32
    /// The child's process group when it leads one.
    let group: Int32?
    /// How the child is reached (read and called under `state`'s lock only).
    private let child: any ChildProcess
    /// Whether the child reports its own exit (see `ChildProcess.reportsItsExit`).
    let reportsItsExit: Bool
    private let state: Protected<State>

    private struct State {
        var status: Subprocess.ExitStatus?
        var waiters: [UnsafeContinuation<Subprocess.ExitStatus, Never>] = []
        var timedOut = false
    }

    /// A reap that found the child gone: its status, the tasks to resume (outside the lock) and
    /// the pidfd to close once nothing polls it any more (-1: none).
    struct Reaped {
        let status: Subprocess.ExitStatus
        let waiters: [UnsafeContinuation<Subprocess.ExitStatus, Never>]
        let descriptor: Int32
    }

    init(pid: Int32, group: Int32?, child: any ChildProcess) {
        self.pid = pid
        self.group = group
        self.child = child
        self.reportsItsExit = child.reportsItsExit
        self.state = Protected(State())
    }

    var status: Subprocess.ExitStatus? { state.withLock { $0.status } }

    /// The pidfd while the child is not reaped (-1 when polling, or when it reports its exit).
    var descriptor: Int32 { state.withLock { _ in child.exitDescriptor } }

    var timedOut: Bool {
        get { state.withLock { $0.timedOut } }
        set { state.withLock { $0.timedOut = newValue } }
    }

    /// Reaps the child if it has exited (without waiting). Returns nil while it runs, and once
    /// it has been reaped already.
    func reapIfExited() -> Reaped? {
        state.withLock { state -> Reaped? in
            guard state.status == nil, let status = child.reapIfExited() else { return nil }
            state.status = status
            let waiters = state.waiters
            state.waiters = []
            return Reaped(status: status, waiters: waiters, descriptor: child.takeExitDescriptor())
        }
    }

    /// Sends `signal` unless the child has been reaped. Returns 0 or the errno.
    @discardableResult
    func signal(_ signal: Int32) -> Int32 {
        state.withLock { state -> Int32 in
            guard state.status == nil else { return ESRCH }
            return child.signal(signal)
        }
    }

    /// Sends `signal` to the group the child leads, if it leads one (even once the child is
    /// reaped), and to the child unless it is reaped.
    func kill(_ signal: Int32) {
        state.withLock { state in
            child.signalGroup(signal)
            if state.status == nil { _ = child.signal(signal) }
        }
    }

    /// Whether the group the child leads still has members.
    var groupExists: Bool { state.withLock { _ in child.groupExists } }

    /// Resumes `continuation` with the status once the child is reaped (at once if it is).
    func awaitExit(_ continuation: UnsafeContinuation<Subprocess.ExitStatus, Never>) {
        let known = state.withLock { state -> Subprocess.ExitStatus? in
            if let status = state.status { return status }
            state.waiters.append(continuation)
            return nil
        }
        if let known { continuation.resume(returning: known) }
    }
}

/// The loop side of a `Subprocess`: the watch on its pidfd (or the polling timer), the exit
/// handlers, the termination and timeout timers. Loop thread only. Registered with the loop,
/// which keeps it (and so the watch) until the child is reaped; when the loop shuts down first,
/// the child goes to the process-wide `OrphanReaper`.
final class ProcessSource: Source {
    let shared: ProcessShared
    private var exitHandlers: [(Subprocess.ExitStatus) -> Void] = []
    private var pollTimer: TimerHandle?
    private var timeoutTimer: TimerHandle?
    private var killTimer: TimerHandle?
    /// When the pending `SIGKILL` is due (monotonic ns), if one is.
    private var killDeadline: UInt64?
    /// How the exit is watched.
    private(set) var watch: Subprocess.ExitWatch = .polling

    /// How often a child is polled without a pidfd.
    static let pollInterval: Duration = .milliseconds(10)

    init(loop: EventLoop, shared: ProcessShared) {
        self.shared = shared
        super.init(loop: loop, priority: .input)
        let descriptor = shared.descriptor
        if shared.reportsItsExit {
            watch = .simulated  // the program reports its exit (`Subprocess.launchSimulated`)
        } else if descriptor >= 0 {
            do {
                try addNativeEvent(fd: descriptor, readiness: .read, persistent: true)
                watch = .processDescriptor
            } catch {
                // The loop refused the pidfd (out of memory): polling still reaps the child.
                startPolling()
            }
        } else {
            startPolling()
        }
    }

    private func startPolling() {
        watch = .polling
        pollTimer = loop.schedule(every: Self.pollInterval) { [weak self] _ in self?.check() }
    }

    /// Stops the child after `timeout` (the configuration's): terminated with `grace`.
    func startTimeout(_ timeout: Duration, grace: Duration) {
        timeoutTimer = loop.schedule(after: timeout) { [weak self] in
            guard let self, self.shared.status == nil else { return }
            self.shared.timedOut = true
            self.terminate(grace: grace)
        }
    }

    override func perform(_ readiness: Readiness) { check() }

    /// Reaps the child if it has exited, and reports the exit.
    func check() {
        guard let reaped = shared.reapIfExited() else { return }
        pollTimer?.cancel()
        pollTimer = nil
        timeoutTimer?.cancel()
        timeoutTimer = nil
        if shared.group == nil {
            killTimer?.cancel()  // a group's members may outlive the child: its kill stays due
            killTimer = nil
        }
        let handlers = exitHandlers
        exitHandlers = []
        close()  // stops polling the pidfd before it is closed
        if reaped.descriptor >= 0 { closeDescriptor(reaped.descriptor) }
        let status = reaped.status
        loop.resumingInput {
            for waiter in reaped.waiters { waiter.resume(returning: status) }
        }
        for handler in handlers { handler(status) }
    }

    func addExitHandler(_ handler: @escaping (Subprocess.ExitStatus) -> Void) {
        if let status = shared.status {
            loop.execute(priority: .input, LoopBound { handler(status) }.run)
        } else if !isClosed {
            exitHandlers.append(handler)
        }
    }

    /// `SIGTERM` now (to the group when there is one), `SIGKILL` after `grace` unless the child
    /// (and for a group, every member) is gone by then.
    func terminate(grace: Duration) {
        let shared = self.shared
        guard shared.status == nil || shared.groupExists else { return }
        shared.kill(SIGTERM)
        let delay = grace.clampedNanoseconds
        if delay == 0 {
            shared.kill(SIGKILL)
            return
        }
        let deadline = loop.monotonicNow() &+ delay
        if let due = killDeadline, due <= deadline { return }  // an earlier kill is due already
        killDeadline = deadline
        killTimer?.cancel()
        killTimer = loop.schedule(atMonotonicNanoseconds: deadline) { [weak self] in
            self?.killDeadline = nil
            if shared.status == nil {
                shared.kill(SIGKILL)
            } else if shared.groupExists {
                shared.kill(SIGKILL)  // the group's members (the child is reaped)
            }
        }
    }

    override func didClose() {
        exitHandlers = []
        // Closed with the child still running: the loop is going away. Its timers go with it;
        // the reaper thread reaps the child when it exits.
        if shared.status == nil && !shared.reportsItsExit { OrphanReaper.shared.adopt(shared) }
    }
}

/// One thread for the whole process that reaps the children whose loop shut down before they
/// exited: it waits on their pidfds (and polls those without one every 10 ms), reaps each as
/// it exits and resumes the tasks awaiting its exit. Started by the first such child; it sleeps
/// in `poll` with nothing to do.
final class OrphanReaper: Sendable {
    static let shared = OrphanReaper()

    private struct State {
        var children: [ProcessShared] = []
        var isRunning = false
    }

    private let state = Protected(State())
    /// Wakes the thread when a child is added.
    private let wakeup: WakeupDescriptor?

    private init() {
        do {
            wakeup = try WakeupDescriptor()
        } catch {
            wakeup = nil  // no eventfd (out of descriptors): the thread polls every 10 ms instead
        }
    }

    /// Reaps `child` once it exits.
    func adopt(_ child: ProcessShared) {
        let start = state.withLock { state -> Bool in
            state.children.append(child)
            defer { state.isRunning = true }
            return !state.isRunning
        }
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "mainspring-reaper"
            thread.start()
        } else {
            wakeup?.signal()
        }
    }

    /// How many children wait to be reaped (tests).
    var waitingCount: Int { state.withLock { $0.children.count } }

    private func run() {
        while true { waitAndReap() }
    }

    /// One round of `run`: waits for a child to exit (or a new child) and reaps what exited.
    /// A function of its own, not inlined, because the optimiser's loop-invariant code motion
    /// took 15–30 minutes over these loops nested in `run`'s endless one (Swift 6.3.1, -O).
    @inline(never)
    private func waitAndReap() {
        let children = state.withLock { $0.children }
        var descriptors: [(fd: Int32, events: Int16)] = []
        if let wakeup { descriptors.append((wakeup.fd, pollReadable)) }
        var polling = wakeup == nil
        for child in children {
            let fd = child.descriptor
            if fd >= 0 { descriptors.append((fd, pollReadable)) } else { polling = true }
        }
        waitForReadiness(descriptors, timeoutMilliseconds: polling ? 10 : -1)
        wakeup?.drain()
        var reapedAny = false
        for child in children {
            guard let reaped = child.reapIfExited() else {
                if child.status != nil { reapedAny = true }  // reaped by its loop after all
                continue
            }
            reapedAny = true
            if reaped.descriptor >= 0 { closeDescriptor(reaped.descriptor) }
            for waiter in reaped.waiters { waiter.resume(returning: reaped.status) }
        }
        if reapedAny {
            state.withLock { state in state.children.removeAll { $0.status != nil } }
        }
    }
}
