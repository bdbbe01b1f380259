#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A child process started on a loop: its standard streams as connections, its exit as a value
/// to await or a callback, signals, termination with a grace period, a timeout, a process group.
///
/// ```swift
/// var configuration = Subprocess.Configuration(executable: "ls", arguments: ["-l", "/etc"])
/// configuration.standardOutput = .pipe
/// let child = try await Subprocess.launch(configuration, on: loop)
/// for try await event in child.standardOutput!.lines { … }
/// let status = await child.exit           // .exited(0)
/// ```
///
/// ## Standard streams
/// Each of stdin, stdout and stderr is one of ``Redirection``: a pipe, the parent's own
/// descriptor, `/dev/null`, or a file; stderr may also go wherever stdout goes
/// (``Redirection/mergedIntoStandardOutput``, the shell's `2>&1`). A pipe is a ``Connection``
/// with a child's end: stdout and stderr are **read-only** connections — `lines`, `bytes`,
/// `readLine()`, `read(exactly:)`, `readLines`, `readBytes`, with the same backpressure (a
/// consumer that does not take the output leaves it in the pipe, and the child blocks in
/// `write`: a slow reader slows the child down) — which close by themselves once their end of
/// input has been delivered. stdin is a **write-only** connection: `send`, `write`, `trySend`;
/// `close()` (or `shutdownOutput()`, which is the same on a pipe) ends the child's input once
/// what was written is sent. Writing to a read-only connection or reading a write-only one is a
/// precondition failure. Dropping a pipe's connection (or the `Subprocess` that holds it)
/// closes the pipe: a child that writes to a closed stdout gets `SIGPIPE`.
///
/// The child gets its three standard descriptors and nothing else: every descriptor Mainspring
/// makes is close-on-exec, and the spawn closes every other one from 3 up
/// (`posix_spawn_file_actions_addclosefrom_np`, glibc 2.34 and later; on an older glibc only
/// close-on-exec protects descriptors that other code opened without it). It starts with no
/// signal blocked and every signal at its default disposition, whatever the parent's loop
/// thread had.
///
/// ## Exit
/// The exit is observed through a **pidfd** (`pidfd_open`, Linux 5.3 and later) watched on the
/// loop at `.input` priority, and reaped with `waitid(P_PIDFD, …)` — never by a `SIGCHLD`
/// handler, so other code in the process that starts children its own way (Foundation's
/// `Process`, `posix_spawn` and `waitpid(pid)`) keeps working beside it; code that reaps *any*
/// child (`waitpid(-1)`, `SIGCHLD` set to `SIG_IGN`) takes Mainspring's too, which then reports
/// ``ExitStatus/reapedElsewhere``. Where pidfds are missing (`ENOSYS`: an older kernel, some
/// seccomp policies) the exit is polled instead — `waitpid(pid, WNOHANG)` every 10 ms on a loop
/// timer — and ``exitWatch`` says `.polling`. Signals go through the pidfd too
/// (`pidfd_send_signal`), so they never reach another process that reused the number.
///
/// **No zombie, ever**: a child is reaped whether or not anyone holds its `Subprocess` (the loop
/// keeps the watch until the exit), and a child still running when its loop shuts down is
/// handed to one process-wide reaper thread that reaps it when it exits. The exit may be
/// reported before the output pipes end (a grandchild may hold them open) or after.
///
/// ## Threads and cost
/// The handle is `Sendable`. `launch` (the synchronous form) and ``onExit(_:)`` are loop-thread
/// calls; everything else works from any thread. A spawn costs one `posix_spawn` (glibc's
/// `clone(CLONE_VFORK)`: the calling thread waits until the child has run `exec`, usually well
/// under a millisecond), a pidfd, a pipe and a connection per piped stream, and one loop source.
public final class Subprocess: @unchecked Sendable {
    /// What one of the child's standard streams is connected to.
    public enum Redirection: Sendable, Equatable {
        /// A pipe whose other end is a ``Connection`` of the parent's (``standardInput``,
        /// ``standardOutput``, ``standardError``).
        case pipe
        /// The parent's own descriptor 0, 1 or 2.
        case inherit
        /// `/dev/null`.
        case null
        /// A file: stdin reads it; stdout and stderr create it (mode 0644) or truncate it.
        case file(String)
        /// For stdout and stderr: a file created if missing and appended to (for stdin, read as
        /// with `file`).
        case appendingToFile(String)
        /// For stderr only: wherever stdout goes — its pipe, its file, `/dev/null` or the
        /// parent's descriptor 1 — like the shell's `2>&1`. With stdout a pipe, one reader of
        /// ``Subprocess/standardOutput`` sees both streams in the order the child wrote them
        /// (what the child buffers itself comes when it flushes), and
        /// ``Subprocess/standardError`` is nil. For stdin or stdout, a precondition failure.
        case mergedIntoStandardOutput
    }

