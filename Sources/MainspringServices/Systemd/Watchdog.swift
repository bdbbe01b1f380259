import Foundation
import Synchronization
import MainspringCore

/// Feeds the service manager's watchdog (`WatchdogSec=`, `sd_watchdog_enabled(3)`) only while a
/// set of loops is healthy, so that a wedged loop gets the service restarted.
///
/// A plain timer that pings the manager proves only that the timer's thread runs. A Mainspring
/// loop knows more: whether it is polling, and for how long the callback in progress has kept
/// it from polling (`EventLoop.activity`). The watchdog sends `WATCHDOG=1` every half
/// ``interval`` — but only when every watched loop is waiting for events or has polled within
/// ``stallThreshold``. A loop stuck in a callback (a blocking call, a computation that should
/// have been fed in slices, a deadlock) stops the pings, and the manager restarts the service
/// once ``interval`` passes without one; a loop that recovers in time resumes them. A loop that
/// is not running (stopped, or its thread gone) counts as stuck; one that has not started yet
/// when the watchdog starts (an `EventLoopGroup`'s threads may still be starting) gets one
/// interval to start.
///
/// ```swift
/// let notifier = try ServiceNotifier()
/// let watchdog = try Watchdog.startIfRequested(watching: group.loops, notifier: notifier)
/// // … serve …
/// watchdog?.stop()
/// ```
///
/// The watchdog runs on a thread of its own, never on a watched loop, so a stuck loop cannot
/// hide itself by also stopping the check. It starts when created and pings at once if the loops
/// are healthy. Any thread may read its state or stop it. Cost: one thread, asleep except for one
/// wake-up per half interval, which reads one atomic per loop and sends one datagram.
public final class Watchdog: Sendable {
    /// What the last check found.
    public enum Health: Sendable, Equatable, CustomStringConvertible {
        /// Every watched loop is waiting for events or polled within the threshold.
        case healthy
        /// The first loop found stuck (its index in ``Watchdog/loops``) and what it was doing:
        /// dispatching for longer than the threshold, or not running.
        case unresponsive(loopIndex: Int, activity: LoopActivity)

        /// Whether pings are being sent.
        public var isHealthy: Bool { self == .healthy }

        public var description: String {
            switch self {
            case .healthy: return "healthy"
            case .unresponsive(let index, let activity): return "loop \(index) is stuck: \(activity)"
            }
        }
    }

    /// What the watchdog has done so far.
    public struct Counters: Sendable, Equatable {
        /// `WATCHDOG=1` datagrams sent.
        public var pingsSent = 0
        /// Checks that found a loop stuck, so sent nothing.
        public var pingsWithheld = 0
        /// Pings that could not be sent (the manager's socket was gone or full).
        public var pingsFailed = 0
        /// Why the last failed ping failed.
        public var lastFailure: EventLoopError?
    }

    /// The watched loops.
    public let loops: [EventLoop]
    /// The manager's timeout: it restarts the service after this long without a ping.
    public let interval: Duration
    /// How often the loops are checked and, when healthy, a ping is sent: half the interval.
    public let pingInterval: Duration
    /// How long a loop may go without polling (stuck in one callback) before pings stop.
    public let stallThreshold: Duration

    private let state: WatchdogState

