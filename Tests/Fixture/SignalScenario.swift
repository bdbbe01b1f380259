import Foundation
import Mainspring

/// `signal-default`: SIGTERM keeps its default action (the process starts with it), is watched
/// on the main loop, the watcher is cancelled, and SIGTERM is raised right away. The default
/// action must be back by then: the process ends by SIGTERM. Surviving is a failure.
@MainActor
func signalDefaultScenario() throws {
    // Several hand-overs first: each cancel() must leave the default in place for the next one.
    for _ in 0..<20 {
        var seen = false
        let watcher = try EventLoop.main.onSignal(SIGTERM) { seen = true }
        raise(SIGTERM)
        check(EventLoop.main.spin(until: { seen }, timeout: .seconds(10)), "the watcher never saw SIGTERM")
        watcher.cancel()
    }
    let watcher = try EventLoop.main.onSignal(SIGTERM) {}
    watcher.cancel()
    raise(SIGTERM)
    fail("still alive after SIGTERM: the default action was not back when cancel() returned")
}
