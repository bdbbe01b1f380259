import Synchronization

/// What a loop is doing right now, as any thread can see it: for health checks, watchdogs and
/// metrics endpoints.
///
/// A healthy running loop is either `.waiting` in epoll for events, or `.dispatching` for less
/// than its poll interval plus the callback in progress: it polls again at least that often.
/// A loop that has been dispatching for seconds is stuck in one callback (a handler that
/// blocks, a computation that should have been fed in slices): nothing else on it runs.
///
/// A simulated loop (`MainspringTesting`) is `.waiting` between the simulation's steps and
/// `.dispatching` for the virtual time its callbacks have consumed since its iteration began,
/// until it is shut down.
public enum LoopActivity: Sendable, Equatable, CustomStringConvertible {
    /// Asleep in epoll, ready for the next event.
    case waiting
    /// Running callbacks for this long since it last polled.
    case dispatching(for: Duration)
    /// No thread is running the loop (not started yet, stopped, or shut down).
    case notRunning

    /// Whether the loop is running and has polled within `threshold` (or is waiting for events).
    /// A query, not a wait or a period: with a threshold of zero (or less) only a loop waiting
    /// for events counts as responsive.
    public func isResponsive(within threshold: Duration) -> Bool {
        switch self {
        case .waiting: return true
        case .dispatching(let duration): return duration <= threshold
        case .notRunning: return false
        }
    }

    public var description: String {
        switch self {
        case .waiting: return "waiting for events"
        case .dispatching(let duration):
            return "dispatching for \(Double(duration.components.seconds) * 1e3 + Double(duration.components.attoseconds) / 1e15) ms since its last poll"
        case .notRunning: return "not running"
        }
    }
}

/// The loop's activity word: 0 while it waits in a blocking poll, `notRunning` when no thread
/// runs it, otherwise when its last poll returned (`FastClock`). Written by the loop's thread
/// (one relaxed store per poll), read by any.
struct ActivityStamp: ~Copyable {
    static let notRunning = UInt64.max
    private let word = Atomic<UInt64>(ActivityStamp.notRunning)

    @inline(__always)
    func set(_ value: UInt64) { word.store(value, ordering: .relaxed) }

    func activity(now: UInt64) -> LoopActivity {
        switch word.load(ordering: .relaxed) {
        case 0: return .waiting
        case Self.notRunning: return .notRunning
        case let stamp: return .dispatching(for: Duration(nanoseconds: now > stamp ? now - stamp : 0))
        }
    }
}

extension EventLoop {
    /// What the loop is doing right now. Any thread; a few nanoseconds (one atomic load and a
    /// clock read). See `LoopActivity`.
    public var activity: LoopActivity { activityStamp.activity(now: timeSource.now()) }
}
