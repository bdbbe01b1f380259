import Foundation
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore
import MainspringTesting

#if canImport(Glibc)
import Glibc
#endif

/// One update as a test saw it: which step, what progress, when (since the test's start).
struct Update: Sendable {
    let step: Int
    let progress: Double
    let at: Duration
}

/// The CSS values of the standard timing functions (cubic-bezier solved by 200 bisections).
private let cssReference: [(Curve, String, [(x: Double, y: Double)])] = [
    (.easeIn, "ease-in", [(0.1, 0.017027), (0.25, 0.093465), (0.5, 0.315357), (0.75, 0.621862), (0.9, 0.839428)]),
    (.easeOut, "ease-out", [(0.1, 0.160572), (0.25, 0.378138), (0.5, 0.684643), (0.75, 0.906535), (0.9, 0.982973)]),
    (.easeInOut, "ease-in-out", [(0.1, 0.019722), (0.25, 0.129162), (0.5, 0.5), (0.75, 0.870838), (0.9, 0.980278)]),
    (.cubicBezier(x1: 0.25, y1: 0.1, x2: 0.25, y2: 1), "ease",
     [(0.1, 0.094796), (0.25, 0.408511), (0.5, 0.802403), (0.75, 0.960459), (0.9, 0.994316)]),
]

/// Runs `body` against a loop that runs on its own thread (`run()` until `stop()`), then stops
/// the loop and waits for its thread.
private func withRunningLoop<T: Sendable>(_ body: (EventLoop) async throws -> T) async throws -> T {
    let loop = try EventLoop()
    let stopped = Locked(false)
    let thread = Thread {
        try? loop.run()
        stopped.withLock { $0 = true }
    }
    thread.start()
    let result = try await body(loop)
    loop.stop()
    try await waitUntil(timeout: .seconds(10)) { stopped.value }
    return result
}

/// Polls `condition` every millisecond until it holds; throws after `timeout`.
func waitUntil(timeout: Duration, _ condition: () -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
        if ContinuousClock.now >= deadline { throw TimelineTestError.timedOut }
        try await Task.sleep(for: .milliseconds(1))
    }
}

enum TimelineTestError: Error { case timedOut }

/// The linear progress of a step as the timeline read it, back in nanoseconds since the step
/// began (exact up to rounding for `.linear`).
func elapsedNanoseconds(_ progress: Double, of duration: Duration) -> Double {
    progress * Double(duration.clampedNanoseconds)
}

@Suite("Timeline", .serialized)
struct TimelineTests {
    // MARK: Order and progress

    @Test("progress never decreases, stays in 0...1, and each step ends with exactly one 1.0")
    func progressMonotonic() async throws {
        let (values, completions) = try await onLoopThread { loop -> ([[Double]], [Bool]) in
            nonisolated(unsafe) var values: [[Double]] = [[], [], [], []]
            nonisolated(unsafe) var completions: [Bool] = []
            let timeline = Timeline(loop: loop)
            for (i, curve) in [Curve.linear, .easeIn, .easeOut, .easeInOut].enumerated() {
                timeline.step(duration: .milliseconds(100), curve: curve) { values[i].append($0) }
            }
            timeline.start { completions.append($0) }
            loop.spin(until: { !completions.isEmpty }, timeout: .seconds(10))
            loop.spin(until: { false }, timeout: .milliseconds(50))  // nothing comes after it
            return (values, completions)
        }
        #expect(completions == [true])
        for (i, steps) in values.enumerated() {
            #expect(steps.count >= 2, "step \(i): \(steps)")
            #expect(steps.last == 1.0, "step \(i) ends with \(String(describing: steps.last))")
            #expect(steps.filter { $0 == 1.0 }.count == 1, "step \(i): \(steps)")
            #expect(steps.allSatisfy { $0 > 0 && $0 <= 1 }, "step \(i): \(steps)")
            #expect(zip(steps, steps.dropFirst()).allSatisfy { $0 <= $1 }, "step \(i): \(steps)")
        }
    }

