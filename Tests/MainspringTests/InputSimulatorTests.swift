import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("InputSimulator", .serialized)
struct InputSimulatorTests {
    @Test("steady: every record written is handled once, as .input, with its latency measured")
    func steadyCounts() async throws {
        try await inSomeAttempt {
            let (sent, received, latencies, sequence, inputCallbacks, elapsed) = try await onLoopThread {
                loop -> (Int, Int, LatencyHistogram, [Int], Int, Duration) in
                nonisolated(unsafe) var sequence: [Int] = []
                let before = loop.metrics.callbacks[.input] ?? 0
                let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)), count: 100) {
                    sequence.append($0.sequence)
                }
                let start = ContinuousClock.now
                input.start()
                let finished = loop.spin(until: { input.isFinished }, timeout: .seconds(20))
                #expect(finished)
                return (input.sent, input.received, input.latencies, sequence,
                        (loop.metrics.callbacks[.input] ?? 0) - before, ContinuousClock.now - start)
            }
            #expect(sent == 100)
            #expect(received == 100)
            #expect(latencies.count == 100)
            #expect(sequence == Array(0..<100))
            #expect(inputCallbacks >= 1)
            // A 1 ms grid of 100 records takes about 100 ms (generous for a loaded machine).
            #expect(elapsed >= .milliseconds(99) && elapsed < .seconds(10))
            // An idle loop handles input quickly (generous bound), on an undisturbed run: the
            // latency is wall-clock time, which a descheduled loop or writer thread stretches.
            let median = latencies.percentile(0.5)
            return median < .milliseconds(20) ? nil : "median latency \(median)"
        }
    }

    @Test("burst: records arrive in groups; the handling cost adds up inside one read")
    func burstCounts() async throws {
        let (received, latencies, busy) = try await onLoopThread { loop -> (Int, LatencyHistogram, Duration) in
            let input = try InputSimulator(loop: loop, pattern: .burst(count: 10, every: .milliseconds(20)), count: 50,
                                           handlingCost: .microseconds(200))
            let before = loop.metrics.busyTime[.input] ?? .zero
            input.start()
            loop.spin(until: { input.isFinished }, timeout: .seconds(20))
            return (input.received, input.latencies, (loop.metrics.busyTime[.input] ?? .zero) - before)
        }
        #expect(received == 50)
        // 50 × 200 µs of handling cost, counted as input busy time.
        #expect(busy >= .milliseconds(10))
        // The last of a burst of ten waits for the nine before it (9 × 200 µs of handling, less
        // the few µs the writer took between writes); 1 ms leaves room for a preempted writer.
        #expect(latencies.max >= .milliseconds(1))
    }

    @Test("poisson: the requested count arrives, at roughly the requested rate")
    func poissonCounts() async throws {
        let (received, elapsed) = try await onLoopThread { loop -> (Int, Duration) in
            let input = try InputSimulator(loop: loop, pattern: .poisson(ratePerSecond: 2_000), count: 400)
            let start = ContinuousClock.now
            input.start()
            loop.spin(until: { input.isFinished }, timeout: .seconds(20))
            return (input.received, ContinuousClock.now - start)
        }
        #expect(received == 400)
        // Expected 200 ms; the sum of 400 exponential gaps is within ±50% with overwhelming odds.
        #expect(elapsed >= .milliseconds(100) && elapsed < .seconds(10))
    }

    @Test("stop() ends an unlimited simulator promptly; what was written is still handled")
    func stopUnlimited() async throws {
        let (sent, received, finished, waited) = try await onLoopThread { loop -> (Int, Int, Bool, Duration) in
            let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(2)))
            input.start()
            loop.spin(until: { input.received >= 10 }, timeout: .seconds(20))
            let start = ContinuousClock.now
            input.stop()
            let finished = loop.spin(until: { input.isFinished }, timeout: .seconds(5))
            return (input.sent, input.received, finished, ContinuousClock.now - start)
        }
        #expect(finished)
        #expect(sent == received)
        #expect(received >= 10)
        #expect(waited < .seconds(2))
    }

    @Test("a long sleep in the writer is cut short by stop()")
    func stopDuringLongWait() async throws {
        let (finished, waited, received) = try await onLoopThread { loop -> (Bool, Duration, Int) in
            let input = try InputSimulator(loop: loop, pattern: .steady(every: .seconds(30)), count: 5)
            input.start()
            loop.spin(until: { false }, timeout: .milliseconds(20))
            let start = ContinuousClock.now
            input.stop()
            let finished = loop.spin(until: { input.isFinished }, timeout: .seconds(5))
            return (finished, ContinuousClock.now - start, input.received)
        }
        #expect(finished)
        #expect(waited < .seconds(2))
        #expect(received == 0)
    }

    @Test("a simulator that is never started finishes on stop() without writing")
    func neverStarted() async throws {
        let finished = try await onLoopThread { loop -> Bool in
            let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)), count: 10)
            input.stop()
            return loop.spin(until: { input.isFinished }, timeout: .seconds(5)) && input.sent == 0
        }
        #expect(finished)
    }

    @Test("creating a simulator off the loop's thread is a thrown wrongThread error")
    func wrongThread() async throws {
        let loop = try await onLoopThread { loop in loop }
        #expect(throws: EventLoopError.self) {
            _ = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)), count: 1)
        }
    }
}
