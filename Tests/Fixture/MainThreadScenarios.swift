import Foundation
import Mainspring
import Synchronization

// MARK: interleave

/// Main-queue blocks and @MainActor steps (two chains of 2 ms steps) interleave with a 5 ms timer
/// and fd input, all on the main thread inside `EventLoop.main.run()`. A step *sleeps* its 2 ms
/// (the loop is just as occupied, and the test suite's other timing tests keep the CPU).
@MainActor
final class InterleaveState {
    static let chainLength = 50
    /// "D" main-queue block, "A" @MainActor step, "T" timer tick, "F" fd event — while chains run.
    var log: [Character] = []
    var dispatchSteps = 0
    var actorSteps = 0
    var offMainThread = 0
    var asyncAfterOnMain: Bool?
    var mainActorRunOnMain: Bool?
    var chainsRunning: Bool { dispatchSteps < Self.chainLength || actorSteps < Self.chainLength }
    var isFinished: Bool { !chainsRunning && asyncAfterOnMain != nil && mainActorRunOnMain != nil }

    func step(_ mark: Character) {
        if !Thread.isMainThread { offMainThread += 1 }
        log.append(mark)
        usleep(2_000)
    }

    func dispatchStep() {
        step("D")
        dispatchSteps += 1
        if dispatchSteps < Self.chainLength {
            DispatchQueue.main.async { self.dispatchStep() }
        }
    }
}

@MainActor
func interleaveScenario() throws {
    let loop = EventLoop.main
    let state = InterleaveState()
    let pipe = Foundation.Pipe()
    let readFD = pipe.fileHandleForReading.fileDescriptor
    let writing = Atomic<Bool>(true)
    let writer = pipe.fileHandleForWriting
    Thread.detachNewThread {
        while writing.load(ordering: .relaxed) {
            writer.write(Data([1]))
            usleep(5_000)
        }
    }
    var buffer = [UInt8](repeating: 0, count: 256)
    let watcher = try loop.watch(readFD, for: .read) { _ in
        _ = read(readFD, &buffer, buffer.count)
        MainActor.assumeIsolated { if state.chainsRunning { state.log.append("F") } }
    }
    let ticker = loop.schedule(every: .milliseconds(5)) { _ in
        MainActor.assumeIsolated {
            if state.chainsRunning { state.log.append("T") }
            if state.isFinished { loop.stop() }
        }
    }

    DispatchQueue.main.async { state.dispatchStep() }
    Task { @MainActor in
        for _ in 0..<InterleaveState.chainLength {
            state.step("A")
            state.actorSteps += 1
            await Task.yield()
        }
    }
    DispatchQueue.main.asyncAfter(deadline: .now() + .milliseconds(30)) {
        state.asyncAfterOnMain = Thread.isMainThread
    }
    Task.detached {
        let onMain = await MainActor.run { Thread.isMainThread }
        await MainActor.run { state.mainActorRunOnMain = onMain }
    }

    try loop.run()
    writing.store(false, ordering: .relaxed)
    ticker.cancel()
    watcher.cancel()

    let log = state.log
    var longestRun = 0
    var run = 0
    for mark in log {
        if mark == "D" || mark == "A" {
            run += 1
            longestRun = max(longestRun, run)
        } else {
            run = 0
        }
    }
    let firstD = log.firstIndex(of: "D") ?? 0, lastD = log.lastIndex(of: "D") ?? 0
    let firstA = log.firstIndex(of: "A") ?? 0, lastA = log.lastIndex(of: "A") ?? 0
    report("dispatch-steps", state.dispatchSteps)
    report("actor-steps", state.actorSteps)
    report("off-main-thread", state.offMainThread)
    report("timer-ticks-during", log.filter { $0 == "T" }.count)
    report("fd-events-during", log.filter { $0 == "F" }.count)
    report("chains-interleaved", firstA < lastD && firstD < lastA)
    report("longest-run-without-input", longestRun)
    report("async-after-on-main", state.asyncAfterOnMain ?? false)
    report("main-actor-run-on-main", state.mainActorRunOnMain ?? false)
}

// MARK: run-off-main

/// `EventLoop.main.run()` from another thread is a clear error.
func runOffMainScenario() throws {
    let done = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
        do {
            try EventLoop.main.run()
            report("error", "none")
        } catch {
            report("error", error)
        }
        done.signal()
    }
    done.wait()
}

