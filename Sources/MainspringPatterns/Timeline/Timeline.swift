import MainspringCore

/// Timed steps run one after another on an event loop, each with its own duration, delay and
/// easing — a sequence of animations without nested completion callbacks.
///
/// ```swift
/// let timeline = Timeline(loop: loop)
/// timeline.step(duration: .milliseconds(300)) { progress in bar.fraction = progress }
/// timeline.step(duration: .milliseconds(200), delay: .milliseconds(100), curve: .easeOut) { p in
///     label.opacity = 1 - p
/// }
/// timeline.start { finished in print(finished ? "done" : "cancelled") }
/// ```
///
/// ## What it promises
/// - Steps run in the order they were added. Each waits its delay (counted from the moment the
///   previous step delivered its last update, or from `start`), then calls `update` once per
///   frame with eased progress, and always ends with exactly one `update(1.0)` — its last. A step
///   of zero duration delivers that single `update(1.0)` and nothing else.
/// - The first update of a step comes one frame interval after the step begins (the progress at
///   0 is the state you start from); updates are never early, and within a step progress never
///   decreases with a monotonic curve.
/// - Frames lie on a grid counted from the step's start (`start + k / framesPerSecond`), so
///   lateness never accumulates (no drift), and the last update comes at the step's planned end:
///   on an idle loop, within a timer's lateness (tens of microseconds) of it.
/// - A busy loop drops frames rather than queueing them: after an update, the next frame is the
///   first grid point at least half a frame interval away, so two updates of a step (other than
///   its last) are never closer than half an interval, however late the loop was.
/// - `completion(true)` after the last step's last update; after `cancel()`, no further update
///   and `completion(false)`. Either way the completion runs exactly once, and the timeline then
///   drops its closures.
///
/// ## Threads and cost
/// A timeline is loop-bound: `start`, `cancel` and every `update` and `completion` call happen on
/// the loop's thread (`start` and `cancel` check it with a precondition). You may build it
/// (`init`, `step`) anywhere before it starts — that touches no loop state. Its frames come from
/// one of the loop's timers at `.normal` priority, re-armed per frame (no allocation per frame),
/// so they keep coming while `.background` work saturates the loop. A running timeline is kept
/// alive by its loop: dropping your reference does not stop it.
///
/// ## Not promised
/// Frame times are not synchronised with any display. A timeline runs once: calling `start`
/// (or `run`) a second time, or adding a step after it started, is a programming error
/// (precondition). An `update` that runs longer than a frame makes later frames drop, not pile
/// up; an `update` that spins the loop holds this timeline's frames back until it returns.
public final class Timeline {
    /// The loop that runs the timeline's timer, updates and completion.
    public let loop: EventLoop
    /// Frames per second of every step, `1...1_000` (the initializer clamps it).
    public let framesPerSecond: Int

    private struct Step {
        let duration: UInt64
        let delay: UInt64
        let curve: Curve
        let update: (Double) -> Void
    }

    private enum State {
        case idle
        /// `cancel()` before `start`: the start completes with `false` at once.
        case cancelledBeforeStart
        case running
        case finished
    }

    private enum Phase {
        /// Waiting for the current step's delay to pass.
        case delaying
        /// Delivering frames of the current step, which began at `start` (monotonic ns).
        case animating(start: UInt64)
    }

    private var steps: [Step] = []
    private var state = State.idle
    private var phase = Phase.delaying
    private var index = 0
    private var completion: ((Bool) -> Void)?
    private var timer: FrameTimer?

    /// Creates an empty timeline for `loop` (`EventLoop.current` on the loop's own thread).
    /// Touches no loop state, so it can be built on any thread and started later on the loop's.
    ///
    /// - Parameters:
    ///   - loop: the loop whose thread runs the timer, the updates and the completion.
    ///   - framesPerSecond: the update rate of every step, clamped to `1...1_000`.
    public init(loop: EventLoop, framesPerSecond: Int = 60) {
        self.loop = loop
        self.framesPerSecond = min(max(framesPerSecond, 1), 1_000)
    }

    /// Adds a step at the end: after `delay`, `update` is called once per frame for `duration`
    /// with `curve`-eased progress, the last time with exactly `1.0`.
    ///
    /// Negative durations and delays count as zero. Only before the timeline starts
    /// (precondition). `update` runs on the loop's thread.
    public func step(duration: Duration, delay: Duration = .zero, curve: Curve = .easeInOut,
                     _ update: @escaping (Double) -> Void)
    {
        requireUsage(state == .idle || state == .cancelledBeforeStart,
                     "Mainspring: Timeline.step(...) after the timeline started; add every step first")
        steps.append(Step(duration: duration.clampedNanoseconds, delay: delay.clampedNanoseconds,
                          curve: curve, update: update))
    }

