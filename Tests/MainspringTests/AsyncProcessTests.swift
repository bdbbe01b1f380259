import Foundation
import Testing

#if canImport(Glibc)
import Glibc
import MainspringTestSupport
#endif

/// The async API where a process of its own is needed: descriptor counts no parallel test
/// disturbs, signals, stdin, a precondition failure (Tests/Fixture/AsyncScenarios.swift).
@Suite("Async API in a process of its own (subprocess)")
struct AsyncProcessTests {
    @Test("cancelling a task mid-iteration or mid-send closes the connection (.cancelled): sockets back to the baseline, closures released")
    func cancellation() async throws {
        let result = try await runFixture("async-cancel")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["iteration-outcome"] == "threw cancelled", "\(result.summary)")
        #expect(result["iteration-close-reason"] == "cancelled", "\(result.summary)")
        #expect(result["iteration-peer"] == "endOfFile", "the peer sees the connection end: \(result.summary)")
        #expect(result["send-outcome"] == "threw cancelled", "\(result.summary)")
        #expect(result["send-close-reason"] == "cancelled", "\(result.summary)")
        #expect((result.int("sent-before-cancel") ?? 0) > 0, "\(result.summary)")
        #expect(result["closures-released"] == "true", "the tasks' closures were released: \(result.summary)")
        let before = try #require(result.int("sockets-before"), "\(result.summary)")
        #expect(result.int("sockets-after") == before, "every socket it opened is closed: \(result.summary)")
        #expect(result["shutdown"] == "dropped 0 work item(s), closed 0 source(s)", "\(result.summary)")
    }

    @Test("EventLoop.main.signals delivers SIGHUP, then SIGTERM, to the task awaiting them")
    func signals() async throws {
        let child = try startExecutable("mainspring-fixture", arguments: ["async-signals"])
        #expect(await child.readLine() == "ready=true")
        child.send(SIGHUP)
        #expect(await child.readLine() == "signal=\(SIGHUP)")
        child.send(SIGTERM)
        #expect(await child.readLine() == "signal=\(SIGTERM)")
        let result = await child.waitForExit(timeout: .seconds(30))
        #expect(result.status == 0 && !result.crashedBySignal, "SIGTERM was handled, not fatal: \(result.summary)")
        #expect(result["seen"] == "\(SIGHUP),\(SIGTERM)", "\(result.summary)")
    }

    @Test("EventLoop.main.lines(from: stdin): lines, junk and the end of input, in order")
    func stdinLines() async throws {
        let input = Array("one\n".utf8) + Array(String(repeating: "x", count: 39).utf8) + [0x0A, 0xFF, 0x0A]
            + [0x61, 0x00, 0x62, 0x0A] + Array("tail".utf8)
        let result = try await runExecutable("mainspring-fixture", arguments: ["async-stdin"], stdinBytes: input)
        #expect(result.status == 0, "\(result.summary)")
        let events = result.lines.filter { $0.hasPrefix("event=") }.map { $0.dropFirst(6) }
        #expect(events == [#"line("one")"#, "tooLong(39 bytes)", "invalidUTF8(1 bytes)", #"line("a\0b")"#,
                           #"line("tail")"#, "endOfFile"], "\(result.summary)")
        #expect(result["ended"] == "true", "\(result.summary)")
    }

    @Test("two readers of a connection's input at once are a precondition failure that says why")
    func secondConsumer() async throws {
        // No crash reporter: under AddressSanitizer it can hang on to the child's output.
        let result = try await runExecutable("mainspring-fixture", arguments: ["async-second-consumer"],
                                             environment: ["SWIFT_BACKTRACE": "enable=no"])
        #expect(result.crashedBySignal, "\(result.summary)")
        #expect(result["first"] == #"line("hello")"#, "\(result.summary)")
        #expect(result["second-reader"] == "starting", "\(result.summary)")
        #expect(result.stderr.contains("a connection's input has one reader at a time"), "\(result.summary)")
    }
}