    /// How a child ended.
    public enum ExitStatus: Sendable, Equatable, Hashable, CustomStringConvertible {
        /// It exited with this status (0 to 255).
        case exited(Int32)
        /// This signal ended it (`SIGKILL` after a timeout's grace, say).
        case signaled(Int32)
        /// Something else in the process reaped it first (`SIGCHLD` set to `SIG_IGN`, or a
        /// `waitpid(-1)`), so its status is lost.
        case reapedElsewhere

        /// Whether it exited with status 0.
        public var isSuccess: Bool { self == .exited(0) }

        public var description: String {
            switch self {
            case .exited(let code): return "exited with status \(code)"
            case .signaled(let signal): return "killed by signal \(signal) (\(signalName(signal)))"
            case .reapedElsewhere: return "reaped elsewhere in the process (status unknown)"
            }
        }
    }

    /// How a child's exit is observed.
    public enum ExitWatch: Sendable, Equatable {
        /// A pidfd watched on the loop (Linux 5.3 and later).
        case processDescriptor
        /// `waitpid(pid, WNOHANG)` every 10 ms on a loop timer (pidfds are missing).
        case polling
        /// A program simulated on a simulated loop (`MainspringTesting`) reports its own exit.
        case simulated
    }

    /// What to run and how. A value: make one, change what you need, spawn it as often as you
    /// like.
    public struct Configuration: Sendable, Equatable {
        /// The program: a path (with a slash, relative to ``workingDirectory`` when one is set,
        /// as the child sees it), or a name looked for in the `PATH` of ``environment`` (or of
        /// this process).
        public var executable: String
        /// The arguments after the program's name.
        public var arguments: [String]
        /// The child's whole environment; nil: this process's.
        public var environment: [String: String]?
        /// The child's working directory; nil: this process's.
        public var workingDirectory: String?
        /// stdin; `/dev/null` by default.
        public var standardInput: Redirection
        /// stdout; a pipe (``Subprocess/standardOutput``) by default.
        public var standardOutput: Redirection
        /// stderr; the parent's by default. ``Redirection/mergedIntoStandardOutput`` sends it
        /// wherever stdout goes (`2>&1`).
        public var standardError: Redirection
        /// Starts the child as the leader of a new process group, so that
        /// ``Subprocess/startTerminating(grace:)`` and ``Subprocess/signalGroup(_:)`` reach what it
        /// starts in turn (a shell's commands, a server's workers).
        public var newProcessGroup: Bool
        /// A wait: once the child has run this long it is terminated
        /// (as by ``Subprocess/startTerminating(grace:)`` with ``timeoutGrace``) and
        /// ``Subprocess/didTimeOut`` reads true. Nil: no limit.
        public var timeout: Duration?
        /// The grace of a ``timeout`` between `SIGTERM` and `SIGKILL` (a wait).
        public var timeoutGrace: Duration
        /// The options of the pipes' connections (line length, output limit, …).
        public var pipeOptions: Connection.Options

        /// A configuration with the defaults above.
        public init(executable: String, arguments: [String] = [], environment: [String: String]? = nil,
                    workingDirectory: String? = nil, standardInput: Redirection = .null,
                    standardOutput: Redirection = .pipe, standardError: Redirection = .inherit,
                    newProcessGroup: Bool = false, timeout: Duration? = nil, timeoutGrace: Duration = .seconds(5),
                    pipeOptions: Connection.Options = .init())
        {
            self.executable = executable
            self.arguments = arguments
            self.environment = environment
            self.workingDirectory = workingDirectory
            self.standardInput = standardInput
            self.standardOutput = standardOutput
            self.standardError = standardError
            self.newProcessGroup = newProcessGroup
            self.timeout = timeout
            self.timeoutGrace = timeoutGrace
            self.pipeOptions = pipeOptions
        }
    }

