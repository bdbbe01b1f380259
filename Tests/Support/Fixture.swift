import CMainspringSystem
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Running the package's executables as subprocesses, for tests of behaviour that needs a
/// process of its own: the process main thread (`EventLoop.main`, `DispatchQueue.main`,
/// `@MainActor`), stdin, exit status, signals.
///
/// ```swift
/// let result = try await runFixture("interleave")
/// #expect(result.status == 0, "\(result.stderr)")
/// #expect(result["dispatch-steps"] == "50")
/// ```
///
/// `runFixture(_:)` starts `mainspring-fixture <scenario>` (Tests/Fixture); `runExecutable` starts
/// any other product of the package by name (an example, say). Executables are found next to
/// the test bundle (the directory of `CommandLine.arguments[0]` under `swift test`, which builds
/// every executable target first), then in `.build/debug/`; `MAINSPRING_BIN_DIR` overrides both.
///
/// The child runs with its own stdin (the given text, or `/dev/null`), no blocked signals and
/// default signal handlers; stdout and stderr are collected in full, and a child still running
/// at the timeout is killed (`SIGKILL`) and reported with `timedOut`. The waiting happens on
/// dedicated threads, not the test's cooperative pool.
package struct FixtureResult: Sendable {
    /// The exit status, or the signal number when `crashedBySignal`.
    package let status: Int32
    /// Whether the child was ended by a signal (a crash, a precondition, the timeout's SIGKILL).
    package let crashedBySignal: Bool
    /// Whether the child was killed because it outlived the timeout.
    package let timedOut: Bool
    package let stdout: String
    package let stderr: String

    /// Stdout, line by line.
    package var lines: [Substring] { stdout.split(separator: "\n") }

    /// The value of the last `key=value` line for `key`, if any.
    package subscript(key: String) -> String? {
        let prefix = key + "="
        return lines.last { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
    }

    /// `self[key]` as an integer, if it parses.
    package func int(_ key: String) -> Int? { self[key].flatMap { Int($0) } }

    /// A one-line summary for failure messages.
    package var summary: String {
        "status \(status)\(crashedBySignal ? " (signal)" : "")\(timedOut ? " (timed out)" : ""); stdout: \(stdout); stderr: \(stderr.prefix(2_000))"
    }
}

package enum FixtureLaunchError: Error, CustomStringConvertible {
    case executableNotFound(String, searched: [String])
    case spawnFailed(String, errno: Int32)

    package var description: String {
        switch self {
        case .executableNotFound(let name, let searched):
            return "cannot find the executable '\(name)' (searched \(searched.joined(separator: ", "))); run `swift build` first"
        case .spawnFailed(let what, let code):
            return "cannot start \(what): \(String(cString: strerror(code)))"
        }
    }
}

/// Runs `mainspring-fixture <scenario> [arguments…]`. See `FixtureResult`.
package func runFixture(_ scenario: String, arguments: [String] = [], stdin: String? = nil,
                environment: [String: String]? = nil, timeout: Duration = .seconds(60)) async throws -> FixtureResult
{
    try await runExecutable("mainspring-fixture", arguments: [scenario] + arguments, stdin: stdin,
                            environment: environment, timeout: timeout)
}

/// Runs the package executable `name` with `arguments`, feeding it `stdin` (or `/dev/null`), and
/// returns its status and output once it exits — or kills it after `timeout`.
package func runExecutable(_ name: String, arguments: [String] = [], stdin: String? = nil,
                   environment: [String: String]? = nil, timeout: Duration = .seconds(60)) async throws -> FixtureResult
{
    try await runExecutable(name, arguments: arguments, stdinBytes: stdin.map { Array($0.utf8) },
                            environment: environment, timeout: timeout)
}

/// `runExecutable(_:arguments:stdin:environment:timeout:)` with stdin given as bytes, for input
/// that is not UTF-8 (`nil`: `/dev/null`).
package func runExecutable(_ name: String, arguments: [String] = [], stdinBytes stdin: [UInt8]?,
                   environment: [String: String]? = nil, timeout: Duration = .seconds(60)) async throws -> FixtureResult
{
    let url = try executableURL(name)
    return try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do {
                continuation.resume(returning: try runBlocking(url, arguments, stdin, environment, timeout))
            } catch {
                continuation.resume(throwing: error)
            }
        }
        thread.start()
    }
}

