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
