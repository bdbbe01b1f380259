@_spi(Simulation) import MainspringCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A program run by `Subprocess.launch` on a simulated loop: the async closure registered with
/// ``Simulation/register(program:_:)`` under the executable's name, given this handle.
///
/// It runs as a task on the loop it was spawned on, on virtual time. Signals reach it as they
/// would a real process with default dispositions: `SIGTERM` (and `SIGINT`, `SIGHUP`,
/// `SIGQUIT`) makes every ``sleep(for:)`` throw from then on — return an exit code to exit
/// cleanly, or let the error out to die of the signal — unless the program called
/// ``ignoreTerminationSignals()``; `SIGKILL` ends it at once, whatever it does
/// (`.signaled(SIGKILL)`). Other signals are recorded in ``receivedSignals``.
///
/// Its standard streams are what its configuration asked for, as a real child's: where the
/// parent asked for a `.pipe`, the program's end is ``standardInput``, ``standardOutput`` or
/// ``standardError`` (a pipe of the simulation's network: no latency, no faults, its buffer the
/// window), and the parent reads and writes `child.standardOutput` and `child.standardInput`
/// as it would a real child's. ``readLine()``, ``write(line:)``, ``write(_:)`` and
/// ``write(errorLine:)`` are the program's side; the lines it writes are also kept in
/// ``output`` and ``errorOutput`` (so a stream that is `.inherit` or `.null` can still be
/// checked). When the program ends, its output streams close after what it wrote, as a real
/// process's pipe keeps what was written before its exit: the parent reads all of it, then the
/// end of the stream (the exit may be reported first, as it may for a real child).
///
/// What it opens dies with it, as a real process's descriptors do: when it ends — returns,
/// throws, or is killed — every connection, listener, datagram socket and timer it opened is
/// closed before its exit is reported. Its peers read the end of the stream (a reset where it
/// left input unread), its ports are free, and its callbacks never run again. What it had
/// written and its connection had not handed to the network yet is lost, as a process's unsent
/// buffers are (over TLS, what the layer had already encrypted is still sent, as a kernel's
/// buffer is). It opened what its task and the tasks that task starts open, what the callbacks
/// of its own sources open, and what its listeners accept.
/// Loop-thread state: use it from the program's own code, or from the test between steps.
public final class SimulatedProcess: @unchecked Sendable {
    /// The executable's name, as spawned.
    public let executable: String
    /// The arguments, without the program's name.
    public let arguments: [String]
    /// The environment it was given, if the configuration set one.
    public let environment: [String: String]?
    /// Its process ID in the simulation (never a real process's).
    public let processIdentifier: Int32
    /// The loop it runs on.
    public let loop: EventLoop

    /// The lines it wrote with ``write(line:)``, in order.
    public private(set) var output: [String] = []
    /// The lines it wrote with ``write(errorLine:)``, in order.
    public private(set) var errorOutput: [String] = []
    /// Its end of its standard input, when the parent made it a pipe (read-only; nil
    /// otherwise: ``readLine()`` then reads the end at once, as from `/dev/null`).
    public private(set) var standardInput: Connection?
    /// Its end of its standard output, when the parent made it a pipe (write-only).
    public private(set) var standardOutput: Connection?
    /// Its end of its standard error, when the parent made it a pipe (write-only): its
    /// standard output's connection when the parent merged the two.
    public private(set) var standardError: Connection?
    /// Every signal it was sent, in order.
    public private(set) var receivedSignals: [Int32] = []
    /// How it ended; nil while it runs.
    public private(set) var exitStatus: Subprocess.ExitStatus?
    /// The virtual instant it ended at.
    public private(set) var exitedAt: Duration?
    /// Whether it has ended (``exitStatus`` is set).
    public var hasEnded: Bool { exitStatus != nil }

    /// Thrown by ``sleep(for:)`` once the process is being ended.
    public struct Terminated: Error, Sendable, Equatable {
        /// The signal that ends it.
        public let signal: Int32
    }

    private let body: @Sendable (SimulatedProcess) async throws -> Int32
    private let simulation: SimulationCore
    private var ignoresTermination = false
    private var terminating: Int32?
    private var sleeper: (timer: TimerHandle, continuation: UnsafeContinuation<Void, Error>)?
    private var task: Task<Void, Never>?
    private var exited: (@Sendable (Subprocess.ExitStatus) -> Void)?
    /// What the loops record as the owner of what the program opens.
    private let ownership = ProgramOwnership()
    /// The owner of its standard streams: never closed in bulk (see `finish`).
    private let streams = ProgramOwnership()

    init(executable: String, arguments: [String], environment: [String: String]?, processIdentifier: Int32,
         loop: EventLoop, simulation: SimulationCore, body: @escaping @Sendable (SimulatedProcess) async throws -> Int32)
    {
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        self.processIdentifier = processIdentifier
        self.loop = loop
        self.simulation = simulation
        self.body = body
    }

