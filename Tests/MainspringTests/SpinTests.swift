import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("Running, spinning and stopping", .serialized)
struct SpinTests {
    @Test("spin nests three deep inside handlers, each waiting on its own timer")
    func nestedThreeDeep() async throws {
        let log = try await onLoopThread { loop -> [String] in
            nonisolated(unsafe) var log: [String] = []
            nonisolated(unsafe) var ticks = 0
            let ticker = loop.schedule(every: .milliseconds(5)) { _ in ticks += 1 }
            @Sendable func level(_ n: Int) {
                log.append("enter \(n)")
                if n < 3 {
                    loop.execute { level(n + 1) }
                }
                var fired = false
                loop.schedule(after: .milliseconds(20 * (4 - n))) { fired = true }
                let ok = loop.spin(until: { fired }, timeout: .seconds(5))
                log.append("leave \(n) \(ok)")
            }
            loop.execute { level(1) }
            loop.spin(until: { log.count == 6 }, timeout: .seconds(10))
            ticker.cancel()
            #expect(ticks >= 3, "other sources kept running during the nested spins")
            return log
        }
        // Innermost finishes first; each level's own timer woke it.
        #expect(log == ["enter 1", "enter 2", "enter 3", "leave 3 true", "leave 2 true", "leave 1 true"])
    }

    @Test("spin returns false after its timeout, and true at once when the condition holds")
    func spinTimeout() async throws {
        let (timedOut, elapsed, immediate) = try await onLoopThread { loop -> (Bool, Duration, Bool) in
            let start = ContinuousClock.now
            let result = loop.spin(until: { false }, timeout: .milliseconds(50))
            let elapsed = ContinuousClock.now - start
            return (result, elapsed, loop.spin(until: { true }, timeout: .zero))
        }
        #expect(!timedOut)
        #expect(elapsed >= .milliseconds(50))
        #expect(elapsed < .seconds(2))
        #expect(immediate)
    }

    @Test("stop() from another thread ends run(), waking it from its sleep in epoll")
    func stopFromOtherThread() async throws {
        let loop = try EventLoop()
        let started = DispatchSemaphore(value: 0)
        let done = startThread {
            loop.execute { started.signal() }
            try? loop.run()
        }
        #expect(started.wait(timeout: .now() + 5) == .success)
        // Wait (10 s at most) until the loop has nothing left to do and sleeps in epoll, so the
        // stop has to wake it rather than being seen on the way round.
        let deadline = ContinuousClock.now + .seconds(10)
        while loop.activity != .waiting && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(1))
        }
        let before = loop.activity
        #expect(before == .waiting, "the loop never fell asleep: \(before)")
        loop.stop()
        #expect(done.wait(timeout: .now() + 5) == .success)
        #expect(loop.activity == .notRunning)
    }

    @Test("a stop() that arrives before run() starts is not lost")
    func stopBeforeRun() async throws {
        let loop = try EventLoop()
        loop.stop()
        let done = startThread { try? loop.run() }
        #expect(done.wait(timeout: .now() + 5) == .success)
    }

    @Test("stop() inside nested spins unwinds them all and ends run(); queued work survives")
    func stopUnwindsNestedSpins() async throws {
        let (results, laterRan) = try await onLoopThread { loop -> ([Bool], Bool) in
            nonisolated(unsafe) var results: [Bool] = []
            nonisolated(unsafe) var laterRan = false
            loop.execute {
                loop.execute {
                    loop.execute { loop.stop() }
                    results.append(loop.spin(until: { false }))
                }
                results.append(loop.spin(until: { false }))
                loop.execute { laterRan = true }
            }
            try loop.run()
            let ranBeforeRestart = laterRan
            loop.spin(until: { laterRan }, timeout: .seconds(2))
            return (results + [ranBeforeRestart], laterRan)
        }
        #expect(results == [false, false, false])
        #expect(laterRan)
    }

    @Test("runOnce(blocking: false) runs what is ready and returns at once")
    func runOnceNonBlocking() async throws {
        let (ran, idle) = try await onLoopThread { loop -> (Int, Int) in
            for _ in 0..<3 { loop.execute {} }
            let ran = loop.runOnce(blocking: false)
            return (ran, loop.runOnce(blocking: false))
        }
        #expect(ran == 3)
        #expect(idle == 0)
    }

    @Test("an idle run() sleeps in epoll: 300 ms of it uses under 30 ms of CPU")
    func idleUsesNoCPU() async throws {
        let (cpu, wakeups) = try await onLoopThread { loop -> (Duration, Int) in
            let before = threadCPUTime()
            let wakeupsBefore = loop.metrics.polls
            let stopper = startThread {
                usleep(300_000)
                loop.stop()
            }
            try loop.run()
            stopper.wait()
            return (threadCPUTime() - before, loop.metrics.polls - wakeupsBefore)
        }
        #expect(cpu < .milliseconds(30), "idle loop used \(cpu)")
        #expect(wakeups <= 3, "idle loop polled \(wakeups) times")
    }
}