    /// The loop that watches the child and serves its pipes.
    public let loop: EventLoop
    /// The child's process ID. Any thread.
    public let processIdentifier: Int32
    /// The child's process group when it leads a new one (``Configuration/newProcessGroup``):
    /// its process ID. Any thread.
    public let processGroup: Int32?
    /// The program that was run: the configuration's `executable`, found in `PATH` when it was
    /// a name.
    public let executablePath: String
    /// The write-only connection to the child's stdin, when it is a pipe.
    public let standardInput: Connection?
    /// The read-only connection from the child's stdout, when it is a pipe.
    public let standardOutput: Connection?
    /// The read-only connection from the child's stderr, when it is a pipe.
    public let standardError: Connection?
    /// How the exit is observed (a pidfd, or polling where pidfds are missing).
    public let exitWatch: ExitWatch

    let shared: ProcessShared
    /// Loop thread only.
    let source: ProcessSource

    init(loop: EventLoop, shared: ProcessShared, source: ProcessSource, executablePath: String, exitWatch: ExitWatch,
         pipes: [Connection?])
    {
        self.loop = loop
        self.shared = shared
        self.source = source
        self.processIdentifier = shared.pid
        self.processGroup = shared.group
        self.executablePath = executablePath
        self.exitWatch = exitWatch
        self.standardInput = pipes[0]
        self.standardOutput = pipes[1]
        self.standardError = pipes[2]
    }

    // MARK: Spawning

    /// Starts `configuration`'s program, its exit watched by `loop`. Returns once the child
    /// runs (its `exec` done); every failure is thrown before that, naming what failed. Loop
    /// thread only (from elsewhere, the `async` form).
    /// - Throws: ``SubprocessError/cannotStart(executable:path:errno:)`` with the path that
    ///   failed — the executable (`ENOENT`: no such file, or not found in `PATH`; `EACCES`: not
    ///   executable; `ENOEXEC`), the working directory (`ENOENT`, `ENOTDIR`, `EACCES`), or a
    ///   redirection's file; `.nulInConfiguration` naming a text of the configuration that holds
    ///   a NUL byte (nothing is started); `.system` when a pipe cannot be made (`EMFILE`);
    ///   `.loop(.wrongThread)` off the loop's thread.
    public static func launch(_ configuration: Configuration, on loop: EventLoop) throws(SubprocessError) -> Subprocess {
        guard loop.claimThread() else { throw .loop(.wrongThread(function: "Subprocess.launch(_:on:)")) }
        return try start(configuration, on: loop)
    }

    /// `launch(_:on:)` from any task: starts the child on `loop`'s thread (no hop from a task
    /// already on it) and returns once the child runs.
    /// - Throws: as `launch(_:on:)`, and `.loop(.loopClosed)` when the loop has shut down.
    public static func launch(_ configuration: Configuration, on loop: EventLoop) async throws(SubprocessError)
        -> Subprocess
    {
        try await loop.onLoop(closed: .loop(.loopClosed)) { () throws(SubprocessError) in
            try start(configuration, on: loop)
        }
    }

    /// Starts `configuration`'s program: `launch(_:on:)`, its failures as `EventLoopError`
    /// (`.spawnFailed`, `.nulInSpawnConfiguration`, `.system`, `.wrongThread`).
    @available(*, deprecated, message: "launch(_:on:) throws SubprocessError, the errors of starting a process")
    public static func spawn(_ configuration: Configuration, on loop: EventLoop) throws(EventLoopError) -> Subprocess {
        guard loop.claimThread() else { throw .wrongThread(function: "Subprocess.spawn(_:on:)") }
        do {
            return try launch(configuration, on: loop)
        } catch {
            throw error.spawnError
        }
    }