    /// Writes a line to its standard output (and keeps it in ``output``). Never blocks, as a
    /// pipe's buffer would not for a short line; what the parent does not read waits in the
    /// connection's buffer (up to its `outputLimit`).
    public func write(line: String) {
        output.append(line)
        standardOutput?.writeLine(line)
    }

    /// Writes `bytes` to its standard output (not kept in ``output``).
    public func write(_ bytes: [UInt8]) { standardOutput?.write(bytes) }

    /// Writes a line to its standard error (and keeps it in ``errorOutput``).
    public func write(errorLine line: String) {
        errorOutput.append(line)
        standardError?.writeLine(line)
    }

    /// The next line event of its standard input, as `Connection.readLine()` gives it
    /// (`.line`, …, `.endOfFile` once the parent closed it, then nil); nil at once when its
    /// standard input is not a pipe.
    public func readLine() async throws(Connection.CloseReason) -> LineEvent? {
        guard let standardInput else { return nil }
        return try await standardInput.readLine()
    }

    /// Makes the termination signals (`SIGTERM`, `SIGINT`, `SIGHUP`, `SIGQUIT`) do nothing, as
    /// `trap '' TERM` does: only `SIGKILL` ends the program then.
    public func ignoreTerminationSignals() { ignoresTermination = true }

    /// Suspends the program for `duration` of virtual time (negative counts as zero). Throws
    /// ``Terminated`` from a termination signal on (unless ignored), and when `SIGKILL` ends it.
    public func sleep(for duration: Duration) async throws {
        if let signal = terminating { throw Terminated(signal: signal) }
        try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<Void, Error>) in
            let timer = loop.schedule(after: duration) { [self] in
                guard let sleeper else { return }
                self.sleeper = nil
                sleeper.continuation.resume()
            }
            sleeper = (timer, continuation)
        }
    }

    // MARK: The simulation's side

    func start(standardStreams: [Connection?], exited: @escaping @Sendable (Subprocess.ExitStatus) -> Void) {
        self.exited = exited
        standardInput = standardStreams[0]
        standardOutput = standardStreams[1]
        standardError = standardStreams[2]
        // The streams are the program's (not its parent's, which made them), but they are not
        // cut when it ends: `finish` closes them after what was written, as a pipe's buffer.
        for case let stream? in standardStreams { loop.setSimulatedOwner(streams, of: stream) }
        // What the task opens is the program's (see the type's documentation).
        task = SimulatedOwnership.$current.withValue(ownership) { SimulationContext.$loop.withValue(loop) { Task(executorPreference: loop) { [self] in
            let status: Subprocess.ExitStatus
            do {
                status = .exited(try await body(self))
            } catch let error as Terminated {
                status = .signaled(error.signal)
            } catch {
                status = .exited(1)
            }
            finish(status)
        } } }
    }

    /// On the loop: the signal's effect.
    func receive(_ signal: Int32) {
        guard exitStatus == nil else { return }
        receivedSignals.append(signal)
        switch signal {
        case SIGKILL:
            interruptSleep(with: Terminated(signal: SIGKILL))
            finish(.signaled(SIGKILL))
            task?.cancel()
        case SIGTERM, SIGINT, SIGHUP, SIGQUIT:
            guard !ignoresTermination else { break }
            if terminating == nil { terminating = signal }
            interruptSleep(with: Terminated(signal: signal))
        default:
            break
        }
    }

    private func interruptSleep(with error: Terminated) {
        guard let sleeper else { return }
        self.sleeper = nil
        sleeper.timer.cancel()
        sleeper.continuation.resume(throwing: error)
    }

    private func finish(_ status: Subprocess.ExitStatus) {
        guard exitStatus == nil else { return }
        exitStatus = status
        ownership.hasEnded = true
        exitedAt = Duration(nanoseconds: simulation.clock.elapsed)
        // The kernel closes a process's descriptors before its parent hears of the exit; what
        // it wrote to a pipe is in the pipe, and is read before the pipe's end.
        simulation.closeSources(openedBy: ownership)
        for case let stream? in [standardInput, standardOutput, standardError] { stream.close() }
        let exited = self.exited
        self.exited = nil
        exited?(status)
    }
}

/// A program as the owner of what it opens on simulated loops (see `SimulatedOwnership`).
/// Loop-thread state (the thread driving the simulation).
private final class ProgramOwnership: SimulatedOwner, @unchecked Sendable {
    var hasEnded = false
}

/// The `SimulatedChild` the library sees: signals posted to the program's loop.
final class SimulatedChildProcess: SimulatedChild, @unchecked Sendable {
    let process: SimulatedProcess

    init(_ process: SimulatedProcess) { self.process = process }

    var processIdentifier: Int32 { process.processIdentifier }

    func start(standardStreams: [Connection?], exited: @escaping @Sendable (Subprocess.ExitStatus) -> Void) {
        process.start(standardStreams: standardStreams, exited: exited)
    }

    func deliver(signal: Int32) {
        let process = self.process
        process.loop.execute(priority: .input) { process.receive(signal) }
    }
}