    /// Starts watching `loops` and pinging the manager through `notifier` every half
    /// `interval`, on a thread of its own.
    ///
    /// - Parameters:
    ///   - loops: the loops whose health the pings vouch for: typically an
    ///     `EventLoopGroup`'s `EventLoopGroup.loops`, and any other loop the service relies
    ///     on. A loop that has not run yet gets one `interval` to start; after that, and once a
    ///     loop that ran has stopped, a loop that is not running counts as stuck. An empty list
    ///     makes the watchdog a plain pinger.
    ///   - notifier: where the pings go (a disabled notifier sends nothing, but the loops are
    ///     still checked and ``health`` kept up to date).
    ///   - interval: the manager's watchdog timeout (``requestedInterval(environment:)``);
    ///     must be positive (precondition).
    ///   - stallThreshold: how long a loop may go without polling before the pings stop;
    ///     default (nil) half of `interval`; capped at `interval`; must be positive
    ///     (precondition). With the default, a loop stuck for about 1.5 `interval` gets the
    ///     service restarted, while a callback that runs for a second under a 30-second
    ///     watchdog is tolerated.
    ///   - onHealthChange: called on the watchdog's thread when the loops become unhealthy (with
    ///     the stuck loop) and when they are healthy again — not on every check — before the ping
    ///     of the check that found the change. Keep it short: the ping waits for it. It may call
    ///     ``stop()`` (then no further ping is sent).
    public init(watching loops: [EventLoop], notifier: ServiceNotifier, interval: Duration,
                stallThreshold: Duration? = nil, onHealthChange: (@Sendable (Health) -> Void)? = nil)
    {
        requireUsage(interval > .zero, "Mainspring: Watchdog interval must be positive, not \(interval)")
        let threshold = min(stallThreshold ?? interval / 2, interval)
        requireUsage(threshold > .zero, "Mainspring: Watchdog stall threshold must be positive, not \(threshold)")
        self.loops = loops
        self.interval = interval
        self.pingInterval = max(interval / 2, .microseconds(500))
        self.stallThreshold = threshold
        state = WatchdogState(loops: loops, notifier: notifier, pingInterval: pingInterval, threshold: threshold,
                              startGrace: interval, onHealthChange: onHealthChange)
        let state = self.state
        let thread = Thread { state.run() }
        thread.name = "mainspring.watchdog"
        thread.start()
    }

    /// Starts a watchdog over `loops` if the environment asks for one (see
    /// ``requestedInterval(environment:)``) and `notifier` is enabled; nil otherwise.
    ///
    /// - Throws: `ServiceEnvironmentError` when `WATCHDOG_USEC` or `WATCHDOG_PID` is malformed.
    public static func startIfRequested(
        watching loops: [EventLoop], notifier: ServiceNotifier,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        stallThreshold: Duration? = nil, onHealthChange: (@Sendable (Health) -> Void)? = nil
    ) throws(ServiceEnvironmentError) -> Watchdog? {
        guard notifier.isEnabled, let interval = try requestedInterval(environment: environment) else { return nil }
        return Watchdog(watching: loops, notifier: notifier, interval: interval, stallThreshold: stallThreshold,
                        onHealthChange: onHealthChange)
    }

    /// The watchdog timeout the service manager asks this process to honour: `$WATCHDOG_USEC`
    /// microseconds, or nil when it is not set or when `$WATCHDOG_PID` is set to another
    /// process's id (the variables were inherited from a parent they were meant for).
    ///
    /// - Throws: `ServiceEnvironmentError.invalidValue(variable:value:expected:)` when
    ///   `WATCHDOG_USEC` is not a whole number of microseconds from 1 to 2^64 - 2 (`abc`, `0`,
    ///   `-5`, an overflowing number), or `WATCHDOG_PID` is not a process id.
    public static func requestedInterval(environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ServiceEnvironmentError) -> Duration?
    {
        guard let text = environment["WATCHDOG_USEC"] else { return nil }
        if let pidText = environment["WATCHDOG_PID"] {
            guard let pid = Int32(pidText), pid > 0 else {
                throw .invalidValue(variable: "WATCHDOG_PID", value: pidText, expected: "a process id (a positive number)")
            }
            if pid != currentProcessID() { return nil }
        }
        guard let microseconds = UInt64(text), microseconds > 0, microseconds < UInt64.max else {
            throw .invalidValue(variable: "WATCHDOG_USEC", value: text,
                                expected: "a whole number of microseconds from 1 to \(UInt64.max - 1)")
        }
        return .microseconds(Int64(clamping: microseconds))
    }

    /// What the last check found. Any thread.
    public var health: Health { state.health.withLock { $0 } }

    /// What the watchdog has done so far. Any thread.
    public var counters: Counters { state.counters.withLock { $0 } }

    /// Whether the watchdog still runs.
    public var isRunning: Bool { !state.stopRequested.load(ordering: .acquiring) }

    /// Stops the checks and the pings. Once it returns, no ping is sent any more (unless it is
    /// called from `onHealthChange`, on the watchdog's own thread: then the thread ends right
    /// after the callback). Idempotent; any thread. Stop the watchdog before you stop the
    /// loops, or the loops stop the pings first.
    public func stop() { state.stop() }

