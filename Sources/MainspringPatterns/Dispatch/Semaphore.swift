import Dispatch
import Synchronization
import MainspringCore

/// A counting semaphore whose `wait` does not freeze the caller's event loop.
///
/// `signal()` adds one to the count, or hands it straight to the longest waiter; `wait` takes
/// one, waiting for a `signal()` while there is none. Waiters are served first come, first
/// served.
///
/// ## Waiting on a loop's thread
/// On a thread that runs an event loop (inside one of its handlers, on the main thread, or on a
/// thread that uses `EventLoop.current`), `wait` *spins that loop nested* until it is signalled
/// or times out, like `spin(until:timeout:)`: timers, fds and posted work keep running while the
/// caller waits, and a `signal()` from one of them ends the wait. The code calling `wait` is held
/// back (never re-entered) meanwhile; `DispatchQueue.main` blocks queued while a main-queue block
/// waits run after that block returns. If the loop is asked to `stop()` during the wait, the wait
/// goes on without running the loop. On any other thread `wait` blocks the thread.
///
/// Unlike `DispatchSemaphore`, a negative initial value is allowed: it means that many extra
/// `signal()`s are needed before the first `wait` succeeds.
///
/// Cost: an uncontended `signal` or `wait` takes one mutex; a waiter allocates a small record and
/// is woken with a `DispatchSemaphore` (and, on a loop, one posted no-op).
public final class Semaphore: Sendable {
    private struct State {
        var value: Int
        var waiters: [Waiter] = []
    }

    private let state: Protected<State>

    /// Creates a semaphore holding `value` signals.
    public init(value: Int = 0) {
        state = Protected(State(value: value))
    }

    /// Adds a signal: wakes the longest waiter, if any, or else raises the count. Any thread;
    /// never blocks.
    public func signal() {
        let waiter = state.withLock { state -> Waiter? in
            if state.value >= 0, !state.waiters.isEmpty {
                let waiter = state.waiters.removeFirst()
                waiter.isGranted.store(true, ordering: .releasing)
                return waiter
            }
            state.value += 1
            return nil
        }
        waiter?.wake()
    }

    /// Takes a signal, waiting up to `timeout` for one (`nil`: as long as it takes; zero or
    /// negative: only if one is there now). See the type's notes for what waiting does on a
    /// loop's thread.
    ///
    /// - Returns: `true` if a signal was taken, `false` after the timeout.
    @discardableResult
    public func wait(timeout: Duration? = nil) -> Bool {
        let nanoseconds = timeout?.clampedNanoseconds
        // Real time only on a plain thread (below): a loop's thread spins its loop, on the
        // loop's clock (virtual in a simulation).
        let deadline = nanoseconds.map { monotonicNanoseconds() &+ $0 }
        let loop = nanoseconds == 0 ? nil : EventLoop.loopToSpinWhileWaiting
        let waiter = state.withLock { state -> Waiter? in
            if state.value > 0 && state.waiters.isEmpty {
                state.value -= 1
                return nil
            }
            if nanoseconds == 0 { return Waiter.none }
            let waiter = Waiter(loop: loop)
            state.waiters.append(waiter)
            return waiter
        }
        guard let waiter else { return true }
        if waiter === Waiter.none { return false }

        if let loop {
            let granted = loop.spin(until: { waiter.isGranted.load(ordering: .acquiring) },
                                    timeout: nanoseconds.map { Duration(nanoseconds: $0) })
            if granted { return true }
        }
        // A plain thread, or a loop that was stopped mid-wait: block the thread.
        if !waiter.isGranted.load(ordering: .acquiring) {
            if let deadline {
                // Until the deadline on CLOCK_MONOTONIC: Dispatch's timed wait can end a fraction
                // of a millisecond before it (seen: 49.76 ms of a 50 ms timeout), and the
                // promise is "after at least the timeout".
                while !waiter.isGranted.load(ordering: .acquiring) {
                    let now = monotonicNanoseconds()
                    guard deadline > now else { break }
                    if waiter.blocker.wait(timeout: .now() + .nanoseconds(Int(clamping: deadline - now))) == .success { break }
                }
            } else {
                waiter.blocker.wait()
            }
        }
        // Timed out, unless a signal raced the timeout: decide under the lock.
        return state.withLock { state -> Bool in
            if waiter.isGranted.load(ordering: .acquiring) { return true }
            state.waiters.removeAll { $0 === waiter }
            return false
        }
    }
}

/// One blocked `wait`.
private final class Waiter: Sendable {
    /// Marks "no signal, and the caller will not wait".
    static let none = Waiter(loop: nil)

    /// Set (under the semaphore's lock) when a `signal()` chose this waiter.
    let isGranted = Atomic<Bool>(false)
    /// Wakes a blocked thread.
    let blocker = DispatchSemaphore(value: 0)
    /// The loop the waiter spins, if any: a posted no-op wakes it to re-check `isGranted`.
    let loop: EventLoop?

    init(loop: EventLoop?) { self.loop = loop }

    func wake() {
        loop?.execute {}
        blocker.signal()
    }
}