    @Test("steps run in order, each ends before the next begins, completion(true) comes last")
    func stepOrder() async throws {
        let log = try await onLoopThread { loop -> [String] in
            nonisolated(unsafe) var log: [String] = []
            let timeline = Timeline(loop: loop)
            for i in 0..<3 {
                timeline.step(duration: .milliseconds(40)) { p in log.append(p == 1 ? "\(i) end" : "\(i)") }
            }
            timeline.start { finished in log.append("completion \(finished)") }
            loop.spin(until: { log.last?.hasPrefix("completion") == true }, timeout: .seconds(10))
            loop.spin(until: { false }, timeout: .milliseconds(30))
            return log
        }
        // Each step ends once, in order, then the completion. (Under load a step may get only
        // its final frame: late frames are dropped, so intermediate frames are not guaranteed.)
        #expect(log.filter { $0.hasSuffix("end") || $0.hasPrefix("completion") }
            == ["0 end", "1 end", "2 end", "completion true"])
        // Every intermediate frame of step i comes after step i-1 ended and before step i ends.
        for i in 0..<3 {
            let end = log.firstIndex(of: "\(i) end")!
            let previousEnd = i == 0 ? -1 : log.firstIndex(of: "\(i - 1) end")!
            for (index, entry) in log.enumerated() where entry == "\(i)" {
                #expect(index > previousEnd && index < end, "frame of step \(i) at \(index): \(log)")
            }
        }
    }

    @Test("delays are honoured, never early, counted from the previous step's last update")
    func delaysHonoured() async throws {
        let (updates, insideStart) = try await onLoopThread { loop -> ([Update], Int) in
            nonisolated(unsafe) var updates: [Update] = []
            nonisolated(unsafe) var done = false
            let timeline = Timeline(loop: loop)
            let delays: [Duration] = [.milliseconds(60), .milliseconds(40), .milliseconds(25)]
            let durations: [Duration] = [.milliseconds(30), .milliseconds(30), .zero]
            let start = ContinuousClock.now
            for i in 0..<3 {
                timeline.step(duration: durations[i], delay: delays[i], curve: .linear) { p in
                    updates.append(Update(step: i, progress: p, at: ContinuousClock.now - start))
                }
            }
            timeline.start { _ in done = true }
            let insideStart = updates.count
            loop.spin(until: { done }, timeout: .seconds(10))
            return (updates, insideStart)
        }
        #expect(insideStart == 0, "a delayed step updated inside start()")
        let frame = Duration.nanoseconds(1_000_000_000 / 60)
        let first = try #require(updates.first { $0.step == 0 })
        let end0 = try #require(updates.last { $0.step == 0 })
        let first1 = try #require(updates.first { $0.step == 1 })
        let end1 = try #require(updates.last { $0.step == 1 })
        let only2 = updates.filter { $0.step == 2 }
        // The first frame of a step comes one frame interval after its delay.
        #expect(first.at >= .milliseconds(60) + frame, "step 0 began after \(first.at)")
        #expect(first1.at - end0.at >= .milliseconds(40) + frame, "step 1 waited \(first1.at - end0.at)")
        #expect(only2.map(\.progress) == [1.0])
        #expect(only2[0].at - end1.at >= .milliseconds(25), "step 2 waited \(only2[0].at - end1.at)")
        // ...and not wildly late either (generous: the machine may be loaded).
        let planned = Duration.milliseconds(185)  // delays and durations added up
        #expect(only2[0].at < planned + .milliseconds(400), "took \(only2[0].at)")
    }

    // MARK: Cancellation

    @Test("cancel mid-step: no further update, completion(false) exactly once")
    func cancelMidStep() async throws {
        let (countAtCancel, count, values, completions, insideCancel) = try await onLoopThread {
            loop -> (Int, Int, [Double], [Bool], [Bool]) in
            nonisolated(unsafe) var values: [Double] = []
            nonisolated(unsafe) var completions: [Bool] = []
            nonisolated(unsafe) var insideCancel: [Bool] = []
            nonisolated(unsafe) var countAtCancel = -1
            let timeline = Timeline(loop: loop)
            timeline.step(duration: .milliseconds(500), curve: .linear) { values.append($0) }
            timeline.step(duration: .milliseconds(500), curve: .linear) { values.append($0) }
            timeline.start { completions.append($0) }
            loop.schedule(after: .milliseconds(100)) {
                countAtCancel = values.count
                timeline.cancel()
                insideCancel = completions
                timeline.cancel()  // idempotent
            }
            loop.spin(until: { !completions.isEmpty }, timeout: .seconds(10))
            loop.spin(until: { false }, timeout: .milliseconds(150))  // ~9 frames' time
            timeline.cancel()
            return (countAtCancel, values.count, values, completions, insideCancel)
        }
        #expect(completions == [false])
        #expect(insideCancel == [false], "completion runs inside cancel()")
        #expect(countAtCancel >= 1, "no frame in the first 100 ms")
        #expect(count == countAtCancel, "updates after cancel: \(values)")
        #expect(values.allSatisfy { $0 < 1 }, "\(values)")
    }

    @Test("cancel from inside an update makes it the last; cancel before start completes with false")
    func cancelFromUpdateAndBeforeStart() async throws {
        let (values, completions, early, earlyUpdates) = try await onLoopThread {
            loop -> ([Double], [Bool], [Bool], Int) in
            nonisolated(unsafe) var values: [Double] = []
            nonisolated(unsafe) var completions: [Bool] = []
            let timeline = Timeline(loop: loop)
            timeline.step(duration: .milliseconds(300)) { p in
                values.append(p)
                if values.count == 3 { timeline.cancel() }
            }
            timeline.step(duration: .zero) { values.append($0) }
            timeline.start { completions.append($0) }
            loop.spin(until: { !completions.isEmpty }, timeout: .seconds(10))
            loop.spin(until: { false }, timeout: .milliseconds(60))

            nonisolated(unsafe) var early: [Bool] = []
            nonisolated(unsafe) var earlyUpdates = 0
            let cancelled = Timeline(loop: loop)
            cancelled.step(duration: .zero) { _ in earlyUpdates += 1 }
            cancelled.cancel()
            cancelled.start { early.append($0) }
            return (values, completions, early, earlyUpdates)
        }
        #expect(values.count == 3, "\(values)")
        #expect(completions == [false])
        #expect(early == [false])
        #expect(earlyUpdates == 0)
    }

    // MARK: Edge cases

    @Test("no steps: completion(true) at once, inside start and animate")
    func noSteps() async throws {
        let (timelineResult, animateResult, later) = try await onLoopThread { loop -> ([Bool], [Bool], [[Bool]]) in
            nonisolated(unsafe) var fromTimeline: [Bool] = []
            nonisolated(unsafe) var fromAnimate: [Bool] = []
            Timeline(loop: loop).start { fromTimeline.append($0) }
            let before = fromTimeline
            loop.animate(eachStepDuration: .seconds(1), completion: { fromAnimate.append($0) })
            let animated = fromAnimate
            loop.spin(until: { false }, timeout: .milliseconds(20))
            return (before, animated, [fromTimeline, fromAnimate])
        }
        #expect(timelineResult == [true])
        #expect(animateResult == [true])
        #expect(later == [[true], [true]], "a completion ran twice")
        let ran = try await withRunningLoop { loop in await Timeline(loop: loop).run() }
        #expect(ran)
    }

    @Test("a zero-duration step delivers a single update(1.0); negative durations count as zero")
    func zeroDuration() async throws {
        let (insideStart, log, completions) = try await onLoopThread { loop -> ([String], [String], [Bool]) in
            nonisolated(unsafe) var log: [String] = []
            nonisolated(unsafe) var completions: [Bool] = []
            let timeline = Timeline(loop: loop)
            timeline.step(duration: .zero) { log.append("a \($0)") }
            timeline.step(duration: .milliseconds(-50), delay: .milliseconds(-5)) { log.append("b \($0)") }
            timeline.step(duration: .zero, delay: .milliseconds(10)) { log.append("c \($0)") }
            timeline.start { completions.append($0) }
            let insideStart = log
            loop.spin(until: { !completions.isEmpty }, timeout: .seconds(10))
            loop.spin(until: { false }, timeout: .milliseconds(30))
            return (insideStart, log, completions)
        }
        #expect(insideStart == ["a 1.0", "b 1.0"], "undelayed zero-duration steps run inside start()")
        #expect(log == ["a 1.0", "b 1.0", "c 1.0"])
        #expect(completions == [true])
    }

    // MARK: Curves

    @Test("curves: exact ends, ease-in-out(0.5) == 0.5, CSS values within 1e-3")
    func curveValues() {
        for curve in [Curve.linear, .easeIn, .easeOut, .easeInOut, .cubicBezier(x1: 0.25, y1: 0.1, x2: 0.25, y2: 1)] {
            #expect(curve.value(at: 0) == 0)
            #expect(curve.value(at: 1) == 1)
            #expect(curve.value(at: -3) == 0)
            #expect(curve.value(at: 7) == 1)
            #expect(curve.value(at: .nan) == 0)
        }
        #expect(Curve.linear.value(at: 0.5) == 0.5)
        #expect(Curve.easeInOut.value(at: 0.5) == 0.5)
        for (curve, name, points) in cssReference {
            for point in points {
                let value = curve.value(at: point.x)
                #expect(abs(value - point.y) < 1e-3, "\(name)(\(point.x)) = \(value), CSS says \(point.y)")
            }
        }
        // Symmetry of ease-in/ease-out and of ease-in-out.
        for x in stride(from: 0.0, through: 1.0, by: 0.05) {
            #expect(abs(Curve.easeIn.value(at: x) - (1 - Curve.easeOut.value(at: 1 - x))) < 1e-9)
            #expect(abs(Curve.easeInOut.value(at: x) - (1 - Curve.easeInOut.value(at: 1 - x))) < 1e-9)
        }
        let squared = Curve.custom { $0 * $0 }
        #expect(squared.value(at: 0.5) == 0.25)
        #expect(squared.value(at: 2) == 1)
        // A degenerate Bézier (flat x stretches, non-finite points) still gives finite answers.
        let odd = Curve.cubicBezier(x1: 0, y1: .infinity, x2: 1, y2: 1)
        #expect((0...100).allSatisfy { odd.value(at: Double($0) / 100).isFinite })
    }

    @Test("the built-in curves are monotonic")
    func curvesMonotonic() {
        for curve in [Curve.linear, .easeIn, .easeOut, .easeInOut, .cubicBezier(x1: 0.25, y1: 0.1, x2: 0.25, y2: 1),
                      .cubicBezier(x1: 0.9, y1: 0, x2: 0.1, y2: 1)]
        {
            var previous = curve.value(at: 0)
            var decreases = 0
            for i in 1...10_000 {
                let value = curve.value(at: Double(i) / 10_000)
                if value < previous { decreases += 1 }
                #expect(value >= 0 && value <= 1)
                previous = value
            }
            #expect(decreases == 0, "\(curve) decreased \(decreases) times")
        }
    }

    // MARK: async run()

    @Test("run() returns true when the timeline completes; updates run on the loop's thread")
    func runCompletes() async throws {
        let updates = Locked<[Double]>([])
        let offLoop = Locked(0)
        let finished = try await withRunningLoop { loop in
            let timeline = Timeline(loop: loop)
            timeline.step(duration: .milliseconds(60)) { p in
                updates.withLock { $0.append(p) }
                if !loop.isCurrent { offLoop.withLock { $0 += 1 } }
            }
            timeline.step(duration: .zero, delay: .milliseconds(10)) { p in updates.withLock { $0.append(p) } }
            return await timeline.run()
        }
        #expect(finished)
        #expect(offLoop.value == 0)
        #expect(updates.value.last == 1.0)
        #expect(updates.value.filter { $0 == 1.0 }.count == 2)
    }

    @Test("cancelling the Task cancels run(): it returns false and no update follows")
    func runTaskCancellation() async throws {
        let updates = Locked<[Double]>([])
        let (result, waited, countAtReturn) = try await withRunningLoop { loop -> (Bool, Duration, Int) in
            let task = Task { () -> Bool in
                let timeline = Timeline(loop: loop)
                timeline.step(duration: .seconds(5), curve: .linear) { p in updates.withLock { $0.append(p) } }
                return await timeline.run()
            }
            try await waitUntil(timeout: .seconds(10)) { updates.value.count >= 3 }
            let cancelledAt = ContinuousClock.now
            task.cancel()
            let result = await task.value
            let waited = ContinuousClock.now - cancelledAt
            let countAtReturn = updates.value.count
            try await Task.sleep(for: .milliseconds(100))  // six frames' time: none may come
            return (result, waited, countAtReturn)
        }
        #expect(result == false)
        #expect(waited < .seconds(2), "run() took \(waited) to notice the cancellation")
        #expect(updates.value.count == countAtReturn, "updates after run() returned")
        #expect(updates.value.allSatisfy { $0 < 1 })
    }

    @Test("run() in an already-cancelled task returns false without a single update")
    func runAlreadyCancelled() async throws {
        let updates = Locked(0)
        let result = try await withRunningLoop { loop -> Bool in
            let task = Task { () -> Bool in
                withUnsafeCurrentTask { $0?.cancel() }
                let timeline = Timeline(loop: loop)
                timeline.step(duration: .zero) { _ in updates.withLock { $0 += 1 } }
                timeline.step(duration: .milliseconds(100)) { _ in updates.withLock { $0 += 1 } }
                return await timeline.run()
            }
            return await task.value
        }
        #expect(result == false)
        #expect(updates.value == 0)
    }
}