/// Runs a program from `PATH` (`curl`, `python3`), the way `runExecutable` runs the package's.
package func runProgram(_ name: String, arguments: [String] = [], stdin: String? = nil,
                timeout: Duration = .seconds(60)) async throws -> FixtureResult
{
    let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":").map(String.init)
    guard let path = (["/usr/bin"] + directories).map({ "\($0)/\(name)" }).first(where: { FileManager.default.isExecutableFile(atPath: $0) })
    else { throw FixtureLaunchError.executableNotFound(name, searched: directories) }
    let url = URL(fileURLWithPath: path)
    let input = stdin.map { Array($0.utf8) }
    return try await withCheckedThrowingContinuation { continuation in
        Thread {
            do {
                continuation.resume(returning: try runBlocking(url, arguments, input, nil, timeout))
            } catch {
                continuation.resume(throwing: error)
            }
        }.start()
    }
}

/// Runs the program at `path` to its end on the calling thread (blocking; killed after
/// `timeout`), the way `runProgram` does: posix_spawn, not Foundation's `Process`, whose `run()`
/// on Linux reads past a buffer while it lists `/proc/self/fd` and crashes a test process that
/// has many descriptors open (swift-corelibs-foundation#5472) — one did, mid-suite.
package func runProgramSynchronously(_ path: String, arguments: [String] = [], stdin: String? = nil,
                                     timeout: Duration = .seconds(60)) throws -> FixtureResult
{
    try runBlocking(URL(fileURLWithPath: path), arguments, stdin.map { Array($0.utf8) }, nil, timeout)
}

/// Where the package's executables are.
package func executableURL(_ name: String) throws -> URL {
    var directories: [URL] = []
    if let override = ProcessInfo.processInfo.environment["MAINSPRING_BIN_DIR"] {
        directories.append(URL(fileURLWithPath: override))
    }
    directories.append(URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent())
    // The package root, from this file's path: Tests/Support/Fixture.swift.
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    directories.append(root.appendingPathComponent(".build/debug"))
    for directory in directories {
        let candidate = directory.appendingPathComponent(name)
        if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
    }
    throw FixtureLaunchError.executableNotFound(name, searched: directories.map(\.path))
}

