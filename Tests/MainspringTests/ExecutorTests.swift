import Foundation
import Synchronization
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

actor PinnedCounter {
    let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private(set) var count = 0
    private(set) var offLoop = 0

    init(loop: EventLoop) { self.loop = loop }

    func increment() {
        if !loop.isCurrent { offLoop += 1 }
        count += 1
    }

    func isOnItsLoop() -> Bool { loop.isCurrent }
}

@Suite("Actors, submit, sleep and yield on loops", .serialized)
struct ExecutorTests {
    @Test("an actor pinned to a background loop runs every call on that loop's thread")
    func actorRunsOnItsLoop() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let counter = PinnedCounter(loop: background.loop)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<4 {
                group.addTask { for _ in 0..<250 { await counter.increment() } }
            }
        }
        #expect(await counter.count == 1_000)
        #expect(await counter.offLoop == 0)
        #expect(await counter.isOnItsLoop())
        // The loop ran the jobs as ordinary callbacks. How many depends on the optimiser: a
        // release build keeps a task on the actor between back-to-back calls to it, so one
        // callback can run many of them.
        let callbacks = try await background.loop.submit { background.loop.metrics.callbacks[.normal] ?? 0 }
        #expect(callbacks >= 1)
    }

    @Test("assumeIsolated works in a plain callback of the actor's loop")
    func assumeIsolatedOnLoop() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let counter = PinnedCounter(loop: background.loop)
        let counted = try await background.loop.submit {
            counter.assumeIsolated { counter in
                counter.increment()
                return counter.count
            }
        }
        #expect(counted == 1)
        #expect(background.loop.isIsolatingCurrentContext() == false)
    }

    @Test("submit returns the result from the loop's thread and rethrows errors")
    func submit() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        #expect(try await loop.submit { loop.isCurrent })
        struct Expected: Error {}
        await #expect(throws: Expected.self) {
            _ = try await loop.submit { () throws -> Int in throw Expected() }
        }
    }

    @Test("sleep(for:) waits at least the duration, on the loop's timer")
    func sleepWaits() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let start = ContinuousClock.now
        try await background.loop.sleep(for: .milliseconds(30))
        let elapsed = ContinuousClock.now - start
        #expect(elapsed >= .milliseconds(30))
        #expect(elapsed < .seconds(5))
        try await background.loop.sleep(for: .milliseconds(-5))  // negative: no wait, no error
    }

    @Test("cancelling a task ends its sleep(for:) at once with CancellationError")
    func sleepCancellation() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        let start = ContinuousClock.now
        let task = Task { try await loop.sleep(for: .seconds(30)) }
        try await Task.sleep(for: .milliseconds(20))
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(ContinuousClock.now - start < .seconds(10))
        // The cancelled timer is gone from the loop.
        let sources = try await loop.submit { loop.sourceCount }
        #expect(sources == 0)
    }

    @Test("yield() on the loop lets input that became ready run before the task continues")
    func yieldLetsInputRun() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        let pipe = TestPipe()
        let log = Locked<[String]>([])
        let watcher = try await loop.submit { () -> UncheckedBox<Watcher> in
            UncheckedBox(try loop.watch(pipe.readEnd, for: .read) { _ in
                var byte: UInt8 = 0
                _ = read(pipe.readEnd, &byte, 1)
                log.withLock { $0.append("input") }
            })
        }
        let worker = YieldingWorker(loop: loop)
        await worker.work(pipe: pipe, log: log)
        #expect(log.value == ["before-yield", "input", "after-yield"])
        try await loop.submit { watcher.value.cancel() }
    }
}

