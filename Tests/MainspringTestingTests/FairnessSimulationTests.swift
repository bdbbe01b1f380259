import Mainspring
import MainspringTesting
import Testing

/// The loop's fairness rules, tested exactly on modelled CPU: what used to take real seconds and
/// bounds wide enough for a loaded machine is now a fixed, instant result.
@Suite struct FairnessSimulationTests {
    /// 200 chunks of 3 ms fed at `.background` while a timer ticks every 10 ms: each tick waits
    /// for the chunk in progress and nothing else — at most one chunk (here 0, 1 or 2 ms, as the
    /// 3 ms chunks fall against the 10 ms grid), well inside the documented bound of a poll
    /// interval plus one chunk — and the job still takes exactly its 600 ms of CPU.
    @Test func aFedJobKeepsInputUnderItsBound() throws {
        let simulation = try Simulation(seed: 1)
        let loop = simulation.loop
        var waits: [Duration] = []
        var tick = 0
        loop.schedule(every: .milliseconds(10)) { _ in
            tick += 1
            waits.append(simulation.now - .milliseconds(10 * tick))
        }
        var finished: (FeedOutcome, Duration)?
        let feeder = Feeder(loop: loop, priority: .background)
        let job = feeder.feed(chunks: 200) { _ in simulation.consume(.milliseconds(3)) }
        job.onCompletion { finished = ($0, simulation.now) }

        simulation.advance(by: .milliseconds(600))

        #expect(finished?.0 == .completed)
        #expect(finished?.1 == .milliseconds(600))
        #expect(job.statistics.chunks == 200)
        #expect(job.statistics.chunkTime == .milliseconds(600))
        #expect(waits.count == 60)
        #expect(waits.max() == .milliseconds(2))
        #expect(waits.max()! <= loop.configuration.pollInterval + .milliseconds(3))
        #expect(Set(waits) == [.zero, .milliseconds(1), .milliseconds(2)])
        let metrics = loop.metrics
        #expect(metrics.longestCallback == .milliseconds(3))
        #expect(metrics.stalls == 0)
    }

    /// Input that keeps the loop saturated — a 1 ms `.input` handler that is always ready again
    /// — does not starve fed background work: the guaranteed share (`backgroundShare`, 0.25 by
    /// default) holds over a simulated second, and no background chunk waits longer than
    /// `maxStarvation`.
    @Test func anInputFloodLeavesBackgroundWorkItsShare() throws {
        let simulation = try Simulation(seed: 1)
        let loop = simulation.loop
        let flood = Flood(loop: loop, simulation: simulation)
        loop.execute(priority: .input) { flood.handle() }
        let feeder = Feeder(loop: loop, priority: .background)
        var chunks = 0
        feeder.feed(chunks: 100_000) { _ in
            chunks += 1
            simulation.consume(.microseconds(100))
        }
        simulation.advance(by: .seconds(1))
        flood.stop = true
        let metrics = loop.metrics
        // Exactly a quarter of the second went to the fed chunks (2,500 × 100 µs); the input got
        // the rest, 750 handlers, plus the pass in progress at the 1 s mark, which finishes
        // (2 more: a pass runs for a poll interval).
        #expect(chunks == 2_500)
        #expect(metrics.busyTime[.background] == .milliseconds(250))
        #expect(flood.handled == 752)
        #expect(metrics.busyTime[.input] == .milliseconds(752))
        // No chunk waited more than two poll intervals, far below `maxStarvation`.
        #expect(metrics.queueWait[.background]?.max == .milliseconds(4))
    }
}

/// `.input` work that is always ready: each handler takes 1 ms and posts the next.
private final class Flood: @unchecked Sendable {
    let loop: EventLoop
    let simulation: Simulation
    var handled = 0
    var stop = false

    init(loop: EventLoop, simulation: Simulation) {
        self.loop = loop
        self.simulation = simulation
    }

    func handle() {
        guard !stop else { return }
        handled += 1
        simulation.consume(.milliseconds(1))
        loop.execute(priority: .input) { self.handle() }
    }
}