    deinit { state.stop() }
}

/// The watchdog's thread and what it shares with other threads.
private final class WatchdogState: Sendable {
    let loops: [EventLoop]
    let notifier: ServiceNotifier
    let pingNanoseconds: UInt64
    let threshold: Duration
    /// How long a loop that has not run yet may take to start.
    let startGraceNanoseconds: UInt64
    let onHealthChange: (@Sendable (Watchdog.Health) -> Void)?
    let health = Protected<Watchdog.Health>(.healthy)
    let counters = Protected(Watchdog.Counters())
    let stopRequested = Atomic<Bool>(false)
    /// `currentThreadID()` of the watchdog's thread, once it runs.
    private let threadID = Atomic<UInt>(0)
    private let wakeUp = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    init(loops: [EventLoop], notifier: ServiceNotifier, pingInterval: Duration, threshold: Duration,
         startGrace: Duration, onHealthChange: (@Sendable (Watchdog.Health) -> Void)?)
    {
        self.loops = loops
        self.notifier = notifier
        self.pingNanoseconds = pingInterval.clampedNanoseconds
        self.threshold = threshold
        self.startGraceNanoseconds = startGrace.clampedNanoseconds
        self.onHealthChange = onHealthChange
    }

    func run() {
        threadID.store(currentThreadID(), ordering: .releasing)
        defer { finished.signal() }
        var wasHealthy = true
        // Real time: the service manager kills in real time, so its pings keep real time (a
        // simulated loop's activity is read as any loop's; its stalls are virtual).
        let start = monotonicNanoseconds()
        var next = start
        // Which loops have been seen running; only the watchdog's thread touches it.
        var seenRunning = [Bool](repeating: false, count: loops.count)
        while !stopRequested.load(ordering: .acquiring) {
            let starting = monotonicNanoseconds() &- start < startGraceNanoseconds
            let found = check(seenRunning: &seenRunning, starting: starting)
            health.withLock { $0 = found }
            // The change is reported before the ping it allows (or the first one withheld), so
            // whoever sees a ping after a recovery has seen the change too.
            if found.isHealthy != wasHealthy {
                wasHealthy = found.isHealthy
                onHealthChange?(found)
                if stopRequested.load(ordering: .acquiring) { break }
            }
            if found.isHealthy {
                do throws(EventLoopError) {
                    try notifier.notify(.watchdog)
                    counters.withLock { $0.pingsSent += 1 }
                } catch {
                    counters.withLock {
                        $0.pingsFailed += 1
                        $0.lastFailure = error
                    }
                }
            } else {
                counters.withLock { $0.pingsWithheld += 1 }
            }
            // The next check on a fixed grid; ticks missed (a descheduled thread) are skipped.
            let now = monotonicNanoseconds()
            next &+= pingNanoseconds
            if next <= now { next = now &+ pingNanoseconds }
            let wait = DispatchTime.now() + .nanoseconds(Int(clamping: next - now))
            if wakeUp.wait(timeout: wait) == .success { break }
        }
    }

    /// The first stuck loop, or `.healthy`. While `starting`, a loop that has never been seen
    /// running is given time to start.
    private func check(seenRunning: inout [Bool], starting: Bool) -> Watchdog.Health {
        var found = Watchdog.Health.healthy
        for (index, loop) in loops.enumerated() {
            let activity = loop.activity
            if activity != .notRunning { seenRunning[index] = true }
            if activity == .notRunning && starting && !seenRunning[index] { continue }
            if found.isHealthy && !activity.isResponsive(within: threshold) {
                found = .unresponsive(loopIndex: index, activity: activity)
            }
        }
        return found
    }

    func stop() {
        guard !stopRequested.exchange(true, ordering: .acquiringAndReleasing) else {
            waitUnlessOnWatchdogThread()
            return
        }
        wakeUp.signal()
        waitUnlessOnWatchdogThread()
    }

    private func waitUnlessOnWatchdogThread() {
        if threadID.load(ordering: .acquiring) == currentThreadID() { return }
        finished.wait()
        finished.signal()  // for later stop() calls
    }
}
