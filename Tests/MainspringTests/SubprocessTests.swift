import Foundation
import Synchronization
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// Runs `body` with a loop of a one-loop group, shut down afterwards.
func withLoop<T: Sendable>(_ body: (EventLoop) async throws -> T) async throws -> T {
    let group = try EventLoopGroup(loopCount: 1)
    do {
        let result = try await body(group.loops[0])
        await group.shutdown(gracePeriod: .seconds(2))
        return result
    } catch {
        await group.shutdown(gracePeriod: .seconds(2))
        throw error
    }
}

/// The lines of a connection until its end (the `.line` texts; other events as descriptions).
func collectLines(_ connection: Connection?) async throws -> [String] {
    guard let connection else { return [] }
    var lines: [String] = []
    for try await event in connection.lines {
        switch event {
        case .line(let text): lines.append(text)
        case .endOfFile: break
        default: lines.append("\(event)")
        }
    }
    return lines
}

/// `sh -c script` as a configuration.
func shell(_ script: String, _ arguments: [String] = []) -> Subprocess.Configuration {
    Subprocess.Configuration(executable: "/bin/sh", arguments: ["-c", script, "sh"] + arguments)
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet: killed, either way), from `/proc`.
func processIsGoneOrDead(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return true }
    // "pid (comm) S …": the state follows the last ')'.
    guard let close = stat.lastIndex(of: ")") else { return true }
    let state = stat[stat.index(close, offsetBy: 2)]
    return state == "Z" || state == "X"
}

@Suite("Subprocess: spawn, pipes, exit, signals")
struct SubprocessTests {
    @Test("stdout as lines, then the exit status; argv, environment and working directory as given")
    func outputAndExit() async throws {
        try await withLoop { loop in
            var configuration = shell("echo one; echo \"$1 $FOO\"; pwd", ["two"])
            configuration.environment = ["FOO": "three", "PATH": "/usr/bin:/bin"]
            configuration.workingDirectory = "/tmp"
            let child = try await Subprocess.launch(configuration, on: loop)
            #expect(child.standardInput == nil && child.standardError == nil)
            let lines = try await collectLines(child.standardOutput)
            #expect(lines == ["one", "two three", "/tmp"])
            #expect(await child.exit == .exited(0))
            #expect(child.exitStatus == .exited(0) && !child.isRunning && !child.didTimeOut)
        }
    }

    @Test("exit codes and signals as ExitStatus; a name is looked for in PATH")
    func statuses() async throws {
        try await withLoop { loop in
            var configuration = shell("exit 3")
            configuration.standardOutput = .null
            #expect(try await Subprocess.launch(configuration, on: loop).exit == .exited(3))
            configuration = shell("kill -KILL $$")
            configuration.standardOutput = .null
            #expect(try await Subprocess.launch(configuration, on: loop).exit == .signaled(SIGKILL))
            let named = try await Subprocess.launch(.init(executable: "true", standardOutput: .null), on: loop)
            #expect(named.executablePath.hasSuffix("/true"))
            #expect(await named.exit == .exited(0))
            #expect(named.exitWatch == .processDescriptor || named.exitWatch == .polling)
        }
    }

    @Test("stdin is a write-only connection: send, then close (or shutdownOutput) ends the child's input")
    func standardInput() async throws {
        try await withLoop { loop in
            for useShutdown in [false, true] {
                let child = try await Subprocess.launch(.init(executable: "/bin/cat", standardInput: .pipe), on: loop)
                let input = try #require(child.standardInput)
                for index in 0..<100 { try await input.send(line: "line \(index)") }
                if useShutdown {
                    try await loop.submit { input.shutdownOutput() }
                } else {
                    input.close()
                }
                let lines = try await collectLines(child.standardOutput)
                #expect(lines == (0..<100).map { "line \($0)" })
                #expect(await child.exit == .exited(0))
            }
        }
    }

