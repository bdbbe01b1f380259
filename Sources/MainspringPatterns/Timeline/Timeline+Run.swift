import MainspringCore

extension Timeline {
    /// Runs the timeline on its loop and returns when it completes: `true` after the last step's
    /// last update, `false` if it was cancelled. Cancelling the surrounding `Task` cancels the
    /// timeline (no update runs after the loop has seen the cancellation), and then `run()`
    /// returns `false`; a task that is already cancelled gets `false` with no update at all.
    ///
    /// The steps' `update` closures run on the loop's thread, as with `start(completion:)`, while
    /// the calling task waits; `run()` itself runs off any actor (`@concurrent`) and hands the
    /// timeline to the loop with `execute`. So the compiler checks that the timeline can be sent
    /// there: build it in the task that runs it, with closures that do not capture an actor's
    /// state (the compiler rejects those — from code already on the loop's thread, use
    /// `start(completion:)`). The loop must be running (or run later) for `run()` to return.
    ///
    /// A timeline runs once: `run()` after `start` or another `run()` is a precondition failure
    /// on the loop's thread.
    @concurrent
    public func run() async -> Bool {
        // Carried to the loop's thread (`LoopBound`). Sound: `run()` is `@concurrent`, so the
        // timeline (its closures and what they capture) is either sent to it by an isolated
        // caller or belongs to the calling task's own region; nothing else touches it while the
        // task waits here. From the hand-off on only the loop's thread touches it (`start`, the
        // updates, the completion, `cancel`), and the continuation's resumption orders all of
        // that before the task goes on.
        let handoff = LoopBound(self)
        let loop = self.loop
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                loop.execute {
                    handoff.value.start { finished in continuation.resume(returning: finished) }
                }
            }
        } onCancel: {
            // Any thread; `cancel()` runs on the loop. Before the start above, it makes the start
            // complete with `false` at once; after completion, it does nothing.
            loop.execute { handoff.value.cancel() }
        }
    }
}