// MARK: main-sync

/// `Queue.main.sync` from the main thread (before and while the loop runs), from a worker, and a
/// main → serial queue → main round trip: no deadlock, right threads.
@MainActor
func mainSyncScenario() throws {
    let loop = EventLoop.main
    report("inline-before-run", Queue.main.sync { Thread.isMainThread })
    Thread.detachNewThread {
        report("worker-to-main", Queue.main.sync { Thread.isMainThread })
        DispatchQueue.main.async {
            report("inline-in-main-queue-block", Queue.main.sync { Thread.isMainThread })
            let value = Queue.serial("fixture.main-sync").sync {
                Queue.main.sync { Thread.isMainThread ? 42 : -1 }
            }
            report("main-serial-main", value)
            do {
                try Queue.main.sync { throw FixtureError.expected }
                report("rethrows", false)
            } catch {
                report("rethrows", error is FixtureError)
            }
            loop.stop()
        }
    }
    try loop.run()
}

// MARK: nested-spin

/// A main-queue block that spins the main loop: timers and semaphores work inside, but the main
/// queue is not drained re-entrantly (blocks queued meanwhile run after the spinning one).
@MainActor
final class NestedState {
    var log: [String] = []
}

@MainActor
func nestedSpinScenario() throws {
    let loop = EventLoop.main
    let state = NestedState()
    DispatchQueue.main.async {
        state.log.append("A-start")
        DispatchQueue.main.async { state.log.append("B") }
        Task { @MainActor in state.log.append("task") }
        var fired = false
        loop.schedule(after: .milliseconds(20)) { fired = true }
        state.log.append("timer-in-spin=\(loop.spin(until: { fired }, timeout: .seconds(5)))")
        let queuedRanDuringSpin = loop.spin(until: { state.log.contains("B") || state.log.contains("task") },
                                            timeout: .milliseconds(100))
        state.log.append("queued-ran-during-spin=\(queuedRanDuringSpin)")
        let semaphore = Semaphore()
        loop.schedule(after: .milliseconds(20)) { semaphore.signal() }
        state.log.append("semaphore=\(semaphore.wait(timeout: .seconds(5)))")
        state.log.append("A-end")
    }
    let finisher = loop.schedule(every: .milliseconds(5)) { _ in
        MainActor.assumeIsolated {
            if state.log.contains("B") && state.log.contains("task") { loop.stop() }
        }
    }
    try loop.run()
    finisher.cancel()
    report("order", state.log.joined(separator: ","))
}

// MARK: actors

/// An actor pinned to `EventLoop.main`.
actor MainLoopActor {
    nonisolated var unownedExecutor: UnownedSerialExecutor { EventLoop.main.asUnownedSerialExecutor() }
    var calls = 0

    func where_() -> Bool {
        calls += 1
        return Thread.isMainThread && EventLoop.main.isCurrent
    }
}

/// An actor pinned to a background loop.
actor BackgroundActor {
    let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    init(loop: EventLoop) { self.loop = loop }

    func onItsLoop() -> Bool { loop.isCurrent && !Thread.isMainThread }
}

/// `@MainActor` code calling an actor pinned to `EventLoop.main`: one serial context, so no
/// hop — the loop runs no callback per call. Returns (calls that ran on the main thread, loop
/// callbacks meanwhile).
@MainActor
func colocatedCalls(_ pinned: MainLoopActor, count: Int) async -> (Int, Int) {
    let before = EventLoop.main.metrics.totalCallbacks
    var onMain = 0
    for _ in 0..<count where await pinned.where_() { onMain += 1 }
    return (onMain, EventLoop.main.metrics.totalCallbacks - before)
}

@MainActor
func actorsScenario() throws {
    let loop = EventLoop.main
    let background = try EventLoop()
    Thread.detachNewThread { try? background.run() }
    let pinned = MainLoopActor()
    let worker = BackgroundActor(loop: background)

    // assumeIsolated in loop callbacks on the main thread: MainActor and the pinned actor.
    loop.execute {
        report("main-actor-assume-in-execute", MainActor.assumeIsolated { Thread.isMainThread })
        report("pinned-assume-in-execute", pinned.assumeIsolated { $0.calls >= 0 })
    }
    DispatchQueue.main.async {
        report("pinned-assume-in-main-queue", pinned.assumeIsolated { _ in Thread.isMainThread })
    }
    Task.detached {
        report("pinned-actor-on-main", await pinned.where_())
        report("background-actor-on-its-loop", await worker.onItsLoop())
        var hops = 0
        for _ in 0..<200 {
            let there = await worker.onItsLoop()
            let back = await MainActor.run { Thread.isMainThread }
            if there && back { hops += 1 }
        }
        report("round-trips", hops)
        let (onMain, callbacks) = await colocatedCalls(pinned, count: 10_000)
        report("colocated-calls-on-main", onMain)
        report("colocated-loop-callbacks", callbacks)
        await MainActor.run { loop.stop() }
    }
    try loop.run()
    background.stop()
}

