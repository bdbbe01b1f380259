import Mainspring
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Child processes on a simulated loop: registered programs on virtual time, timeouts and grace
/// periods to the nanosecond.
@Suite struct SimulatedProcessTests {
    /// The test a new user could not write: a child that ignores `SIGTERM` is killed when its
    /// 2 s timeout's grace period ends — exactly then, in no real time.
    @Test func aChildThatIgnoresSIGTERMIsKilledWhenItsGraceEnds() async throws {
        let simulation = try Simulation(seed: 1)
        simulation.register(program: "stubborn") { process in
            process.ignoreTerminationSignals()
            try await process.sleep(for: .seconds(3600))
            return 0
        }
        let loop = simulation.loop
        let (status, timedOut) = try await simulation.run { () async throws -> (Subprocess.ExitStatus, Bool) in
            var configuration = Subprocess.Configuration(executable: "stubborn")
            configuration.timeout = .seconds(2)
            configuration.timeoutGrace = .milliseconds(500)
            let child = try await Subprocess.spawn(configuration, on: loop)
            return (await child.exit, child.didTimeOut)
        }
        #expect(status == .signaled(SIGKILL))
        #expect(timedOut)
        #expect(simulation.now == .milliseconds(2_500))
        #expect(simulation.processes.first?.receivedSignals == [SIGTERM, SIGKILL])
        #expect(simulation.processes.first?.exitedAt == .milliseconds(2_500))
    }

    @Test func aChildThatHandlesSIGTERMExitsCleanlyWithinItsGrace() async throws {
        let simulation = try Simulation()
        simulation.register(program: "worker") { process in
            process.write(line: "started \(process.arguments.joined(separator: " "))")
            do {
                try await process.sleep(for: .seconds(60))
            } catch is SimulatedProcess.Terminated {
                await Task.yield()
                process.write(line: "bye")
                return 0
            }
            return 1
        }
        let loop = simulation.loop
        let status = try await simulation.run { () async throws -> Subprocess.ExitStatus in
            let child = try await Subprocess.spawn(.init(executable: "/usr/bin/worker", arguments: ["-v", "x"]), on: loop)
            try await loop.sleep(for: .seconds(1))
            return await child.terminate(grace: .seconds(5))
        }
        #expect(status == .exited(0))
        #expect(simulation.now == .seconds(1))
        #expect(simulation.processes.map(\.output) == [["started -v x", "bye"]])
    }

    /// One name, one meaning: a task can end a child without waiting for it
    /// (`startTerminating`), and wait for it later, while the waiting `terminate` keeps its name.
    @Test func aTaskStartsTerminatingAChildWithoutWaitingForItsExit() async throws {
        let simulation = try Simulation(seed: 3)
        simulation.register(program: "stubborn") { process in
            process.ignoreTerminationSignals()
            try await process.sleep(for: .seconds(3600))
            return 0
        }
        let loop = simulation.loop
        let (runningAfterCall, calledAt, status) = try await simulation.run {
            () async throws -> (Bool, Duration, Subprocess.ExitStatus) in
            let child = try await Subprocess.spawn(.init(executable: "stubborn"), on: loop)
            try await loop.sleep(for: .seconds(1))
            child.startTerminating(grace: .seconds(2))  // returns at once, from a task
            let running = child.isRunning
            let now = simulation.now
            return (running, now, await child.exit)
        }
        #expect(runningAfterCall)
        #expect(calledAt == .seconds(1))
        #expect(status == .signaled(SIGKILL))
        #expect(simulation.now == .seconds(3))
        #expect(simulation.processes.first?.receivedSignals == [SIGTERM, SIGKILL])
    }

    @Test func aProgramThatDiesOfSIGTERMReportsTheSignal() async throws {
        let simulation = try Simulation()
        simulation.register(program: "sleeper") { process in
            try await process.sleep(for: .seconds(60))
            return 0
        }
        let loop = simulation.loop
        let status = try await simulation.run { () async throws -> Subprocess.ExitStatus in
            let child = try await Subprocess.spawn(.init(executable: "sleeper"), on: loop)
            try await loop.sleep(for: .milliseconds(10))
            child.signal(SIGUSR1)
            return await child.terminate(grace: .seconds(5))
        }
        #expect(status == .signaled(SIGTERM))
        #expect(simulation.processes.first?.receivedSignals == [SIGUSR1, SIGTERM])
        #expect(simulation.now == .milliseconds(10))
    }

    @Test func anUnregisteredProgramFailsAsAMissingOneDoes() async throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        let error = try await simulation.run { () async -> EventLoopError? in
            do throws(EventLoopError) {
                _ = try await Subprocess.spawn(.init(executable: "nosuchcmd"), on: loop)
                return nil
            } catch {
                return error
            }
        }
        #expect(error == .spawnFailed(executable: "nosuchcmd", path: "nosuchcmd", errno: ENOENT))
    }

    @Test func filesAreRefusedAndPipesAreNotConnectionsOnASimulatedLoop() async throws {
        let simulation = try Simulation()
        simulation.register(program: "echo") { process in
            process.write(line: process.arguments.joined(separator: " "))
            return 0
        }
        let loop = simulation.loop
        let (error, output) = try await simulation.run { () async throws -> (EventLoopError?, Bool) in
            var configuration = Subprocess.Configuration(executable: "echo", arguments: ["hello"])
            configuration.standardOutput = .pipe
            let piped = try await Subprocess.spawn(configuration, on: loop)
            _ = await piped.exit
            configuration.standardOutput = .file("/tmp/out")
            do throws(EventLoopError) {
                _ = try await Subprocess.spawn(configuration, on: loop)
                return (nil, piped.standardOutput == nil)
            } catch {
                return (error, piped.standardOutput == nil)
            }
        }
        guard case .simulatedLoop(let refused)? = error else {
            Issue.record("expected simulatedLoop, got \(String(describing: error))")
            return
        }
        #expect(refused.contains("/tmp/out for the stdout of 'echo'"))
        #expect(output)
        #expect(simulation.processes.map(\.output) == [["hello"]])
    }
}