/// A running child process of the package's (see `startExecutable`): its stdout can be read
/// line by line while it runs, it can be signalled, and `waitForExit` collects the rest.
package final class ChildProcess: @unchecked Sendable {
    package let pid: pid_t
    private let stdoutFD: Int32
    private let stdinFD: Int32
    private let stdoutBuffer = Locked([UInt8]())
    private let stderrData = Locked([UInt8]())
    private let stdoutClosed = DispatchSemaphore(value: 0)
    private let lineArrived = DispatchSemaphore(value: 0)
    private let drained = DispatchGroup()
    private let exited = DispatchSemaphore(value: 0)
    private let rawStatus = Locked<Int32?>(nil)
    private var consumed = 0

    fileprivate init(url: URL, arguments: [String], stdin: [UInt8]?, keepStdinOpen: Bool,
                     environment: [String: String]?) throws
    {
        // posix_spawn rather than Foundation.Process: no global SIGCHLD machinery in the test
        // process, and nothing left behind for LeakSanitizer. The child gets only its three
        // standard descriptors: a closefrom(3) action after the dup2s below (see
        // `addCloseFrom`); where that is missing, at least every descriptor open now is marked
        // close-on-exec (one another thread opens in between would still leak).
        markDescriptorsCloseOnExec()
        let output = try makePipe()
        let errors = try makePipe()
        let input = try makePipe()
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if stdin == nil && !keepStdinOpen {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        } else {
            posix_spawn_file_actions_adddup2(&actions, input.read, 0)
        }
        posix_spawn_file_actions_adddup2(&actions, output.write, 1)
        posix_spawn_file_actions_adddup2(&actions, errors.write, 2)
        // After the dup2s (file actions run in order): everything from 3 on is closed in the child,
        // whatever other tests running in parallel opened meanwhile, with or without close-on-exec.
        // A descriptor leaked into a child keeps its file open after the test closed it: a pipe's
        // reader never sees end of file, a test of the descriptor limit frees nothing.
        if let addCloseFrom {
            let rc = addCloseFrom(&actions, 3)
            guard rc == 0 else {
                for fd in [output.read, output.write, errors.read, errors.write, input.read, input.write] { close(fd) }
                throw FixtureLaunchError.spawnFailed("posix_spawn_file_actions_addclosefrom_np", errno: rc)
            }
        }
        // The child starts with no blocked signals and default handlers, whatever the test thread
        // (a Dispatch worker blocks most signals) had.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD, SIGALRM] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv = ([url.path] + arguments).map { strdup($0) } + [nil]
        let variables = ProcessInfo.processInfo.environment.merging(environment ?? [:]) { $1 }
        let envp = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in envp { free(pointer) }
        }
        var pid = pid_t()
        let spawned = posix_spawn(&pid, url.path, &actions, &attributes, argv, envp)
        for fd in [output.write, errors.write, input.read] { close(fd) }
        guard spawned == 0 else {
            for fd in [output.read, errors.read, input.write] { close(fd) }
            throw FixtureLaunchError.spawnFailed(url.path, errno: spawned)
        }
        self.pid = pid
        self.stdoutFD = output.read
        self.stdinFD = input.write

        // Drain both pipes concurrently, so that a chatty child never blocks on a full pipe.
        drained.enter()
        let stdoutBuffer = self.stdoutBuffer, lineArrived = self.lineArrived, stdoutClosed = self.stdoutClosed
        Thread.detachNewThread { [drained] in
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let n = chunk.withUnsafeMutableBytes { read(output.read, $0.baseAddress, $0.count) }
                if n > 0 {
                    stdoutBuffer.withLock { $0 += chunk[0..<n] }
                    lineArrived.signal()
                } else if n == 0 || errno != EINTR {
                    break
                }
            }
            close(output.read)
            stdoutClosed.signal()
            lineArrived.signal()
            drained.leave()
        }
        drained.enter()
        let stderrData = self.stderrData
        Thread.detachNewThread { [drained] in
            // Chunk by chunk, so `stderrSoFar` shows what the child wrote while it runs.
            var chunk = [UInt8](repeating: 0, count: 65_536)
            while true {
                let n = chunk.withUnsafeMutableBytes { read(errors.read, $0.baseAddress, $0.count) }
                if n > 0 {
                    stderrData.withLock { $0 += chunk[0..<n] }
                } else if n == 0 || errno != EINTR {
                    break
                }
            }
            close(errors.read)
            drained.leave()
        }
        // Feed stdin from a thread that ignores SIGPIPE (a child that exits without reading it
        // is fine); keep it open when asked, for `closeStdin()` later.
        if let stdin {
            let inputFD = input.write
            let closeAfter = !keepStdinOpen
            Thread.detachNewThread {
                var pipeSignal = sigset_t()
                sigemptyset(&pipeSignal)
                sigaddset(&pipeSignal, SIGPIPE)
                pthread_sigmask(SIG_BLOCK, &pipeSignal, nil)
                writeFully(inputFD, stdin)
                if closeAfter { close(inputFD) }
            }
        } else if !keepStdinOpen {
            close(input.write)
        }
        let rawStatus = self.rawStatus, exited = self.exited, child = pid
        Thread.detachNewThread {
            var raw: Int32 = 0
            while waitpid(child, &raw, 0) < 0 && errno == EINTR {}
            rawStatus.withLock { $0 = raw }
            exited.signal()
        }
    }

    /// The next complete stdout line, waiting up to `timeout`; nil at end of output or timeout.
    package func readLine(timeout: Duration = .seconds(30)) -> String? {
        let deadline = DispatchTime.now() + .nanoseconds(Int(timeout.components.seconds) * 1_000_000_000
            + Int(timeout.components.attoseconds / 1_000_000_000))
        func takeLine() -> String? {
            stdoutBuffer.withLock { buffer -> String? in
                guard let newline = buffer[consumed...].firstIndex(of: 0x0A) else { return nil }
                defer { consumed = newline + 1 }
                return String(decoding: buffer[consumed..<newline], as: UTF8.self)
            }
        }
        while true {
            if let line = takeLine() { return line }
            if stdoutClosed.wait(timeout: .now()) == .success {
                stdoutClosed.signal()
                // The last output can arrive just before the end, after the look above.
                return takeLine()
            }
            if lineArrived.wait(timeout: deadline) == .timedOut { return takeLine() }
        }
    }

    /// What the child has written to stderr so far (all of it once `waitForExit` returned).
    package var stderrSoFar: String { String(decoding: stderrData.value, as: UTF8.self) }

    /// Waits up to `timeout` for `condition` on the stderr written so far, or for the child's
    /// exit; returns whether the condition holds.
    package func waitForStderr(timeout: Duration = .seconds(30), _ condition: (String) -> Bool) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            if condition(stderrSoFar) { return true }
            if hasExited {
                drained.wait()  // once it has exited, the pipe ends: everything it wrote is in
                return condition(stderrSoFar)
            }
            if ContinuousClock.now > deadline { return false }
            usleep(5_000)
        }
    }

    /// Sends `signal` to the child.
    package func send(_ signal: Int32) { kill(pid, signal) }

    /// Closes the child's stdin (it reads end of file), when it was kept open.
    package func closeStdin() { close(stdinFD) }

    /// Whether the child has exited.
    package var hasExited: Bool { rawStatus.value != nil }

    /// Waits for the child to exit (killing it after `timeout`) and returns the whole result:
    /// all of stdout (including lines already read) and stderr.
    package func waitForExit(timeout: Duration = .seconds(60)) -> FixtureResult {
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        var timedOut = false
        if exited.wait(timeout: .now() + seconds) == .timedOut {
            timedOut = true
            kill(pid, SIGKILL)
            exited.wait()
        }
        exited.signal()
        drained.wait()
        let raw = rawStatus.value ?? 0
        let signal = raw & 0x7f
        return FixtureResult(
            status: signal == 0 ? (raw >> 8) & 0xff : signal,
            crashedBySignal: signal != 0,
            timedOut: timedOut,
            stdout: String(decoding: stdoutBuffer.value, as: UTF8.self),
            stderr: String(decoding: stderrData.value, as: UTF8.self))
    }
}