    @Test("callbacks: readLines on stdout and onExit, on the loop's thread")
    func callbacks() async throws {
        try await withLoop { loop in
            let outcome: (lines: [String], status: Subprocess.ExitStatus) = try await withCheckedThrowingContinuation { continuation in
                loop.execute {
                    do {
                        let child = try Subprocess.launch(shell("echo a; echo b; exit 7"), on: loop)
                        var lines: [String] = []
                        var status: Subprocess.ExitStatus?
                        var ended = false
                        func finishIfDone() {
                            if ended, let status { continuation.resume(returning: (lines, status)) }
                        }
                        child.standardOutput?.readLines { event in
                            if case .line(let text) = event { lines.append(text) }
                            if event == .endOfFile {
                                ended = true
                                finishIfDone()
                            }
                        }
                        child.onExit { exit in
                            status = exit
                            finishIfDone()
                        }
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
            }
            #expect(outcome.lines == ["a", "b"])
            #expect(outcome.status == .exited(7))
        }
    }

    @Test("files as stdin and stdout, appending, /dev/null, and stderr as its own pipe")
    func redirections() async throws {
        let input = uniqueTestPath("input.txt")
        let output = uniqueTestPath("output.txt")
        try "from a file\n".write(toFile: input, atomically: true, encoding: .utf8)
        try await withLoop { loop in
            var configuration = Subprocess.Configuration(executable: "/bin/cat", standardInput: .file(input),
                                                         standardOutput: .file(output))
            #expect(try await Subprocess.launch(configuration, on: loop).exit == .exited(0))
            configuration.standardOutput = .appendingToFile(output)
            #expect(try await Subprocess.launch(configuration, on: loop).exit == .exited(0))
            #expect(try String(contentsOfFile: output, encoding: .utf8) == "from a file\nfrom a file\n")

            var both = shell("echo out; echo err >&2; cat")
            both.standardError = .pipe
            let child = try await Subprocess.launch(both, on: loop)
            async let errors = collectLines(child.standardError)
            let out = try await collectLines(child.standardOutput)
            #expect(out == ["out"], "cat read /dev/null: nothing more")
            #expect(try await errors == ["err"])
            #expect(await child.exit == .exited(0))
        }
    }

    /// `.mergedIntoStandardOutput` is the shell's `2>&1`: stderr goes wherever stdout goes, so
    /// one reader sees both streams in the order they were written, and a file gets both.
    @Test("stderr merged into stdout (2>&1): one reader sees both in order; into a file too")
    func mergedStandardError() async throws {
        let output = uniqueTestPath("merged.txt")
        try await withLoop { loop in
            var configuration = shell("echo a; echo b >&2; echo c")
            configuration.standardError = .mergedIntoStandardOutput
            let child = try await Subprocess.launch(configuration, on: loop)
            #expect(child.standardError == nil)
            #expect(try await collectLines(child.standardOutput) == ["a", "b", "c"])
            #expect(await child.exit == .exited(0))

            configuration.standardOutput = .file(output)
            #expect(try await Subprocess.launch(configuration, on: loop).exit == .exited(0))
            #expect(try String(contentsOfFile: output, encoding: .utf8) == "a\nb\nc\n")
        }
    }

    @Test("spawn failures are thrown before spawn returns, naming what failed")
    func spawnFailures() async throws {
        let notExecutable = uniqueTestPath("not-executable.sh")
        try "#!/bin/sh\necho hi\n".write(toFile: notExecutable, atomically: true, encoding: .utf8)
        let missing = uniqueTestPath("missing")
        try await withLoop { loop in
            func failure(_ configuration: Subprocess.Configuration) async -> SubprocessError? {
                do {
                    let child = try await Subprocess.launch(configuration, on: loop)
                    Issue.record("spawned \(configuration.executable) as pid \(child.processIdentifier)")
                    return nil
                } catch {
                    return error
                }
            }
            #expect(await failure(.init(executable: missing))
                == .cannotStart(executable: missing, path: missing, errno: ENOENT))
            #expect(await failure(.init(executable: notExecutable))
                == .cannotStart(executable: notExecutable, path: notExecutable, errno: EACCES))
            #expect(await failure(.init(executable: "/bin/true", workingDirectory: missing))
                == .cannotStart(executable: "/bin/true", path: missing, errno: ENOENT))
            #expect(await failure(.init(executable: "/bin/true", workingDirectory: notExecutable))
                == .cannotStart(executable: "/bin/true", path: notExecutable, errno: ENOTDIR))
            #expect(await failure(.init(executable: "/bin/cat", standardInput: .file(missing)))
                == .cannotStart(executable: "/bin/cat", path: missing, errno: ENOENT))
            let notFound = await failure(.init(executable: "no-such-program-here", environment: ["PATH": "/usr/bin:/bin"]))
            #expect(notFound == .cannotStart(executable: "no-such-program-here", path: "no-such-program-here", errno: ENOENT))
            #expect(notFound?.description.contains("no-such-program-here") == true)
            let described = await failure(.init(executable: missing))?.description ?? ""
            #expect(described.contains(missing) && described.contains("No such file"), "\(described)")
        }
    }

    @Test("what the loop refuses is SubprocessError.loop: off its thread, shut down")
    func loopRefusals() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        #expect(throws: SubprocessError.loop(.wrongThread(function: "Subprocess.launch(_:on:)"))) {
            try { () throws(SubprocessError) in try Subprocess.launch(.init(executable: "/bin/true"), on: loop) }()
        }
        await group.shutdown(gracePeriod: .seconds(2))
        await #expect(throws: SubprocessError.loop(.loopClosed)) {
            try await Subprocess.launch(.init(executable: "/bin/true"), on: loop)
        }
        #expect(SubprocessError.loop(.loopClosed).description == EventLoopError.loopClosed.description)
    }

    @Test("Subprocess.spawn (deprecated) still throws EventLoopError: .spawnFailed, .nulInSpawnConfiguration, .wrongThread")
    func deprecatedSpawnKeepsItsErrors() async throws {
        let missing = uniqueTestPath("missing")
        let old: any SpawningBefore02.Type = Subprocess.self
        try await withLoop { loop in
            let notFound = await #expect(throws: EventLoopError.self) {
                try await old.spawn(.init(executable: missing), on: loop)
            }
            #expect(notFound.map(caseName) == "spawnFailed")
            #expect(notFound?.description
                == SubprocessError.cannotStart(executable: missing, path: missing, errno: ENOENT).description)
            let nul = await #expect(throws: EventLoopError.self) {
                try await old.spawn(.init(executable: "/bin/echo", arguments: ["a\u{0}b"]), on: loop)
            }
            #expect(nul.map(caseName) == "nulInSpawnConfiguration")
            let child = try await old.spawn(.init(executable: "/bin/true"), on: loop)
            #expect(await child.exit == .exited(0))
            #expect(throws: EventLoopError.wrongThread(function: "Subprocess.spawn(_:on:)")) {
                try old.spawnSynchronously(.init(executable: "/bin/true"), on: loop)
            }
        }
    }

    /// A name that is not in `PATH` is reported as that, naming the program; the search path
    /// itself stays out of the message (it was the whole `PATH=…` value, which can be long and
    /// is the environment's business, not the log's).
    @Test("a program not found in PATH is named; the error text does not hold the PATH value")
    func notFoundInPath() async throws {
        let searchPath = "/usr/bin:/bin:/nonexistent/private-tools"
        try await withLoop { loop in
            do {
                let child = try await Subprocess.launch(.init(executable: "no-such-program-here",
                                                             environment: ["PATH": searchPath]), on: loop)
                Issue.record("spawned no-such-program-here as pid \(child.processIdentifier)")
            } catch {
                let text = "\(error)"
                #expect(text.contains("'no-such-program-here' not found in PATH"), "\(text)")
                #expect(!text.contains(searchPath) && !text.contains("private-tools"), "\(text)")
            }
        }
    }

    /// A C string ends at its first NUL, so a NUL inside any text of the configuration cut it
    /// short without a word (`printf '[%s]' 'a<NUL>b'` printed `[a]`; `/bin/sh<NUL>x` ran
    /// `/bin/sh`). Each is refused before anything is started, the error naming the field.
    @Test("a NUL byte in the executable, an argument, an environment name or value, or the working directory is refused, naming the field; nothing runs")
    func nulBytesRefused() async throws {
        let marker = uniqueTestPath("nul-ran")
        let touch = "touch '\(marker)'"
        var inName = shell(touch)
        inName.environment = ["PATH": "/usr/bin:/bin", "A\u{0}B": "1"]
        var inValue = shell(touch)
        inValue.environment = ["PATH": "/usr/bin:/bin", "A": "1\u{0}2"]
        var inDirectory = shell(touch)
        inDirectory.workingDirectory = "/tmp\u{0}/elsewhere"
        let cases: [(configuration: Subprocess.Configuration, field: String)] = [
            (.init(executable: "printf", arguments: ["[%s]", "a\u{0}b"]), "arguments[1]"),
            (.init(executable: "/bin/sh\u{0}x", arguments: ["-c", touch]), "executable"),
            (.init(executable: "sh\u{0}x", arguments: ["-c", touch]), "executable"),
            (shell(touch + " #\u{0}"), "arguments[1]"),
            (inName, "environment"),
            (inValue, "environment[\"A\"]"),
            (inDirectory, "workingDirectory"),
        ]
        try await withLoop { loop in
            for (configuration, field) in cases {
                do {
                    let child = try await Subprocess.launch(configuration, on: loop)
                    let output = try await collectLines(child.standardOutput)
                    _ = await child.exit
                    Issue.record("spawned despite a NUL in \(field); its output: \(output)")
                } catch {
                    let text = "\(error)"
                    #expect(text.contains(field) && text.contains("NUL"), "\(text)")
                }
            }
        }
        #expect(!FileManager.default.fileExists(atPath: marker), "a child ran")
    }

    @Test("terminate(grace:): SIGTERM first; a child that ignores it gets SIGKILL after the grace")
    func terminate() async throws {
        try await withLoop { loop in
            let polite = try await Subprocess.launch(.init(executable: "/bin/sleep", arguments: ["100"]), on: loop)
            #expect(await polite.terminate(grace: .seconds(30)) == .signaled(SIGTERM))

            var stubborn = shell("trap '' TERM; echo ready; while :; do sleep 0.05; done")
            stubborn.newProcessGroup = true
            let child = try await Subprocess.launch(stubborn, on: loop)
            #expect(try await child.standardOutput?.readLine() == .line("ready"), "the trap is set")
            let started = ContinuousClock.now
            let status = await child.terminate(grace: .milliseconds(300))
            let waited = ContinuousClock.now - started
            #expect(status == .signaled(SIGKILL))
            #expect(waited >= .milliseconds(290), "SIGKILL only after the grace: \(waited)")
            #expect(waited < .seconds(20), "\(waited)")
        }
    }

    @Test("a timeout terminates the child; didTimeOut says so")
    func timeout() async throws {
        try await withLoop { loop in
            var configuration = Subprocess.Configuration(executable: "/bin/sleep", arguments: ["100"], standardOutput: .null)
            configuration.timeout = .milliseconds(200)
            configuration.timeoutGrace = .seconds(10)
            let child = try await Subprocess.launch(configuration, on: loop)
            #expect(await child.exit == .signaled(SIGTERM))
            #expect(child.didTimeOut)
        }
    }
}