@Suite("Tasks on loops (TaskExecutor)", .serialized)
struct TaskExecutorTests {
    @Test("Task(executorPreference:), group children and withTaskExecutorPreference run on the loop, as counted callbacks")
    func tasksRunOnTheLoop() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        let before = try await loop.submit { loop.metrics.callbacks[.normal] ?? 0 }
        let alwaysOnLoop = await Task(executorPreference: loop) { () -> Bool in
            var all = loop.isCurrent
            for _ in 0..<100 {
                await Task.yield()  // re-enqueued: on the loop again
                all = all && loop.isCurrent
            }
            return all
        }.value
        #expect(alwaysOnLoop)
        let children = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<8 { group.addTask(executorPreference: loop) { loop.isCurrent } }
            return await group.reduce(true) { $0 && $1 }
        }
        #expect(children)
        let scoped = await withTaskExecutorPreference(loop) { () async -> Bool in
            await Task.yield()
            return loop.isCurrent
        }
        #expect(scoped)
        let after = try await loop.submit { loop.metrics.callbacks[.normal] ?? 0 }
        #expect(after - before >= 100, "each slice of a task is one loop callback")
    }

    @Test("a task on a loop calls an actor pinned to it on the same thread, at most two local posts per round trip")
    func sameLoopActor() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        let counter = PinnedCounter(loop: loop)
        let before = try await loop.submit { loop.metrics.totalCallbacks }
        await Task(executorPreference: loop) {
            for _ in 0..<1_000 { await counter.increment() }
        }.value
        let after = try await loop.submit { loop.metrics.totalCallbacks }
        #expect(await counter.count == 1_000)
        #expect(await counter.offLoop == 0)
        // At most one post there and one back per call, both appends on the loop's own thread (no
        // other thread runs any of it: `offLoop` is 0). A debug build makes both hops every time
        // (2,000 callbacks); the optimiser drops the hop back when the task's own code between two
        // calls needs no executor, and the loop then stays on the actor (a few callbacks in all).
        #expect(after - before >= 1 && after - before < 2_100, "\(after - before) callbacks for 1,000 calls")
    }

    @Test("a task whose loop shut down while it waited elsewhere still finishes, off the dead loop")
    func taskOutlivesItsLoop() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let released = DispatchSemaphore(value: 0)
        let suspending = DispatchSemaphore(value: 0)
        let task = Task(executorPreference: loop) { () -> (Bool, Bool) in
            let before = loop.isCurrent
            // Waits on another thread while the group shuts down.
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                // Still in the task's job on the loop: the shutdown below, which the loop can
                // only act on once this job has ended, finds the task suspended.
                suspending.signal()
                DispatchQueue.global().async {
                    released.wait()
                    continuation.resume()
                }
            }
            return (before, loop.isCurrent)
        }
        guard suspending.wait(timeout: .now() + 30) == .success else {
            released.signal()
            Issue.record("the task never started")
            _ = await task.value
            await group.shutdown(gracePeriod: .seconds(5))
            return
        }
        let report = await group.shutdown(gracePeriod: .zero)
        #expect(report.stuckLoops == 0)
        released.signal()
        let (before, after) = await task.value  // resumed for a dead loop: run by the fallback
        #expect(before)
        #expect(!after)
        #expect(loop.metrics.droppedAtShutdown >= 1)
    }

    @Test("a task's job queued on its loop's own thread when the loop shuts down still runs, off the dead loop",
          .timeLimit(.minutes(1)))
    func queuedJobOutlivesItsLoop() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let made = Protected<Task<Bool, Never>?>(nil)
        let started = DispatchSemaphore(value: 0)
        loop.execute {
            // The task's first job is queued here, on the loop's thread (a ready record, not a
            // closure); the loop then shuts down with it still queued.
            let task = Task(executorPreference: loop) { loop.isCurrent }
            made.withLock { $0 = task }
            _ = loop.shutdownNow()
            started.signal()
        }
        started.wait()
        let task = try #require(made.withLock { $0 })
        let ranOnLoop = await task.value  // not lost: run by the fallback
        #expect(!ranOnLoop)
        await group.shutdown(gracePeriod: .zero)
        #expect(loop.metrics.droppedAtShutdown >= 1)
    }

    @Test("a task that never suspends holds input back like a long callback; loop.yield() lets it in")
    func pollIntervalRuleForTasks() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        for yields in [false, true] {
            let pipe = TestPipe()
            let log = Locked<[String]>([])
            let written = Atomic<Bool>(false)
            let watcher = try await loop.submit { () -> UncheckedBox<Watcher> in
                UncheckedBox(try loop.watch(pipe.readEnd, for: .read) { _ in
                    var byte: UInt8 = 0
                    _ = read(pipe.readEnd, &byte, 1)
                    log.withLock { $0.append("input") }
                })
            }
            let writer = startThread {
                while log.value.isEmpty { usleep(100) }  // the task has started
                pipe.write("x")
                written.store(true, ordering: .releasing)
            }
            await Task(executorPreference: loop) {
                log.withLock { $0.append("start") }
                while !written.load(ordering: .acquiring) {
                    if yields { await loop.yield() }
                }
                // Input is ready now; a task that yields lets the loop poll and run it first.
                if yields { await loop.yield() }
                log.withLock { $0.append("end") }
            }.value
            writer.wait()
            try await loop.sleep(for: .milliseconds(20))  // the input of the non-yielding run
            #expect(log.value == (yields ? ["start", "input", "end"] : ["start", "end", "input"]), "yields: \(yields)")
            try await loop.submit { watcher.value.cancel() }
        }
    }
}


/// Runs on its loop, makes input ready while the loop is busy running it, then yields.
actor YieldingWorker {
    let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    init(loop: EventLoop) { self.loop = loop }

    func work(pipe: TestPipe, log: Locked<[String]>) async {
        pipe.write("x")  // the fd is readable now, but the loop has not polled since
        log.withLock { $0.append("before-yield") }
        await loop.yield()
        log.withLock { $0.append("after-yield") }
    }
}

/// Carries a loop-bound value out of a `submit` closure (it is only used on the loop again).
struct UncheckedBox<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}
