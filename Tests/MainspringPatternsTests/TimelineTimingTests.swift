import Foundation
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore
import MainspringTesting

#if canImport(Glibc)
import Glibc
#endif

/// A timeline's pacing on virtual time — its frame grid, no drift, dropped frames, a saturated
/// loop — and the README's example (order, cancellation, curves and `run()` are
/// TimelineTests.swift).
@Suite("Timeline: timing and the README", .serialized)
struct TimelineTimingTests {
    // MARK: Timing

    // Timing, on virtual time: exact frames, exact instants.

    /// The grid of a 60 fps timeline started at 0: frame k is due at k × 1/60 s, in whole
    /// nanoseconds (the timeline's own arithmetic truncates).
    private static func gridPoint(_ frame: Int) -> Duration {
        .nanoseconds(Int64(frame) * 1_000_000_000 / 60)
    }

    @Test("pacing on an idle loop: a 200 ms step at 60 fps gets its 11 grid frames and ends at 200 ms exactly")
    func idlePacing() throws {
        let simulation = try Simulation()
        var updates: [Update] = []
        var done = false
        let timeline = Timeline(loop: simulation.loop, framesPerSecond: 60)
        timeline.step(duration: .milliseconds(200), curve: .linear) { p in
            updates.append(Update(step: 0, progress: p, at: simulation.now))
        }
        timeline.start { _ in done = true }
        simulation.advance(by: .seconds(1))
        #expect(done)
        #expect(updates.count == 12)
        #expect(updates.last?.progress == 1.0)
        #expect(updates.last?.at == .milliseconds(200))
        #expect(updates.dropLast().map(\.at) == (1...11).map(Self.gridPoint))
    }

    @Test("no drift: frames stay on the grid from the step's start even when updates are slow")
    func noDrift() throws {
        let simulation = try Simulation()
        var times: [Duration] = []
        var done = false
        let timeline = Timeline(loop: simulation.loop, framesPerSecond: 60)
        timeline.step(duration: .milliseconds(300), curve: .linear) { _ in
            times.append(simulation.now)
            simulation.consume(.milliseconds(4))  // a slow update: scheduling from its end would drift
        }
        timeline.start { _ in done = true }
        simulation.advance(by: .seconds(1))
        #expect(done)
        // Every intermediate frame exactly on its grid point, though each update took 4 ms.
        #expect(times.count == 18)
        #expect(times.dropLast() == (1...17).map(Self.gridPoint)[...])
        #expect(times.last == .milliseconds(300))
    }

