import Foundation
import Testing
import MainspringTestSupport

/// `EventLoop.main` on the real process main thread: each test runs a `mainspring-fixture`
/// scenario (Tests/Fixture/MainThreadScenarios.swift) in a subprocess and checks what it printed.
@Suite("The main loop on the process main thread (subprocess)", .serialized)
struct MainThreadTests {
    @Test("main-queue blocks and @MainActor steps interleave with timers and fd input, on the main thread")
    func interleave() async throws {
        let result = try await runFixture("interleave")
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(result["dispatch-steps"] == "50", "\(result.summary)")
        #expect(result["actor-steps"] == "50", "\(result.summary)")
        #expect(result["off-main-thread"] == "0", "\(result.summary)")
        // Two chains of 50 × 2 ms steps take at least 200 ms; a 5 ms timer and a 5 ms fd writer
        // must get in between them (generous bounds: a loaded 2-core machine).
        #expect((result.int("timer-ticks-during") ?? 0) >= 10, "\(result.summary)")
        #expect((result.int("fd-events-during") ?? 0) >= 10, "\(result.summary)")
        #expect(result["chains-interleaved"] == "true", "\(result.summary)")
        #expect((result.int("longest-run-without-input") ?? 99) <= 15, "\(result.summary)")
        #expect(result["async-after-on-main"] == "true", "\(result.summary)")
        #expect(result["main-actor-run-on-main"] == "true", "\(result.summary)")
    }

    @Test("EventLoop.main.run() from another thread throws wrongThread")
    func runOffMain() async throws {
        let result = try await runFixture("run-off-main")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["error"]?.contains("EventLoop.main.run() (main thread only)") == true, "\(result.summary)")
    }

    @Test("Queue.main.sync from the main thread runs inline; main → serial → main does not deadlock")
    func mainSync() async throws {
        let result = try await runFixture("main-sync")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["inline-before-run"] == "true", "\(result.summary)")
        #expect(result["worker-to-main"] == "true", "\(result.summary)")
        #expect(result["inline-in-main-queue-block"] == "true", "\(result.summary)")
        #expect(result["main-serial-main"] == "42", "\(result.summary)")
        #expect(result["rethrows"] == "true", "\(result.summary)")
    }

    @Test("a nested spin in a main-queue block runs timers and semaphores but never re-enters the drain")
    func nestedSpinDoesNotReenterDrain() async throws {
        let result = try await runFixture("nested-spin")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["order"] == "A-start,timer-in-spin=true,queued-ran-during-spin=false,semaphore=true,A-end,B,task",
                "\(result.summary)")
    }

    @Test("actors pinned to EventLoop.main and to a background loop; assumeIsolated in loop callbacks")
    func actors() async throws {
        let result = try await runFixture("actors")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["main-actor-assume-in-execute"] == "true", "\(result.summary)")
        #expect(result["pinned-assume-in-execute"] == "true", "\(result.summary)")
        #expect(result["pinned-assume-in-main-queue"] == "true", "\(result.summary)")
        #expect(result["pinned-actor-on-main"] == "true", "\(result.summary)")
        #expect(result["background-actor-on-its-loop"] == "true", "\(result.summary)")
        #expect(result["round-trips"] == "200", "\(result.summary)")
        // @MainActor code and an actor pinned to EventLoop.main share one executor: no hop.
        #expect(result["colocated-calls-on-main"] == "10000", "\(result.summary)")
        #expect(Int(result["colocated-loop-callbacks"] ?? "") ?? .max < 100, "\(result.summary)")
    }

    @Test("Queue.main.async(waitingForStart:) is false while the main thread is blocked, true once it runs")
    func waitForStartOnMain() async throws {
        let result = try await runFixture("wait-for-start")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["from-main-thread"] == "true", "\(result.summary)")
        #expect(result["while-main-blocked"] == "false", "\(result.summary)")
        #expect(result["while-loop-runs"] == "true", "\(result.summary)")
        #expect(result["ran"] == "3", "every queued work item ran, including the late one: \(result.summary)")
    }

    @Test("the README's daemon: @MainActor code on EventLoop.main, storage actor on its own loop")
    func readmeDaemon() async throws {
        let result = try await runFixture("readme-daemon", stdin: "alpha\nbeta\ngamma\n")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.lines.dropLast().sorted() == ["echo alpha (1 stored)", "echo beta (2 stored)", "echo gamma (3 stored)"],
                "\(result.summary)")
        #expect(result.lines.last == "handled 3 lines", "\(result.summary)")
    }

    #if MAINSPRING_MAIN_EXECUTOR
    @Test("experimental: installAsMainExecutor() posts @MainActor jobs straight to EventLoop.main")
    func customMainExecutor() async throws {
        let result = try await runFixture("main-executor")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["main-executor"]?.contains("MainLoopExecutor") == true, "\(result.summary)")
        #expect(result["main-actor-hops-on-main"] == "100", "\(result.summary)")
        #expect(result["dispatch-main-still-drained"] == "true", "\(result.summary)")
        #expect(result["posted-to-loop"] == "true", "\(result.summary)")
    }
    #endif

    @Test("the fixture helper feeds stdin, collects stdout and reports the exit status")
    func fixtureHelper() async throws {
        let echo = try await runFixture("echo", stdin: "one\ntwo\n")
        #expect(echo.status == 0, "\(echo.summary)")
        #expect(echo.lines == ["line=one", "line=two"], "\(echo.summary)")
        let unknown = try await runFixture("no-such-scenario")
        #expect(unknown.status == 2, "\(unknown.summary)")
        #expect(unknown.stderr.contains("usage"), "\(unknown.summary)")
    }
}
