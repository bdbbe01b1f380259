import Mainspring
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Child processes in both worlds: a real `/bin/sh` script on real loops, its simulated twin —
/// a program registered under `sh` doing what the script does — in the simulation. The parent's
/// side (its `Subprocess`, its pipes, its reads) is the same code in both.
extension ParityScenario {
    static let processes: [ParityScenario] = [filterExitingThree, killedAtItsTimeout, mergedStandardError]

    /// Reads `connection`'s lines to their end into `transcript`, each prefixed with `label`.
    static func readAll(_ connection: Connection?, as label: String, into transcript: Transcript) async {
        guard let connection else {
            transcript.add("\(label): no stream")
            return
        }
        do {
            while let event = try await connection.readLine() { transcript.add("\(label): \(event)") }
        } catch {
            transcript.add("\(label) failed: \(error)")
        }
    }

    /// A filter: the child reads its standard input to its end, answers each line, says how
    /// many on its standard error, and exits 3.
    static let filterExitingThree = ParityScenario("a child reads its input to the end, writes its output and error, exits 3") { world in
        world.registerProgram("sh") { process in
            var count = 0
            while let event = try await process.readLine() {
                guard case .line(let text) = event else { continue }
                process.write(line: "got \(text)")
                count += 1
            }
            process.write(errorLine: "\(count) lines")
            return 3
        }
        var configuration = Subprocess.Configuration(
            executable: "/bin/sh",
            arguments: ["-c", #"n=0; while read l; do echo "got $l"; n=$((n+1)); done; echo "$n lines" >&2; exit 3"#])
        configuration.standardInput = .pipe
        configuration.standardError = .pipe
        let child = try await Subprocess.launch(configuration, on: world.clientLoop)
        let input = try #require(child.standardInput)
        for line in ["one", "two", "three"] { try await input.send(line: line) }
        input.shutdownOutput()
        await readAll(child.standardOutput, as: "stdout", into: world.client)
        await readAll(child.standardError, as: "stderr", into: world.client)
        world.client.add("exit: \(await child.exit)")
    }

    /// A child that ignores `SIGTERM`, killed when its timeout's grace ends: what it wrote
    /// before is read, then the end; it died of `SIGKILL`, after the timeout and its grace.
    static let killedAtItsTimeout = ParityScenario("a child that ignores SIGTERM is killed at its timeout's grace; its output ends there") { world in
        world.registerProgram("sh") { process in
            process.ignoreTerminationSignals()
            process.write(line: "started")
            try await process.sleep(for: .seconds(30))
            return 0
        }
        // `exec`: the sleep is the child itself (no grandchild holding the pipe), and keeps the
        // shell's ignored SIGTERM.
        var configuration = Subprocess.Configuration(executable: "/bin/sh",
                                                     arguments: ["-c", "trap '' TERM; echo started; exec sleep 30"])
        configuration.timeout = .milliseconds(300)
        configuration.timeoutGrace = .milliseconds(200)
        let clock = world.clientLoop.clock
        let started = clock.now
        let child = try await Subprocess.launch(configuration, on: world.clientLoop)
        await readAll(child.standardOutput, as: "stdout", into: world.client)
        let status = await child.exit
        let took = started.duration(to: clock.now)
        world.client.add("exit: \(status), timed out: \(child.didTimeOut)")
        world.client.add("after the timeout and its grace: \(took >= .milliseconds(500)), within 20 s: \(took < .seconds(20))")
    }

    /// Standard error merged into standard output: one stream, in the order written.
    static let mergedStandardError = ParityScenario("a child's standard error merged into its output: one stream, in order") { world in
        world.registerProgram("sh") { process in
            process.write(line: "out 1")
            process.write(errorLine: "err 1")
            process.write(line: "out 2")
            return 0
        }
        var configuration = Subprocess.Configuration(executable: "/bin/sh",
                                                     arguments: ["-c", "echo out 1; echo err 1 >&2; echo out 2"])
        configuration.standardError = .mergedIntoStandardOutput
        let child = try await Subprocess.launch(configuration, on: world.clientLoop)
        await readAll(child.standardOutput, as: "stdout", into: world.client)
        world.client.add("stderr is a stream of its own: \(child.standardError != nil)")
        world.client.add("exit: \(await child.exit)")
    }
}