/// The volume of the `yes` tests: 1 GB optimised, less in debug builds (about 55 MB/s of
/// 100-byte lines through a callback there) and under sanitizers.
let yesVolume: Int = {
    if ProcessInfo.processInfo.environment["MAINSPRING_SANITIZER"] != nil { return 32 << 20 }
    #if DEBUG
    return 64 << 20
    #else
    return 1 << 30
    #endif
}()

/// Bytes a process has written so far (`wchar` of `/proc/<pid>/io`).
func bytesWritten(by pid: Int32) -> Int? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/io", encoding: .utf8) else { return nil }
    for line in text.split(separator: "\n") where line.hasPrefix("wchar:") {
        return Int(line.dropFirst(6).trimmingCharacters(in: .whitespaces))
    }
    return nil
}


@Suite("Subprocess: bad children, backpressure, fairness", .serialized)
struct SubprocessBehaviourTests {
    @Test("a child that closes stdout but keeps running: the output ends, the exit comes later")
    func closesStdoutKeepsRunning() async throws {
        try await withLoop { loop in
            // The child waits for its stdin to end before it exits, so the test decides when
            // (no race with a sleep on a loaded machine).
            var configuration = shell("echo before; exec 1>&-; read x; exit 4")
            configuration.standardInput = .pipe
            let child = try await Subprocess.launch(configuration, on: loop)
            let lines = try await collectLines(child.standardOutput)
            #expect(lines == ["before"])
            #expect(child.isRunning, "the output ended while the child still runs")
            #expect(child.standardOutput?.isOpen == false, "the read end closed itself after its end of input")
            child.standardInput?.close()
            #expect(await child.exit == .exited(4))
        }
    }