/// The async forms of `ChildProcess`'s waits: each blocking wait runs on a thread of its own, so
/// an async test that waits for a child (up to a minute) does not hold a thread of the cooperative
/// pool — two on a 2-core machine — that the in-process tests running beside it need.
extension ChildProcess {
    /// `readLine(timeout:)` off the cooperative pool.
    package func readLine(timeout: Duration = .seconds(30)) async -> String? {
        await onPlainThread { self.readLine(timeout: timeout) }
    }

    /// `waitForStderr(timeout:_:)` off the cooperative pool.
    package func waitForStderr(timeout: Duration = .seconds(30), _ condition: @escaping @Sendable (String) -> Bool) async -> Bool {
        await onPlainThread { self.waitForStderr(timeout: timeout, condition) }
    }

    /// `waitForExit(timeout:)` off the cooperative pool.
    package func waitForExit(timeout: Duration = .seconds(60)) async -> FixtureResult {
        await onPlainThread { self.waitForExit(timeout: timeout) }
    }
}

/// Starts the package executable `name` and returns at once (see `ChildProcess`). With
/// `keepStdinOpen`, stdin is a pipe that stays open until `closeStdin()`.
package func startExecutable(_ name: String, arguments: [String] = [], stdin: String? = nil, keepStdinOpen: Bool = false,
                     environment: [String: String]? = nil) throws -> ChildProcess
{
    try ChildProcess(url: try executableURL(name), arguments: arguments, stdin: stdin.map { Array($0.utf8) },
                     keepStdinOpen: keepStdinOpen, environment: environment)
}

/// Starts any program — a system tool (`systemd-socket-activate`), a shell that sets up
/// descriptors and the environment before `exec`ing one of the package's executables — the
/// way `startExecutable` starts the package's own. `path` is absolute.
package func startProgram(_ path: String, arguments: [String] = [], environment: [String: String]? = nil) throws -> ChildProcess {
    try ChildProcess(url: URL(fileURLWithPath: path), arguments: arguments, stdin: nil, keepStdinOpen: false,
                     environment: environment)
}

private func runBlocking(_ url: URL, _ arguments: [String], _ stdin: [UInt8]?, _ environment: [String: String]?,
                         _ timeout: Duration) throws -> FixtureResult
{
    try ChildProcess(url: url, arguments: arguments, stdin: stdin, keepStdinOpen: false, environment: environment)
        .waitForExit(timeout: timeout)
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 on), looked up at run time: Swift's
/// Glibc module does not declare it (glibc does only under `_GNU_SOURCE`). Nil where missing.
private let addCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
    // nil is glibc's RTLD_DEFAULT: the global symbol, from libc.
    guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else { return nil }
    return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
}()

/// Sets close-on-exec on every descriptor of the test process, so a child gets only its three
/// standard ones: descriptors that other tests (running in parallel) opened without the flag
/// would otherwise leak into it — and count against a child's descriptor limit. The fallback
/// where the closefrom spawn action is missing: a descriptor opened by another thread after
/// the scan still leaks (which is why the tests' own helpers open theirs close-on-exec).
private func markDescriptorsCloseOnExec() {
    guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return }
    for name in names {
        guard let fd = Int32(name), fd > 2 else { continue }
        let flags = fcntl(fd, F_GETFD)
        if flags >= 0 && flags & FD_CLOEXEC == 0 { _ = fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }
    }
}

private func makePipe() throws -> (read: Int32, write: Int32) {
    var fds: [Int32] = [0, 0]
    // Close-on-exec from the start, so other children never hold these ends (ours get only
    // their dup2 copies).
    guard ms_pipe2(&fds, O_CLOEXEC) == 0 else { throw FixtureLaunchError.spawnFailed("pipe2", errno: errno) }
    return (fds[0], fds[1])
}

private func writeFully(_ fd: Int32, _ bytes: [UInt8]) {
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
        if n > 0 {
            offset += n
        } else if errno != EINTR {
            return
        }
    }
}
