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
            let child = try await Subprocess.launch(configuration, on: loop)
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
            let child = try await Subprocess.launch(.init(executable: "/usr/bin/worker", arguments: ["-v", "x"]), on: loop)
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
            let child = try await Subprocess.launch(.init(executable: "stubborn"), on: loop)
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
            let child = try await Subprocess.launch(.init(executable: "sleeper"), on: loop)
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
        let error = try await simulation.run { () async -> SubprocessError? in
            do throws(SubprocessError) {
                _ = try await Subprocess.launch(.init(executable: "nosuchcmd"), on: loop)
                return nil
            } catch {
                return error
            }
        }
        #expect(error == .cannotStart(executable: "nosuchcmd", path: "nosuchcmd", errno: ENOENT))
    }

    @Test func aFileForAStandardStreamIsRefusedOnASimulatedLoop() async throws {
        let simulation = try Simulation()
        simulation.register(program: "echo") { process in
            process.write(line: process.arguments.joined(separator: " "))
            return 0
        }
        let loop = simulation.loop
        let error = try await simulation.run { () async throws -> SubprocessError? in
            var configuration = Subprocess.Configuration(executable: "echo", arguments: ["hello"])
            configuration.standardOutput = .file("/tmp/out")
            do throws(SubprocessError) {
                _ = try await Subprocess.launch(configuration, on: loop)
                return nil
            } catch {
                return error
            }
        }
        guard case .loop(.simulatedLoop(let refused))? = error else {
            Issue.record("expected simulatedLoop, got \(String(describing: error))")
            return
        }
        #expect(refused.contains("/tmp/out for the stdout of 'echo'"))
        #expect(simulation.processes.isEmpty)
    }

    // MARK: What a program opens dies with it

    /// A program that returns without closing what it opened: its listener, the connection it
    /// accepted and the connection its accept handler opened to an upstream all close as a
    /// real process's sockets do — the client and the upstream read the end of the stream one
    /// latency after the exit, the port refuses the next connect, and the parent hears of the
    /// exit at the instant it happened.
    @Test func aProgramThatReturnsLeavesNothingOpen() async throws {
        let simulation = try Simulation(seed: 21)
        simulation.network.latency = .milliseconds(1)
        let loop = simulation.loop
        let upstreamEnded = Box<Duration?>(nil)
        let upstream = try Listener(.tcp(host: "127.0.0.1", port: 6000), on: loop) { connection in
            connection.readLines { event in
                if case .endOfFile = event {
                    upstreamEnded.value = simulation.now
                    connection.close()
                }
            }
        }
        simulation.register(program: "greeter") { process in
            // Neither the listener nor the connections are closed by the program (it keeps
            // their handles: a dropped handle would close its connection).
            let kept = Box<[Connection]>([])
            _ = try Listener(.tcp(host: "127.0.0.1", port: 7100), on: process.loop) { connection in
                connection.writeLine("hello")
                // Opened by the accept handler: the program's too.
                let log = try? Connection.startConnecting(to: "127.0.0.1", port: 6000, on: process.loop)
                log?.writeLine("accepted")
                kept.value += [connection] + (log.map { [$0] } ?? [])
            }
            try await process.sleep(for: .seconds(1))
            return 0
        }
        let (first, end, endedAt, exitedAt, refusal) = try await simulation.run {
            () async throws -> (LineEvent?, LineEvent?, Duration, Duration, Int32?) in
            let child = try await Subprocess.launch(.init(executable: "greeter"), on: loop)
            try await loop.sleep(for: .milliseconds(10))
            let client = try await Connection.connect(to: "127.0.0.1", port: 7100, on: loop)
            let first = try await client.readLine()
            let end = try await client.readLine()
            let endedAt = simulation.now
            _ = await child.exit
            let exitedAt = try #require(simulation.processes.first?.exitedAt)
            var refusal: Int32?
            do throws(EventLoopError) {
                _ = try await Connection.connect(to: "127.0.0.1", port: 7100, on: loop)
            } catch {
                if case .system(_, let code) = error { refusal = code }
            }
            client.close()
            return (first, end, endedAt, exitedAt, refusal)
        }
        #expect(first == .line("hello"))
        #expect(end == .endOfFile)
        #expect(exitedAt == .seconds(1))
        #expect(endedAt == .milliseconds(1_001))  // the FIN travels one latency
        #expect(upstreamEnded.value == .milliseconds(1_001))
        #expect(refusal == ECONNREFUSED)
        upstream.close()
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }

    /// A killed program's callbacks never run again: its repeating timer (opened in its task)
    /// stops at the kill, and the connection that timer wrote to ends for its peer.
    @Test func aKilledProgramsTimersAndConnectionsStopAtTheKill() async throws {
        let simulation = try Simulation(seed: 22)
        simulation.network.latency = .milliseconds(1)
        let loop = simulation.loop
        let ticks = Box(0)
        simulation.register(program: "ticker") { process in
            let connection = try await Connection.connect(to: "127.0.0.1", port: 7200, on: process.loop)
            _ = process.loop.execute(every: .milliseconds(100)) { _ in
                ticks.value += 1
                connection.writeLine("tick")
            }
            process.ignoreTerminationSignals()
            try await process.sleep(for: .seconds(3600))
            return 0
        }
        let received = Box<[LineEvent]>([])
        let listener = try Listener(.tcp(host: "127.0.0.1", port: 7200), on: loop) { connection in
            connection.readLines { event in
                received.value.append(event)
                if case .endOfFile = event { connection.close() }
            }
        }
        let status = try await simulation.run { () async throws -> Subprocess.ExitStatus in
            let child = try await Subprocess.launch(.init(executable: "ticker"), on: loop)
            try await loop.sleep(for: .milliseconds(550))
            child.signal(SIGKILL)
            let status = await child.exit
            try await loop.sleep(for: .seconds(2))
            return status
        }
        listener.close()
        #expect(status == .signaled(SIGKILL))
        // Connected at 2 ms (a round trip); ticks at 102, 202, 302, 402, 502 ms; killed at 550.
        #expect(ticks.value == 5)
        #expect(received.value == Array(repeating: .line("tick"), count: 5) + [.endOfFile])
        simulation.runUntilIdle()
        #expect(simulation.network.openStreamEnds == 0)
    }
}
