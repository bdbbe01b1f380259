// Only with `MAINSPRING_MAIN_EXECUTOR=1` (the experimental custom main executor).
#if MAINSPRING_MAIN_EXECUTOR
@_spi(ExperimentalCustomExecutors) import _Concurrency
import Foundation
import Mainspring

/// `EventLoop.installAsMainExecutor()`: `@MainActor` jobs are posted straight to `EventLoop.main`
/// (they show up as cross-thread posts in its metrics), `MainActor.executor.run()` runs the loop,
/// and `DispatchQueue.main` still works.
@MainActor
func mainExecutorScenario() throws {
    EventLoop.installAsMainExecutor()
    report("main-executor", type(of: MainActor.executor))
    let before = EventLoop.main.metrics.remoteItems
    Task.detached {
        var onMain = 0
        for _ in 0..<100 where await MainActor.run(body: { Thread.isMainThread && EventLoop.main.isCurrent }) {
            onMain += 1
        }
        report("main-actor-hops-on-main", onMain)
        DispatchQueue.main.async {
            report("dispatch-main-still-drained", Thread.isMainThread)
            report("posted-to-loop", EventLoop.main.metrics.remoteItems - before >= 100)
            MainActor.executor.stop()
        }
    }
    try MainActor.executor.run()
}
#endif
