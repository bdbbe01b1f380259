import Foundation

/// Prints one `key=value` line (the tests parse these).
func report(_ key: String, _ value: Any) {
    print("\(key)=\(value)")
    fflush(nil)
}

/// Prints `FAIL: message` on stderr and exits 1.
func fail(_ message: String) -> Never {
    fflush(nil)
    FileHandle.standardError.write(Data("FAIL: \(message)\n".utf8))
    exit(1)
}

/// Fails the scenario unless `condition` holds.
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fail(message()) }
}

/// Ends a hung scenario with status 3 after `seconds`.
///
/// The watchdog's thread blocks every signal, so that a signal the test sends the process is
/// never delivered to it: a handled signal interrupts `sleep`, and a watchdog that sleeps for a
/// count would fire at once when a scenario's SIGTERM lands on its thread. It sleeps to a
/// deadline, which an interruption cannot cut short.
func startWatchdog(seconds: UInt32) {
    Thread.detachNewThread {
        var all = sigset_t()
        sigfillset(&all)
        pthread_sigmask(SIG_BLOCK, &all, nil)
        let deadline = ContinuousClock.now + .seconds(Int(seconds))
        while ContinuousClock.now < deadline {
            usleep(500_000)
        }
        FileHandle.standardError.write(Data("FAIL: watchdog: the scenario hung for \(seconds) s\n".utf8))
        exit(3)
    }
}

/// Busy-waits (real CPU work) for `duration`.
func burn(_ duration: Duration) {
    let end = ContinuousClock.now + duration
    var x: UInt64 = 1
    while ContinuousClock.now < end {
        for i in 0..<64 { x = x &* 6364136223846793005 &+ UInt64(i) }
    }
    if x == 0 { print("unreachable") }
}

enum FixtureError: Error { case expected }