    /// `spawn(_:on:)` from any task: `launch(_:on:)`'s `async` form, its failures as
    /// `EventLoopError`.
    @available(*, deprecated, message: "launch(_:on:) throws SubprocessError, the errors of starting a process")
    public static func spawn(_ configuration: Configuration, on loop: EventLoop) async throws(EventLoopError)
        -> Subprocess
    {
        do {
            return try await launch(configuration, on: loop)
        } catch {
            throw error.spawnError
        }
    }

    // MARK: Exit

    /// How the child ended; nil while it runs (or until its exit has been reaped). Any thread.
    public var exitStatus: ExitStatus? { shared.status }

    /// Whether the child still runs (has not been reaped). Any thread.
    public var isRunning: Bool { shared.status == nil }

    /// Whether the configuration's ``Configuration/timeout`` ended the child. Any thread.
    public var didTimeOut: Bool { shared.timedOut }

    /// How the child ended: suspends until it has exited and been reaped. Any number of tasks may
    /// await it, from any thread; cancelling one does not end its wait (as with `Task.value`).
    public var exit: ExitStatus {
        get async {
            let shared = self.shared
            return await withUnsafeContinuation { continuation in shared.awaitExit(continuation) }
        }
    }

    /// Runs `handler` on the loop's thread once the child has exited and been reaped (on the next
    /// turn if it has already). Handlers run in the order they were added; one added after the
    /// loop shut down never runs. Loop thread only.
    @available(*, noasync, message: "loop thread only; in async code await `exit`")
    public func onExit(_ handler: @escaping (ExitStatus) -> Void) {
        loop.preconditionOnLoop("Subprocess.onExit(_:)")
        source.addExitHandler(handler)
    }

    // MARK: Signals

    /// Sends `signal` to the child (through its pidfd: never to another process that reused
    /// its number). Does nothing once it has been reaped. Any thread.
    public func signal(_ signal: Int32) {
        _ = shared.signal(signal)
    }

    /// Sends `signal` to every process of the child's group — the child, and what it started
    /// that did not leave the group — even after the child itself has exited. Requires
    /// ``Configuration/newProcessGroup`` (a precondition). Any thread.
    ///
    /// The group is addressed by its number: once every member has exited, a new process that
    /// reuses the number *and* makes itself a group leader could receive it (Linux does not
    /// reuse a number while a group of that number has members).
    public func signalGroup(_ signal: Int32) {
        guard processGroup != nil else {
            usageFailure("Mainspring: Subprocess.signalGroup(_:) needs a child spawned with newProcessGroup")
        }
        shared.kill(signal)
    }

    /// Starts ending the child and returns at once: `SIGTERM` now — to its whole group when it
    /// leads one — then `SIGKILL` once `grace` has passed if it (or, for a group, any member) is
    /// still there. `grace` is a wait: zero or negative kills at once. A later call with a
    /// shorter grace kills sooner; one with a longer grace changes nothing. Await ``exit`` for
    /// the outcome, or call ``terminate(grace:)->_`` (async), which does this and waits. Any thread
    /// and any task (from elsewhere than the loop, one post); if the loop has shut down, the
    /// grace cannot be timed and `SIGKILL` follows at once.
    public func startTerminating(grace: Duration = .seconds(5)) {
        if loop.isCurrent {
            source.terminate(grace: grace)
            return
        }
        let source = LoopBound(source)
        let shared = self.shared
        loop.execute(priority: .input) {
            source.value.terminate(grace: grace)
        } orElse: {
            shared.kill(SIGTERM)
            shared.kill(SIGKILL)
        }
    }

    /// Ends the child as ``startTerminating(grace:)`` does, then suspends until it has exited;
    /// returns how it ended. Any task.
    public func terminate(grace: Duration = .seconds(5)) async -> ExitStatus {
        startTerminating(grace: grace)
        return await exit
    }

    /// The old name of ``startTerminating(grace:)``. In `async` code the compiler picks the
    /// waiting ``terminate(grace:)`` for this spelling; the new name is the one that returns at
    /// once from a task too.
    @available(*, deprecated, renamed: "startTerminating(grace:)")
    public func terminate(grace: Duration = .seconds(5)) {
        startTerminating(grace: grace)
    }
}