    /// Starts running the steps in order; `completion` gets `true` after the last step's last
    /// update, or `false` if the timeline is cancelled first (also when `cancel()` came before
    /// `start`). It runs exactly once, on the loop's thread.
    ///
    /// With no steps, `completion(true)` runs at once, inside this call. Otherwise the first
    /// step begins inside this call: a step with no delay and no duration delivers its
    /// `update(1.0)` before `start` returns.
    ///
    /// Loop thread only (precondition); a timeline starts once (precondition).
    @available(*, noasync, message: "loop thread only; in async code `await timeline.run()`")
    public func start(completion: @escaping (Bool) -> Void) {
        loop.preconditionOnLoop("Timeline.start(completion:)")
        switch state {
        case .idle:
            break
        case .cancelledBeforeStart:
            state = .finished
            steps = []
            completion(false)
            return
        case .running, .finished:
            usageFailure("Mainspring: a Timeline runs once; start(completion:) or run() was already called")
        }
        self.completion = completion
        state = .running
        if steps.isEmpty {
            finish(true)
            return
        }
        // The timer holds the timeline strongly: a running timeline lives as long as its loop
        // keeps the timer; `finish` closes the timer, which drops the handler (and the cycle).
        timer = FrameTimer(loop: loop) { now in self.timerFired(at: now) }
        enterStep(at: loop.monotonicNow())
    }

    /// Stops the timeline: no `update` runs after this returns, and `completion(false)` runs
    /// (inside this call) unless the timeline already completed. Idempotent; safe to call from an
    /// `update` (that update is the last). Before `start`, it makes the later `start` complete
    /// with `false` at once.
    ///
    /// Loop thread only once the timeline has started (precondition).
    public func cancel() {
        switch state {
        case .idle:
            state = .cancelledBeforeStart
        case .running:
            loop.preconditionOnLoop("Timeline.cancel()")
            finish(false)
        case .cancelledBeforeStart, .finished:
            break
        }
    }

    // MARK: The engine (loop thread)

    /// Monotonic-ns offset of grid point `frame` from a step's start: ⌊frame · 1e9 / fps⌋.
    private func gridOffset(_ frame: UInt64) -> UInt64 {
        let fps = UInt64(framesPerSecond)
        let product = frame.multipliedFullWidth(by: 1_000_000_000)
        guard product.high < fps else { return .max }
        return fps.dividingFullWidth(product).quotient
    }

    /// The first grid index whose offset is later than `elapsed` (ns since the step began).
    private func firstFrame(after elapsed: UInt64) -> UInt64 {
        let estimate = Double(elapsed) * Double(framesPerSecond) / 1e9
        var frame = estimate < 1e18 ? UInt64(estimate) : UInt64(1e18)
        while frame > 1 && gridOffset(frame - 1) > elapsed { frame -= 1 }
        while gridOffset(frame) <= elapsed { frame += 1 }
        return max(frame, 1)
    }

    /// Begins the step at `index` at time `now`, and every following step that needs no waiting
    /// (zero delay and duration), until one has to wait or the timeline completes.
    private func enterStep(at now: UInt64) {
        var now = now
        while state == .running {
            guard index < steps.count else {
                finish(true)
                return
            }
            let step = steps[index]
            if step.delay > 0 {
                phase = .delaying
                timer?.arm(at: now &+ step.delay)
                return
            }
            if beginAnimating(step, at: now) { return }
            now = loop.monotonicNow()
        }
    }

    /// Starts the frames of `step` at `now`. A zero-duration step delivers its `update(1.0)`
    /// and moves on: returns `false` when the caller should enter the next step.
    private func beginAnimating(_ step: Step, at now: UInt64) -> Bool {
        if step.duration > 0 {
            phase = .animating(start: now)
            timer?.arm(at: now &+ min(gridOffset(1), step.duration))
            return true
        }
        step.update(1.0)
        index += 1
        return false
    }

    private func timerFired(at now: UInt64) {
        guard state == .running, index < steps.count else { return }
        let step = steps[index]
        switch phase {
        case .delaying:
            if !beginAnimating(step, at: now) { enterStep(at: loop.monotonicNow()) }
        case let .animating(start):
            let elapsed = now &- start
            if elapsed >= step.duration {
                step.update(1.0)
                guard state == .running else { return }
                index += 1
                enterStep(at: loop.monotonicNow())
                return
            }
            step.update(step.curve.value(at: Double(elapsed) / Double(step.duration)))
            guard state == .running else { return }
            // The next frame: the first grid point at least half an interval after now (read
            // again: the update may have taken a while), so late frames are dropped, never
            // delivered back to back; the step's end comes last, on time.
            let after = loop.monotonicNow() &- start
            let frame = firstFrame(after: after &+ gridOffset(1) / 2)
            timer?.arm(at: start &+ min(gridOffset(frame), step.duration))
        }
    }

    /// Completes the timeline: closes its timer, drops its closures, calls the completion once.
    private func finish(_ finished: Bool) {
        state = .finished
        timer?.close()
        timer = nil
        steps = []
        let completion = self.completion
        self.completion = nil
        completion?(finished)
    }
}

@available(*, unavailable)
extension Timeline: Sendable {}
