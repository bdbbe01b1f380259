import Foundation
import Synchronization
import Testing
@testable import Mainspring

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

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
func eventually(timeout: Duration = .seconds(20), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))  // a cancelled sleep only polls sooner
    }
    return condition()
}

@Suite("Subprocess: spawn, pipes, exit, signals")
struct SubprocessTests {
    @Test("stdout as lines, then the exit status; argv, environment and working directory as given")
    func outputAndExit() async throws {
        try await withLoop { loop in
            var configuration = shell("echo one; echo \"$1 $FOO\"; pwd", ["two"])
            configuration.environment = ["FOO": "three", "PATH": "/usr/bin:/bin"]
            configuration.workingDirectory = "/tmp"
            let child = try await Subprocess.spawn(configuration, on: loop)
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
            #expect(try await Subprocess.spawn(configuration, on: loop).exit == .exited(3))
            configuration = shell("kill -KILL $$")
            configuration.standardOutput = .null
            #expect(try await Subprocess.spawn(configuration, on: loop).exit == .signaled(SIGKILL))
            let named = try await Subprocess.spawn(.init(executable: "true", standardOutput: .null), on: loop)
            #expect(named.executablePath.hasSuffix("/true"))
            #expect(await named.exit == .exited(0))
            #expect(named.exitWatch == .processDescriptor || named.exitWatch == .polling)
        }
    }

    @Test("stdin is a write-only connection: send, then close (or shutdownOutput) ends the child's input")
    func standardInput() async throws {
        try await withLoop { loop in
            for useShutdown in [false, true] {
                let child = try await Subprocess.spawn(.init(executable: "/bin/cat", standardInput: .pipe), on: loop)
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
                        let child = try Subprocess.spawn(shell("echo a; echo b; exit 7"), on: loop)
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
            #expect(try await Subprocess.spawn(configuration, on: loop).exit == .exited(0))
            configuration.standardOutput = .appendingToFile(output)
            #expect(try await Subprocess.spawn(configuration, on: loop).exit == .exited(0))
            #expect(try String(contentsOfFile: output, encoding: .utf8) == "from a file\nfrom a file\n")

            var both = shell("echo out; echo err >&2; cat")
            both.standardError = .pipe
            let child = try await Subprocess.spawn(both, on: loop)
            async let errors = collectLines(child.standardError)
            let out = try await collectLines(child.standardOutput)
            #expect(out == ["out"], "cat read /dev/null: nothing more")
            #expect(try await errors == ["err"])
            #expect(await child.exit == .exited(0))
        }
    }

    @Test("spawn failures are thrown before spawn returns, naming what failed")
    func spawnFailures() async throws {
        let notExecutable = uniqueTestPath("not-executable.sh")
        try "#!/bin/sh\necho hi\n".write(toFile: notExecutable, atomically: true, encoding: .utf8)
        let missing = uniqueTestPath("missing")
        try await withLoop { loop in
            func failure(_ configuration: Subprocess.Configuration) async -> EventLoopError? {
                do {
                    let child = try await Subprocess.spawn(configuration, on: loop)
                    Issue.record("spawned \(configuration.executable) as pid \(child.processIdentifier)")
                    return nil
                } catch {
                    return error
                }
            }
            #expect(await failure(.init(executable: missing))
                == .spawnFailed(executable: missing, path: missing, errno: ENOENT))
            #expect(await failure(.init(executable: notExecutable))
                == .spawnFailed(executable: notExecutable, path: notExecutable, errno: EACCES))
            #expect(await failure(.init(executable: "/bin/true", workingDirectory: missing))
                == .spawnFailed(executable: "/bin/true", path: missing, errno: ENOENT))
            #expect(await failure(.init(executable: "/bin/true", workingDirectory: notExecutable))
                == .spawnFailed(executable: "/bin/true", path: notExecutable, errno: ENOTDIR))
            #expect(await failure(.init(executable: "/bin/cat", standardInput: .file(missing)))
                == .spawnFailed(executable: "/bin/cat", path: missing, errno: ENOENT))
            let notFound = await failure(.init(executable: "no-such-program-here", environment: ["PATH": "/usr/bin:/bin"]))
            #expect(notFound == .spawnFailed(executable: "no-such-program-here", path: "PATH=/usr/bin:/bin", errno: ENOENT))
            #expect(notFound?.description.contains("no-such-program-here") == true)
            let described = await failure(.init(executable: missing))?.description ?? ""
            #expect(described.contains(missing) && described.contains("No such file"), "\(described)")
        }
    }

    @Test("terminate(grace:): SIGTERM first; a child that ignores it gets SIGKILL after the grace")
    func terminate() async throws {
        try await withLoop { loop in
            let polite = try await Subprocess.spawn(.init(executable: "/bin/sleep", arguments: ["100"]), on: loop)
            #expect(await polite.terminate(grace: .seconds(30)) == .signaled(SIGTERM))

            var stubborn = shell("trap '' TERM; echo ready; while :; do sleep 0.05; done")
            stubborn.newProcessGroup = true
            let child = try await Subprocess.spawn(stubborn, on: loop)
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
            let child = try await Subprocess.spawn(configuration, on: loop)
            #expect(await child.exit == .signaled(SIGTERM))
            #expect(child.didTimeOut)
        }
    }
}