    @Test("a child that forks a grandchild and exits: the group kill reaches the grandchild")
    func grandchild() async throws {
        try await withLoop { loop in
            var configuration = shell("sleep 1000 </dev/null >/dev/null 2>&1 & echo $!; exit 0")
            configuration.newProcessGroup = true
            let child = try await Subprocess.launch(configuration, on: loop)
            #expect(child.processGroup == child.processIdentifier)
            guard case .line(let text)? = try await child.standardOutput?.readLine(), let grandchild = Int32(text) else {
                Issue.record("no grandchild pid")
                return
            }
            #expect(await child.exit == .exited(0))
            #expect(!processIsGoneOrDead(grandchild), "the grandchild outlives its parent")
            #expect(await child.terminate(grace: .seconds(10)) == .exited(0), "terminate after the exit reports that exit")
            #expect(await eventually { processIsGoneOrDead(grandchild) }, "SIGTERM to the group ended the grandchild")
        }
    }

    @Test("signalGroup reaches every member; signal after the exit does nothing")
    func signalGroup() async throws {
        try await withLoop { loop in
            var configuration = shell("sleep 1000 & sleep 1000 & echo started; wait")
            configuration.newProcessGroup = true
            let child = try await Subprocess.launch(configuration, on: loop)
            #expect(try await child.standardOutput?.readLine() == .line("started"))
            child.signalGroup(SIGKILL)
            #expect(await child.exit == .signaled(SIGKILL))
            child.signal(SIGKILL)  // reaped: nothing to send to
        }
    }

