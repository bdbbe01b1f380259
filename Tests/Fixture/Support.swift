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
/// The watchdog's thread blocks every signal, so a signal the test sends the process is never
/// delivered to it: a handled signal interrupts `sleep`, which once made the watchdog fire 0.04 s
/// into a 30 s wait (the scenario's SIGTERM had landed on this thread). It also sleeps to a
/// deadline, not for a count that an interruption would cut short.
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
