import Mainspring
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A simulated program's standard streams are pipes, read and written as a real child's are.
@Suite struct SimulatedProcessStreamTests {
    /// Reads `connection`'s lines until its end: each line, then "end", or how it failed.
    static func lines(of connection: Connection?) async -> [String] {
        guard let connection else { return ["no stream"] }
        var seen: [String] = []
        do {
            while let event = try await connection.readLine() {
                seen.append(event == .endOfFile ? "end" : "\(event)")
            }
        } catch {
            seen.append("failed: \(error)")
        }
        return seen
    }

    /// The issue's own case: a child writes two lines and exits 3; its parent reads both, then
    /// the end of its output, through `child.standardOutput`, as from a real child.
    @Test func theParentReadsAProgramsOutputThroughStandardOutput() async throws {
        let simulation = try Simulation()
        simulation.register(program: "two-lines") { process in
            process.write(line: "a")
            process.write(line: "b")
            return 3
        }
        let loop = simulation.loop
        let (read, status) = try await simulation.run { () async throws -> ([String], Subprocess.ExitStatus) in
            let child = try await Subprocess.launch(Subprocess.Configuration(executable: "two-lines"), on: loop)
            let read = await Self.lines(of: child.standardOutput)
            return (read, await child.exit)
        }
        #expect(read == ["line(\"a\")", "line(\"b\")", "end"])
        #expect(status == .exited(3))
        #expect(simulation.processes.first?.output == ["a", "b"])
    }

    /// A filter: the program reads its standard input to its end and answers each line; its
    /// parent writes, closes the program's input, and reads the answers and the end.
    @Test func aProgramReadsItsStandardInputToItsEnd() async throws {
        let simulation = try Simulation()
        simulation.register(program: "upper") { process in
            var count = 0
            while let event = try await process.readLine() {
                guard case .line(let text) = event else { continue }
                process.write(line: text.uppercased())
                count += 1
            }
            process.write(errorLine: "\(count) lines")
            return 0
        }
        let loop = simulation.loop
        let (read, errors, status) = try await simulation.run { () async throws -> ([String], [String], Subprocess.ExitStatus) in
            var configuration = Subprocess.Configuration(executable: "upper")
            configuration.standardInput = .pipe
            configuration.standardError = .pipe
            let child = try await Subprocess.launch(configuration, on: loop)
            let input = try #require(child.standardInput)
            try await input.send(line: "one")
            try await input.send(line: "two")
            input.shutdownOutput()
            let read = await Self.lines(of: child.standardOutput)
            let errors = await Self.lines(of: child.standardError)
            return (read, errors, await child.exit)
        }
        #expect(read == ["line(\"ONE\")", "line(\"TWO\")", "end"])
        #expect(errors == ["line(\"2 lines\")", "end"])
        #expect(status == .exited(0))
    }

    /// Standard error merged into standard output: one stream, in the order written; a stream
    /// the parent did not pipe is no connection (what the program writes there is only kept).
    @Test func mergedAndUnpipedStreams() async throws {
        let simulation = try Simulation()
        simulation.register(program: "chatty") { process in
            process.write(line: "out 1")
            process.write(errorLine: "err 1")
            process.write(Array("out 2\n".utf8))
            #expect(process.standardInput == nil)
            let nothing = try await process.readLine()
            #expect(nothing == nil)
            return 0
        }
        let loop = simulation.loop
        let (merged, unpiped) = try await simulation.run { () async throws -> ([String], Bool) in
            var configuration = Subprocess.Configuration(executable: "chatty")
            configuration.standardError = .mergedIntoStandardOutput
            let child = try await Subprocess.launch(configuration, on: loop)
            let merged = await Self.lines(of: child.standardOutput)
            _ = await child.exit
            configuration.standardOutput = .null
            configuration.standardError = .inherit
            let quiet = try await Subprocess.launch(configuration, on: loop)
            _ = await quiet.exit
            return (merged, quiet.standardOutput == nil && quiet.standardError == nil)
        }
        #expect(merged == ["line(\"out 1\")", "line(\"err 1\")", "line(\"out 2\")", "end"])
        #expect(unpiped)
        #expect(simulation.processes.map(\.errorOutput) == [["err 1"], ["err 1"]])
    }

    /// Killed at its timeout: what it wrote before is read, then the end; nothing after.
    @Test func aKilledProgramsOutputEndsWhereItDied() async throws {
        let simulation = try Simulation()
        simulation.register(program: "ticker") { process in
            process.ignoreTerminationSignals()
            for tick in 1... {
                process.write(line: "tick \(tick)")
                try await process.sleep(for: .seconds(1))
            }
            return 0
        }
        let loop = simulation.loop
        let (read, status) = try await simulation.run { () async throws -> ([String], Subprocess.ExitStatus) in
            var configuration = Subprocess.Configuration(executable: "ticker")
            configuration.timeout = .milliseconds(2_500)
            configuration.timeoutGrace = .seconds(1)
            let child = try await Subprocess.launch(configuration, on: loop)
            return (await Self.lines(of: child.standardOutput), await child.exit)
        }
        #expect(read == ["line(\"tick 1\")", "line(\"tick 2\")", "line(\"tick 3\")", "line(\"tick 4\")", "end"])
        #expect(status == .signaled(SIGKILL))
        #expect(simulation.now == .milliseconds(3_500))
    }

    /// A program that ends without reading its input: the parent's writes fail with `EPIPE`, as
    /// a write to a pipe nobody reads does.
    @Test func writingToAProgramThatEndedFailsWithEPIPE() async throws {
        let simulation = try Simulation()
        simulation.register(program: "deaf") { process in
            try await process.sleep(for: .seconds(1))
            return 0
        }
        let loop = simulation.loop
        let closed = try await simulation.run { () async throws -> Connection.CloseReason in
            var configuration = Subprocess.Configuration(executable: "deaf")
            configuration.standardInput = .pipe
            let child = try await Subprocess.launch(configuration, on: loop)
            let input = try #require(child.standardInput)
            try await input.send(line: "unread")
            _ = await child.exit
            try? await input.send(line: "after the end")
            return await input.closed
        }
        #expect(closed == .error(EPIPE))
    }
}
