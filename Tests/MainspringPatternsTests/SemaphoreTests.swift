import Foundation
import Synchronization
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore

@Suite("Semaphore", .serialized)
struct SemaphoreTests {
    @Test("wait(timeout:) returns false after at least the timeout, true at once when signalled before")
    func timeouts() async throws {
        let semaphore = Semaphore()
        let result = finishes { () -> (Bool, Duration) in
            let start = ContinuousClock.now
            return (semaphore.wait(timeout: .milliseconds(50)), ContinuousClock.now - start)
        }
        #expect(result?.0 == false)
        #expect((result?.1 ?? .zero) >= .milliseconds(50))
        #expect((result?.1 ?? .seconds(99)) < .seconds(5))
        semaphore.signal()
        #expect(semaphore.wait(timeout: .milliseconds(50)))
    }

    @Test("a zero or negative timeout only takes a signal that is already there")
    func tryWait() async throws {
        let semaphore = Semaphore(value: 1)
        #expect(semaphore.wait(timeout: .zero))
        #expect(!semaphore.wait(timeout: .zero))
        #expect(!semaphore.wait(timeout: .milliseconds(-10)))
        semaphore.signal()
        #expect(semaphore.wait(timeout: .milliseconds(-10)))
    }

    @Test("a signal from another thread wakes a blocked waiter; every signal is taken once")
    func crossThread() async throws {
        let semaphore = Semaphore()
        let taken = Atomic<Int>(0)
        let waiters = (0..<4).map { _ in
            startThread {
                for _ in 0..<250 where semaphore.wait(timeout: .seconds(10)) {
                    taken.add(1, ordering: .relaxed)
                }
            }
        }
        for _ in 0..<1_000 { semaphore.signal() }
        for waiter in waiters { #expect(waiter.wait(timeout: .now() + 20) == .success) }
        #expect(taken.load(ordering: .relaxed) == 1_000)
        #expect(!semaphore.wait(timeout: .zero), "no signal left over")
    }

    @Test("a negative initial value needs that many extra signals")
    func negativeValue() async throws {
        let semaphore = Semaphore(value: -1)
        semaphore.signal()
        #expect(!semaphore.wait(timeout: .zero))
        semaphore.signal()
        #expect(semaphore.wait(timeout: .zero))
    }

    @Test("wait on a loop's thread keeps the loop running: timers tick, a timer's signal ends the wait")
    func waitSpinsTheLoop() async throws {
        let (signalled, ticksWhileWaiting, timedOut, ticksWhileTimingOut) = try await onLoopThread { loop in
            nonisolated(unsafe) var ticks = 0
            let semaphore = Semaphore()
            // The ticker's third tick signals: the wait can only end if the loop ran meanwhile.
            let ticker = loop.schedule(every: .milliseconds(5)) { _ in
                ticks += 1
                if ticks == 3 { semaphore.signal() }
            }
            let signalled = semaphore.wait(timeout: .seconds(30))
            let ticksWhileWaiting = ticks
            // 300 ms of a 5 ms ticker: at least one tick even on a loaded machine.
            let timedOut = !Semaphore().wait(timeout: .milliseconds(300))
            let ticksWhileTimingOut = ticks - ticksWhileWaiting
            ticker.cancel()
            return (signalled, ticksWhileWaiting, timedOut, ticksWhileTimingOut)
        }
        #expect(signalled)
        #expect(ticksWhileWaiting >= 3, "the loop ran while waiting")
        #expect(timedOut)
        #expect(ticksWhileTimingOut >= 1, "the loop ran while timing out")
    }

    @Test("wait inside a handler on a loop, signalled from another thread")
    func waitInHandlerSignalledElsewhere() async throws {
        let result = try await onLoopThread { loop -> Bool in
            let semaphore = Semaphore()
            nonisolated(unsafe) var outcome: Bool?
            loop.execute {
                startThread {
                    usleep(20_000)
                    semaphore.signal()
                }
                outcome = semaphore.wait(timeout: .seconds(5))
            }
            loop.spin(until: { outcome != nil }, timeout: .seconds(10))
            return outcome ?? false
        }
        #expect(result)
    }
}