// MARK: wait-for-start

/// `Queue.main.async(waitingForStart:)`: false while the main thread is busy past the timeout,
/// true once it runs the loop, true (the work runs inside the wait) from the main thread itself.
@MainActor
func waitForStartScenario() throws {
    let loop = EventLoop.main
    let busy = DispatchSemaphore(value: 0)  // blocks the main thread (a Semaphore would spin it)
    let ran = Atomic<Int>(0)
    let fromMain = Queue.main.async(waitingForStart: .seconds(5)) { ran.add(1, ordering: .relaxed) }
    report("from-main-thread", fromMain)
    Thread.detachNewThread {
        // The main thread is blocked below (not running the loop): the work cannot start.
        let blocked = Queue.main.async(waitingForStart: .milliseconds(100)) { ran.add(1, ordering: .relaxed) }
        report("while-main-blocked", blocked)
        busy.signal()
        // Now the loop runs: the work starts.
        let running = Queue.main.async(waitingForStart: .seconds(5)) { ran.add(1, ordering: .relaxed) }
        report("while-loop-runs", running)
        Queue.main.async { loop.stop() }
    }
    _ = busy.wait(timeout: .now() + 10)
    try loop.run()
    report("ran", ran.load(ordering: .relaxed))
}

// MARK: echo

/// Echoes stdin lines (`line=…`) until end of input: exercises the fixture helper's stdin.
func echoScenario() throws {
    let loop = EventLoop.main
    let reader = try loop.readLines(from: 0) { event in
        switch event {
        case .line(let text): report("line", text)
        case .endOfFile, .error: loop.stop()
        case .tooLong, .invalidUTF8: report("bad", true)
        }
    }
    try loop.run()
    reader.cancel()
}

/// `group-takeover direct|execute`: makes a 2-loop group and at once calls a loop-only API on
/// its first loop from the main thread — directly (which must trap: the loop is already its
/// thread's when `EventLoopGroup.init` returns) or through `execute` (which must work).
func groupTakeoverScenario() throws {
    let mode = CommandLine.arguments.dropFirst(2).first ?? "direct"
    let group = try EventLoopGroup(loopCount: 2)
    let loop = group.loops[0]
    let fired = Semaphore()
    if mode == "direct" {
        report("calling", "schedule(after:)")
        loop.schedule(after: .milliseconds(1)) { fired.signal() }
        report("accepted", "true")  // not reached when the precondition holds
    } else {
        loop.execute { loop.schedule(after: .milliseconds(1)) { fired.signal() } }
    }
    check(fired.wait(timeout: .seconds(10)), "the timer never fired")
    report("fired", 1)
    group.shutdownBlocking(gracePeriod: .seconds(1))
}

/// `duration-misuse <case>`: a period that is zero or negative, which must stop the program
/// with a message naming the parameter (each case traps before printing `accepted`).
func durationMisuseScenario() throws {
    let which = CommandLine.arguments.dropFirst(2).first ?? ""
    let loop = EventLoop.main
    report("case", which)
    switch which {
    case "every-zero": loop.schedule(every: .zero) { _ in }
    case "every-negative": loop.schedule(every: .milliseconds(-5)) { _ in }
    case "poll-interval-zero": _ = try EventLoop(configuration: .init(pollInterval: .zero))
    case "idle-timeout-negative":
        _ = try Listener(.tcp(), on: loop, options: .init(idleTimeout: .milliseconds(-1))) { _ in }
    case "idle-timeout-zero": _ = try Connection.startConnecting(to: "127.0.0.1", port: 9, on: loop, options: .init(idleTimeout: .zero))
    case "input-pattern-zero": _ = try InputSimulator(loop: loop, pattern: .steady(every: .zero))
    default: fail("unknown case \(which)")
    }
    report("accepted", "true")
}
