import MainspringCore

extension EventLoop {
    /// Runs `steps` one after another on this loop, each for `eachStepDuration` after
    /// `eachStepDelay`, eased with `curve` — a chain of animation blocks, such as UIKit code
    /// writes with nested `UIView.animate` completions, without the nesting. Each step gets
    /// eased progress once per frame (60 per second), ending with exactly `1.0`; see `Timeline`
    /// for the timing promises.
    ///
    /// ```swift
    /// loop.animate(eachStepDuration: .milliseconds(300), steps:
    ///     { p in view.x = 100 - 100 * p },
    ///     { p in view.width = 200 + 200 * p },
    ///     completion: { finished in print(finished) }
    /// )
    /// ```
    ///
    /// - Important: pass `completion` **with its label**. Steps and completion both take one
    ///   argument, so an unlabeled trailing closure `{ finished in … }` after the steps is bound
    ///   to the variadic `steps` — it becomes one more step that receives progress (a `Double`),
    ///   and there is no completion. (The multiple-trailing-closure form
    ///   `animate(eachStepDuration: d) { p in … } completion: { finished in … }` works too.)
    ///
    /// With no steps, `completion(true)` runs at once, inside this call. Loop thread only
    /// (precondition); `steps` and `completion` run on it.
    /// - Returns: the running timeline, to `cancel()` it (then `completion(false)`).
    @available(*, noasync, message: "loop thread only; in async code build a `Timeline` and `await timeline.run()`")
    @discardableResult
    public func animate(eachStepDuration duration: Duration, eachStepDelay delay: Duration = .zero,
                        curve: Curve = .easeInOut, steps: ((Double) -> Void)...,
                        completion: ((Bool) -> Void)? = nil) -> Timeline
    {
        preconditionOnLoop("EventLoop.animate(eachStepDuration:eachStepDelay:curve:steps:completion:)",
                           elsewhereUse: "a Timeline built in the task and await timeline.run()")
        let timeline = Timeline(loop: self)
        for update in steps {
            timeline.step(duration: duration, delay: delay, curve: curve, update)
        }
        timeline.start { finished in completion?(finished) }
        return timeline
    }
}