    @Test("a busy loop drops frames: never two updates back to back after a stall")
    func busyLoopDropsFrames() throws {
        let simulation = try Simulation()
        var times: [Duration] = []
        var done = false
        let timeline = Timeline(loop: simulation.loop, framesPerSecond: 60)
        timeline.step(duration: .milliseconds(400), curve: .linear) { _ in times.append(simulation.now) }
        timeline.start { _ in done = true }
        simulation.loop.schedule(after: .milliseconds(100)) { simulation.consume(.milliseconds(150)) }
        simulation.advance(by: .seconds(1))
        #expect(done)
        let gaps = zip(times, times.dropFirst()).map { $1 - $0 }
        // Frames 1 to 6, then the stall (100 to 250 ms): the frame due at 116.7 ms comes once,
        // late, at 250 ms, and the next is the first grid point at least half an interval after
        // it — no burst of the eight missed ones. Then the grid again, and the end at 400 ms.
        #expect(times == (1...6).map(Self.gridPoint) + [.milliseconds(250)] + (16...23).map(Self.gridPoint)
                    + [.milliseconds(400)])
        #expect(gaps.allSatisfy { $0 >= Self.gridPoint(1) / 2 }, "\(gaps)")
    }

    @Test("frames keep coming while chained .background work saturates the loop")
    func framesUnderBackgroundLoad() throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        var frames = 0
        var done = false
        nonisolated(unsafe) var chunks = 0
        nonisolated(unsafe) var stopChain = false
        @Sendable func chunk() {
            simulation.consume(.milliseconds(1))
            chunks += 1
            if !stopChain { loop.execute(priority: .background, chunk) }
        }
        loop.execute(priority: .background, chunk)
        let timeline = Timeline(loop: loop, framesPerSecond: 60)
        timeline.step(duration: .milliseconds(300), curve: .linear) { _ in frames += 1 }
        timeline.start { _ in done = true }
        simulation.advance(by: .milliseconds(301))
        stopChain = true
        simulation.runUntilIdle()
        #expect(done)
        // Every one of the 18 frames (17 grid points, then the end), each after at most the
        // 1 ms chunk in progress; and the chain had all the rest of the loop: a chunk per
        // millisecond up to and including the one that starts at the 301 ms mark (302), and the
        // one already queued when the chain was told to stop.
        #expect(frames == 18)
        #expect(chunks == 303)
        #expect(loop.metrics.busyTime[.background] == .milliseconds(303))
    }

    // MARK: README

    @Test("README: the three-step example, the Timeline form and run() work as shown")
    func readmeExample() async throws {
        let printedLog = Locked<[String]>([])
        let frame = try await onLoopThread { loop -> [Double] in
            // The last snippet prints from a task too: keep the log under a lock.
            @Sendable func print(_ value: Any) { printedLog.withLock { $0.append("\(value)") } }
            var printed: [String] { printedLog.value }

            // README: "Timelines: steps in sequence, with easing" — first snippet.
            var frame = (x: 100.0, y: 100.0, width: 200.0, height: 200.0)

            loop.animate(eachStepDuration: .milliseconds(300), eachStepDelay: .zero, curve: .easeInOut, steps:
                { p in frame.x = 100 * (1 - p); frame.y = 100 * (1 - p) },   // to the origin,
                { p in frame.width = 200 + 200 * p },                        // then wider,
                { p in frame.height = 200 + 200 * p },                       // then taller
                completion: { finished in print(finished) }                  // true; false if cancelled
            )
            // (end of snippet)
            loop.spin(until: { printed == ["true"] }, timeout: .seconds(10))
            let animated = [frame.x, frame.y, frame.width, frame.height]
            frame = (x: 100.0, y: 100.0, width: 200.0, height: 200.0)

            // Second snippet.
            let timeline = Timeline(loop: loop, framesPerSecond: 60)
            timeline.step(duration: .milliseconds(300), curve: .easeOut) { p in frame.x = 100 * (1 - p) }
            timeline.step(duration: .milliseconds(300), delay: .milliseconds(100)) { p in
                frame.width = 200 + 200 * p
            }
            timeline.start { finished in print(finished) }   // timeline.cancel() → no more updates, false
            // (end of snippet)
            loop.spin(until: { printed == ["true", "true"] }, timeout: .seconds(10))
            let stepped = [frame.x, frame.y, frame.width, frame.height]

            // Third snippet.
            Task {
                let timeline = Timeline(loop: loop)
                timeline.step(duration: .milliseconds(500), curve: .linear) { p in print("progress \(p)") }
                let finished = await timeline.run()          // cancelling the task cancels the timeline
                print("finished: \(finished)")
            }
            // (end of snippet)
            // The task's last print happens off the loop: tick so that the spin re-checks.
            let ticker = loop.schedule(every: .milliseconds(5)) { _ in }
            loop.spin(until: { printed.last?.hasPrefix("finished") == true }, timeout: .seconds(10))
            ticker.cancel()
            return animated + stepped
        }
        let printed = printedLog.value
        #expect(frame == [0, 0, 400, 400, 0, 100, 400, 200])
        #expect(printed.prefix(2) == ["true", "true"])
        #expect(printed.last == "finished: true")
        #expect(printed.dropLast().last == "progress 1.0")
        #expect(printed.count >= 2 + 10, "\(printed)")
    }
}
