import Foundation
import Synchronization
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore

/// Runs `body` on a new thread and waits up to `timeout` for it; `nil` if it did not finish (a
/// deadlock: the thread is left behind).
func finishes<T: Sendable>(within timeout: Duration = .seconds(10), _ body: @escaping @Sendable () -> T) -> T? {
    let result = Locked<T?>(nil)
    let done = startThread { result.withLock { $0 = body() } }
    let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
    guard done.wait(timeout: .now() + seconds) == .success else { return nil }
    return result.value
}

@Suite("Queue: the GCD facade", .serialized)
struct QueueTests {
    @Test("named serial queues are the same queue each time: work sent through fresh values runs in order")
    func namedQueuesAreReused() async throws {
        let label = "test.queue.ordering"
        let order = Locked<[Int]>([])
        for i in 0..<2_000 {
            Queue.serial(label).async { order.withLock { $0.append(i) } }
        }
        // A sync on the same label runs after everything queued before it.
        let seen = Queue.serial(label).sync { order.value.count }
        #expect(seen == 2_000)
        #expect(order.value == Array(0..<2_000))
    }

    @Test("sync runs inline when already on the queue: no deadlock on a serial queue or a loop")
    func syncInline() async throws {
        let nested = finishes {
            Queue.serial("test.queue.inline").sync { Queue.serial("test.queue.inline").sync { 7 } }
        }
        #expect(nested == 7)
        let onLoop = try await onLoopThread { loop in
            Queue.loop(loop).sync { loop.isCurrent }
        }
        #expect(onLoop)
        let concurrent = finishes {
            Queue.concurrent("test.queue.inline").sync { Queue.concurrent("test.queue.inline").sync { 8 } }
        }
        #expect(concurrent == 8)
    }

    @Test("sync onto a loop from a plain thread returns the value computed on the loop's thread")
    func syncOntoLoop() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let loop = background.loop
        let onLoop = finishes { Queue.loop(loop).sync { loop.isCurrent } }
        #expect(onLoop == true)
        struct Expected: Error {}
        #expect(throws: Expected.self) { try Queue.loop(loop).sync { throw Expected() } }
        #expect(throws: Expected.self) { try Queue.serial("test.queue.throws").sync { throw Expected() } }
    }

    @Test("two loops that sync onto each other at the same time do not deadlock")
    func crossSyncBetweenLoops() async throws {
        let a = try BackgroundLoop()
        let b = try BackgroundLoop()
        defer {
            a.stop()
            b.stop()
        }
        let results = Locked<[String]>([])
        let done = Semaphore()
        let barrier = DispatchGroup()
        barrier.enter()
        barrier.enter()
        a.loop.execute {
            barrier.leave()
            barrier.wait()
            let value = Queue.loop(b.loop).sync { b.loop.isCurrent ? "a→b" : "wrong" }
            results.withLock { $0.append(value) }
            done.signal()
        }
        b.loop.execute {
            barrier.leave()
            barrier.wait()
            let value = Queue.loop(a.loop).sync { a.loop.isCurrent ? "b→a" : "wrong" }
            results.withLock { $0.append(value) }
            done.signal()
        }
        let finished = finishes { done.wait(timeout: .seconds(10)) && done.wait(timeout: .seconds(10)) }
        #expect(finished == true)
        #expect(results.value.sorted() == ["a→b", "b→a"])
    }

    @Test("async(waitingForStart:) is true once the work has started, without waiting for it to finish")
    func waitForStartStarted() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let targets: [Queue] = [.loop(background.loop), .global(.userInitiated), .serial("test.queue.start")]
        let results = finishes { () -> [Bool] in
            targets.map { queue in
                // The work blocks until released: a true result cannot mean "finished".
                let release = DispatchSemaphore(value: 0)
                let finished = DispatchSemaphore(value: 0)
                let started = queue.async(waitingForStart: .seconds(5)) {
                    release.wait()
                    finished.signal()
                }
                release.signal()
                return started && finished.wait(timeout: .now() + 5) == .success
            }
        }
        #expect(results == [true, true, true])
        // On a loop waiting for itself, the work starts (and runs) inside the wait.
        let (own, ranInside) = try await onLoopThread { loop -> (Bool, Bool) in
            nonisolated(unsafe) var ran = false
            let started = Queue.loop(loop).async(waitingForStart: .seconds(5)) { ran = true }
            return (started, ran)
        }
        #expect(own)
        #expect(ranInside)
    }

    @Test("async(waitingForStart:) is false when the target is blocked past the timeout; the work runs later")
    func waitForStartBlocked() async throws {
        let label = "test.queue.blocked"
        let release = DispatchSemaphore(value: 0)
        let ran = DispatchSemaphore(value: 0)
        Queue.serial(label).async { release.wait() }
        let start = ContinuousClock.now
        let started = Queue.serial(label).async(waitingForStart: .milliseconds(50)) { ran.signal() }
        let waited = ContinuousClock.now - start
        #expect(!started)
        #expect(waited >= .milliseconds(50))
        #expect(waited < .seconds(5))
        release.signal()
        #expect(ran.wait(timeout: .now() + 5) == .success, "the work still ran once the queue was free")

        // From inside that serial queue, for itself: cannot start before the caller returns.
        let fromInside = finishes {
            Queue.serial(label).sync { Queue.serial(label).async(waitingForStart: .seconds(5)) { ran.signal() } }
        }
        #expect(fromInside == false)
        #expect(ran.wait(timeout: .now() + 5) == .success)
    }

    @Test("after(_:_:) runs the work no earlier than the delay, on loops and Dispatch queues")
    func after() async throws {
        let background = try BackgroundLoop()
        defer { background.stop() }
        let start = ContinuousClock.now
        let elapsed = Locked<[String: Duration]>([:])
        let done = DispatchGroup()
        for (name, queue) in [("loop", Queue.loop(background.loop)), ("serial", Queue.serial("test.queue.after"))] {
            done.enter()
            queue.after(.milliseconds(40)) {
                elapsed.withLock { $0[name] = ContinuousClock.now - start }
                done.leave()
            }
        }
        #expect(done.wait(timeout: .now() + 5) == .success)
        for (name, duration) in elapsed.value {
            #expect(duration >= .milliseconds(40), "\(name) ran after \(duration)")
        }
        #expect(elapsed.value.count == 2)
    }
}
