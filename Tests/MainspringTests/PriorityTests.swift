import Foundation
import MainspringTesting
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// The priority rules on modelled CPU (`MainspringTesting`): what used to be measured in the
/// loop thread's CPU time with bounds for a loaded machine is exact here.
@Suite("Input first: polling under a flood of work")
struct PriorityTests {
    @Test("input waits at most one poll interval of loop work behind a flood of 1 ms callbacks")
    func inputNotStuckBehindFlood() throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        nonisolated(unsafe) var remaining = 400
        // 400 callbacks of 1 ms each, all posted at once (the naive flood).
        for _ in 0..<400 {
            loop.execute {
                simulation.consume(.milliseconds(1))
                remaining -= 1
            }
        }
        let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(20)), count: 10)
        input.start()
        simulation.advance(by: .milliseconds(400))
        #expect(remaining == 0)
        #expect(input.received == 10)
        // A pass runs for the 2 ms poll interval (two callbacks), then the loop polls: an input
        // written at 20k ms is ready at once, never behind the rest of the queue.
        #expect(input.latencies.max == .zero)
        #expect(input.latencies.max <= loop.configuration.pollInterval + .milliseconds(1))
    }

    @Test("background work still runs while input keeps the loop busy: its share, and no long gap")
    func backgroundNotStarved() throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        nonisolated(unsafe) var backgroundRuns: [Duration] = []
        nonisolated(unsafe) var inputBusy = true
        // A chain of 0.5 ms background items, and a chain of 0.5 ms input items that keeps the
        // loop saturated for 300 ms.
        @Sendable func background() {
            backgroundRuns.append(simulation.now)
            simulation.consume(.microseconds(500))
            if inputBusy { loop.execute(priority: .background, background) }
        }
        @Sendable func input() {
            simulation.consume(.microseconds(500))
            if simulation.now < .milliseconds(300) { loop.execute(priority: .input, input) } else { inputBusy = false }
        }
        loop.execute(priority: .input, input)
        loop.execute(priority: .background, background)
        simulation.advance(by: .milliseconds(400))
        let metrics = loop.metrics
        let share = (metrics.busyTime[.background] ?? .zero) / metrics.totalBusyTime
        let longestGap = zip(backgroundRuns, backgroundRuns.dropFirst()).map { $1 - $0 }.max() ?? .zero
        // The configured share (0.25) of the saturated 300 ms — 150 items, 75 ms of 301, the
        // first after the 1 ms quantum of credit it has to earn — and background items never more
        // than 2 ms of loop work apart (maxStarvation is 100 ms: the share rule alone keeps it).
        #expect(backgroundRuns.count == 150)
        #expect(metrics.busyTime[.background] == .milliseconds(75))
        #expect(share > 0.249, "background got \(share) of the busy time")
        #expect(longestGap == .milliseconds(2), "background waited \(longestGap) of loop work")
    }
}
