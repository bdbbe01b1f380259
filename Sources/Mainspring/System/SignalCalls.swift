internal import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

// The signal calls behind `EventLoop.onSignal` (Events/Signals.swift): Mainspring's own handler
// (CMainspringSystem/system.c), which counts each catch of a signal and writes that signal's
// eventfd; installing and removing it with sigaction(2); the per-signal eventfds.

/// The disposition a signal had before Mainspring's handler replaced it.
struct SavedDisposition: @unchecked Sendable {
    fileprivate var action = sigaction()
}

/// Routes `signal` to Mainspring's handler, which writes `descriptor` on each catch; returns the
/// disposition it replaced. Takes effect before it returns.
/// - Throws: `.system("sigaction", EINVAL)` for a signal that cannot be caught (`SIGKILL`,
///   `SIGSTOP`) or a number that is no signal.
func installSignalHandler(_ signal: Int32, writing descriptor: Int32) throws(EventLoopError) -> SavedDisposition {
    var saved = SavedDisposition()
    guard ms_signal_install(signal, descriptor, &saved.action) == 0 else {
        throw .system(function: "sigaction(\(signal))", errno: errno)
    }
    return saved
}

/// Puts back the disposition that `installSignalHandler` replaced. Takes effect before it
/// returns.
func restoreSignalDisposition(_ signal: Int32, _ saved: SavedDisposition) {
    var action = saved.action
    _ = ms_signal_restore(signal, &action)  // cannot fail: the same call accepted this signal before
}

/// How many times `signal` was caught since the last call, and the order of the first of those
/// catches among every signal's (0 when unknown).
func takeSignalCatches(_ signal: Int32) -> (count: UInt, order: UInt) {
    var first: UInt = 0
    let count = ms_signal_take(signal, &first)
    return (UInt(count), first)
}

/// Whether `signal` is a number Mainspring's handler can serve (1…64).
func isSignalNumber(_ signal: Int32) -> Bool { signal > 0 && signal < MS_SIGNAL_LIMIT }

/// Raises `signal` on the calling thread with it unblocked for the moment, so that its
/// disposition runs (or ends the process) before this returns.
func raiseUnblocked(_ signal: Int32) {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, signal)
    var previous = sigset_t()
    pthread_sigmask(SIG_UNBLOCK, &set, &previous)
    raise(signal)
    pthread_sigmask(SIG_SETMASK, &previous, nil)
}