    @Test("a dropped Subprocess is still reaped: no zombie")
    func droppedHandleIsReaped() async throws {
        try await withLoop { loop in
            var pids: [Int32] = []
            for _ in 0..<20 {
                let child = try await Subprocess.launch(.init(executable: "/bin/true", standardOutput: .null), on: loop)
                pids.append(child.processIdentifier)
            }
            // Dropped while still running, and dropped with an unread stdout pipe.
            for _ in 0..<5 {
                let child = try await Subprocess.launch(.init(executable: "/bin/sleep", arguments: ["0.2"]), on: loop)
                pids.append(child.processIdentifier)
                let talker = try await Subprocess.launch(shell("echo unread"), on: loop)
                pids.append(talker.processIdentifier)
            }
            // No /proc entry left: reaped, not zombies (a zombie keeps its entry).
            #expect(await eventually { pids.allSatisfy { !FileManager.default.fileExists(atPath: "/proc/\($0)") } },
                    "every child reaped (no /proc entry left)")
        }
    }

    @Test("Foundation's Process works beside Subprocess: its statuses are its own, no SIGCHLD handler installed (in a process of its own)")
    func foundationProcessBeside() async throws {
        // Its own process: Foundation's `Process.run()` on Linux can read past a buffer while it
        // lists /proc/self/fd, and crashed this one, with its many descriptors, once.
        let result = try await runFixture("foundation-process-beside", timeout: .seconds(90))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(result["theirs"] == (20..<30).map(String.init).joined(separator: ","),
                "Foundation reaped its own children, with their statuses: \(result.summary)")
        #expect(result["ours"] == (0..<10).map { "\(Subprocess.ExitStatus.exited(Int32($0)))" }.sorted().joined(separator: ","),
                "and Subprocess its own: \(result.summary)")
        #expect(result["sigchld-unchanged"] == "true", "SIGCHLD's disposition is what it was")
    }

    @Test("1,000 short-lived children in parallel: no descriptor leaked, no zombie left (in a process of its own)")
    func thousandChildren() async throws {
        // Its own process: in this one, other suites' children hold pipes of their own, for
        // longer than any wait on a loaded machine.
        let result = try await runFixture("thousand-children", timeout: .seconds(180))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.int("succeeded") == 1_000, "\(result.summary)")
        #expect(result.int("outputs-matched") == 1_000, "\(result.summary)")
        for kind in ["pidfds", "pipes"] {
            #expect(result.int("\(kind)-before") != nil && result.int("\(kind)-after") == result.int("\(kind)-before"),
                    "every \(kind) closed: \(result.summary)")
        }
        #expect(result.int("zombies") == 0, "\(result.summary)")
    }

    @Test("children still running when their loop shuts down are reaped by the reaper thread; exit still resumes")
    func orphanedChildren() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        // A child that outlives any shutdown on a loaded machine (a 0.3 s sleep did not), ended
        // by hand once its loop is gone: the reaper thread sees it go.
        let child = try await Subprocess.launch(.init(executable: "/bin/sleep", arguments: ["60"], standardOutput: .null),
                                               on: group.loops[0])
        await group.shutdown(gracePeriod: .zero)
        #expect(child.isRunning)
        kill(child.processIdentifier, SIGTERM)
        #expect(await child.exit == .signaled(SIGTERM))
        #expect(await eventually { !FileManager.default.fileExists(atPath: "/proc/\(child.processIdentifier)") })
    }

    @Test("without pidfds the exit is polled (waitpid WNOHANG on a timer), with the same results")
    func pollingFallback() async throws {
        try await withLoop { loop in
            let child = try await loop.submit {
                try Subprocess.start(shell("echo polled; exit 9"), on: loop, forcePolling: true)
            }
            #expect(child.exitWatch == .polling)
            #expect(try await collectLines(child.standardOutput) == ["polled"])
            #expect(await child.exit == .exited(9))
            let sleeper = try await loop.submit {
                try Subprocess.start(.init(executable: "/bin/sleep", arguments: ["100"]), on: loop, forcePolling: true)
            }
            #expect(await sleeper.terminate(grace: .seconds(10)) == .signaled(SIGTERM))
        }
    }

    @Test("backpressure: a child's output waits in its pipe until it is read; then all of it arrives")
    func backpressure() async throws {
        try await withLoop { loop in
            let total = 64 << 20
            let child = try await Subprocess.launch(
                .init(executable: "/bin/dd", arguments: ["if=/dev/zero", "bs=65536", "count=\(total / 65_536)", "status=none"]),
                on: loop)
            try await Task.sleep(for: .milliseconds(300))
            let early = bytesWritten(by: child.processIdentifier) ?? 0
            #expect(early <= 1 << 20, "nobody reads: the child is held back by its pipe (wrote \(early) bytes)")
            let output = try #require(child.standardOutput)
            var read = 0
            for _ in 0..<10 {
                read += try await output.read(upTo: 65_536)?.count ?? 0
                try await Task.sleep(for: .milliseconds(20))
            }
            let slow = bytesWritten(by: child.processIdentifier) ?? 0
            #expect(slow <= read + (2 << 20), "a slow reader slows the child: read \(read), written \(slow)")
            while let chunk = try await output.read(upTo: 1 << 20) { read += chunk.count }
            #expect(read == total)
            #expect(await child.exit == .exited(0))
        }
    }

    @Test("fairness: reading a child that writes as fast as it can (yes) holds neither a probe's input nor a timer back beyond the poll-interval rule")
    func yesFairness() async throws {
        let volume = yesVolume
        let line = String(repeating: "y", count: 99)  // 100-byte lines
        try await inSomeAttempt {
            let outcome = try await withLoop { loop in
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<(bytes: Int, lines: Int, p99: Duration, probes: Int, timerP99: Duration, timerRuns: Int, status: Subprocess.ExitStatus), any Error>) in
                    loop.execute {
                        do {
                            let probe = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(5)))
                            let child = try Subprocess.launch(.init(executable: "/usr/bin/yes", arguments: [line]), on: loop)
                            var bytes = 0
                            var lines = 0
                            // A timer due every 10 ms meanwhile: how late each run is.
                            var timerLateness = LatencyHistogram()
                            var timerRunning = true
                            func arm() {
                                let due = ContinuousClock.now + .milliseconds(10)
                                loop.schedule(after: .milliseconds(10)) {
                                    timerLateness.record(max(.zero, ContinuousClock.now - due))
                                    if timerRunning { arm() }
                                }
                            }
                            arm()
                            probe.start()
                            child.standardOutput?.readLines { event in
                                guard case .line(let text) = event else { return }
                                bytes += text.utf8.count + 1
                                lines += 1
                                if bytes >= volume && bytes - text.utf8.count - 1 < volume { child.startTerminating(grace: .seconds(5)) }
                            }
                            child.onExit { status in
                                probe.stop()
                                timerRunning = false
                                continuation.resume(returning: (bytes, lines, probe.latencies.percentile(0.99),
                                                                probe.latencies.count, timerLateness.percentile(0.99),
                                                                timerLateness.count, status))
                            }
                        } catch {
                            continuation.resume(throwing: error)
                        }
                    }
                }
            }
            #expect(outcome.bytes >= volume && outcome.lines >= volume / 100)
            #expect(outcome.status == .signaled(SIGTERM) || outcome.status == .signaled(SIGPIPE))
            // Under a sanitizer (a debug build several times slower) one read of the pipe can
            // fill a whole poll interval, and a timer (`.normal`) then waits behind input: seen
            // under AddressSanitizer (timerRuns 0) and under ThreadSanitizer (p99 lateness 0.1 to
            // 4.7 s in every attempt, 2026-12-02, the code before and after the clock seam
            // alike). The plain and release runs assert it; the sanitizer runs still check the
            // probes and the volume. (An open question for the scheduler: `.normal` work has no
            // guaranteed share under an input flood.)
            let sanitized = ProcessInfo.processInfo.environment["MAINSPRING_SANITIZER"] != nil
            #expect(outcome.probes > 0 && (outcome.timerRuns > 0 || sanitized))
            if sanitized { return nil }
            if outcome.p99 > .milliseconds(20) { return "probe p99 \(outcome.p99) over 20 ms (\(outcome.probes) probes)" }
            if outcome.timerP99 > .milliseconds(20) {
                return "timer lateness p99 \(outcome.timerP99) over 20 ms (\(outcome.timerRuns) runs)"
            }
            return nil
        }
    }
}

/// The deprecated `Subprocess.spawn`, reached through a protocol so that calling the deprecated spelling
/// in a test does not warn.
private protocol SpawningBefore02 {
    static func spawn(_ configuration: Subprocess.Configuration, on loop: EventLoop) async throws(EventLoopError) -> Subprocess
    static func spawn(_ configuration: Subprocess.Configuration, on loop: EventLoop) throws(EventLoopError) -> Subprocess
}

extension SpawningBefore02 {
    /// The synchronous form (an `async` caller would get the `async` one).
    static func spawnSynchronously(_ configuration: Subprocess.Configuration, on loop: EventLoop) throws(EventLoopError)
        -> Subprocess
    {
        try spawn(configuration, on: loop)
    }
}

extension Subprocess: SpawningBefore02 {}
