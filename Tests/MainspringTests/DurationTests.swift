import Foundation
import Mainspring
import MainspringTestSupport
import Testing

@Suite("Durations: a wait may be negative, a period may not", .serialized)
struct DurationTests {
    @Test("a period that is zero or negative stops the program with a message naming it (subprocess)",
          arguments: [
              ("every-zero", "EventLoop.schedule(every:_:)'s interval must be a positive duration, not 0.0 seconds"),
              ("every-negative", "EventLoop.schedule(every:_:)'s interval must be a positive duration, not -0.005 seconds"),
              ("poll-interval-zero", "EventLoop.Configuration.pollInterval must be a positive duration"),
              ("idle-timeout-negative", "Listener: Connection.Options.idleTimeout must be a positive duration, not -0.001 seconds"),
              ("idle-timeout-zero", "Connection.connect: Connection.Options.idleTimeout must be a positive duration"),
              ("input-pattern-zero", "InputSimulator.Pattern.steady(every:) must be a positive duration"),
          ])
    func periodsMustBePositive(_ which: String, _ message: String) async throws {
        let result = try await runFixture("duration-misuse", arguments: [which],
                                          environment: ["SWIFT_BACKTRACE": "enable=no"])
        #expect(result.crashedBySignal, "\(result.summary)")
        #expect(result["case"] == which && result["accepted"] == nil, "\(result.summary)")
        #expect(result.stderr.contains(message), "\(result.summary)")
    }

    @Test("a repeating timer's tiny interval is raised to minimumRepeatInterval: no busy spin")
    func repeatingFloor() async throws {
        let (ticks, elapsed) = try await onLoopThread { loop -> (Int, Duration) in
            nonisolated(unsafe) var ticks = 0
            let start = ContinuousClock.now
            let timer = loop.schedule(every: .nanoseconds(1)) { _ in ticks += 1 }
            loop.spin(until: { false }, timeout: .milliseconds(200))
            timer.cancel()
            return (ticks, ContinuousClock.now - start)
        }
        // At most one tick per 100 µs of elapsed time (the skipped ticks are not made up).
        let bound = Int(elapsed / EventLoop.minimumRepeatInterval) + 1
        #expect(ticks <= bound, "\(ticks) ticks in \(elapsed); the floor allows \(bound)")
        #expect(ticks >= 10, "the timer hardly ran: \(ticks) ticks in \(elapsed)")
    }

    @Test("a negative wait counts as zero: a timer, sleep(for:) and a spin's timeout")
    func negativeWaits() async throws {
        let fired = try await onLoopThread { loop -> Bool in
            nonisolated(unsafe) var fired = false
            loop.schedule(after: .seconds(-3)) { fired = true }
            return loop.spin(until: { fired }, timeout: .seconds(5))
        }
        #expect(fired)
        // Far in the past, so that a wait taken as its magnitude (or as a huge unsigned number)
        // would be unmistakable even on a loaded machine: the bounds leave room for preemption.
        let spun = try await onLoopThread { loop -> Duration in
            let start = ContinuousClock.now
            loop.spin(until: { false }, timeout: .seconds(-1_000))
            return ContinuousClock.now - start
        }
        #expect(spun < .seconds(30))
        let group = try EventLoopGroup(loopCount: 1)
        let slept = try await Task(executorPreference: group.loops[0]) { () async throws -> Duration in
            let start = ContinuousClock.now
            try await group.loops[0].sleep(for: .seconds(-1_000))
            return ContinuousClock.now - start
        }.value
        #expect(slept < .seconds(30))
        await group.shutdown(gracePeriod: .seconds(1))
    }
}
