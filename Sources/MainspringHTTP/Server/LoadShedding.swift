import MainspringCore
import Synchronization

extension HTTPServer {
    /// Load shedding: under more requests than the server can serve, answer the excess `503`
    /// at once instead of queueing it until its clients have given up — work done for nobody.
    ///
    /// The signal is the one Mainspring measures exactly: how long each request waited on its
    /// loop between being read and its handler starting (its queue wait, on the loop's clock);
    /// and, for handlers that hand their work to a `Feeder`, how long that work waits to start
    /// (`watchedFeeders`).
    /// Each loop keeps the 99th percentile of its requests' waits over a short `window`; while
    /// the last full window's p99 is above `queueWaitTarget`, requests get `503 Service
    /// Unavailable` with `Retry-After` before they are routed — except those for `neverShed`
    /// paths (health and metrics), which are always served. A request that waited longer than
    /// `requestDeadline` is answered `503` instead of run, whatever the percentile: its client
    /// has most likely given up already.
    ///
    /// The counters are in `HTTPServerStatistics.Snapshot.requestsShed` and
    /// `.requestsPastDeadline`, and on `/metrics` as `mainspring_http_requests_shed_total`.
    ///
    /// Cost: one clock read when a request is read and one when it is dispatched, and a few
    /// integer operations; nothing when shedding is off (`Configuration.loadShedding` nil).
    /// A request with a body is shed as soon as its head is in, its body never read (the
    /// connection then closes); one without, when it is about to be routed (its head is all
    /// there is to read): a shed request costs its parsing, not its handler.
    public struct LoadShedding: Sendable, Equatable {
        /// The p99 queue wait over a window above which requests are shed. Default 50 ms.
        public var queueWaitTarget: Duration
        /// The window the p99 is taken over; the decision holds for the next window. Default
        /// 100 ms.
        public var window: Duration
        /// The `Retry-After` of a shed response, in seconds. Default 1.
        public var retryAfterSeconds: Int
        /// A request that waited longer than this before its handler would start is answered
        /// `503` instead; nil for no deadline. Default nil.
        public var requestDeadline: Duration?
        /// Paths that are never shed nor refused for their deadline (exact matches).
        /// Default `/healthz`, `/readyz` and `/metrics`.
        public var neverShed: Set<String>
        /// Feeders whose backlog counts as their loop's lag: while the job that has waited
        /// longest on a request's loop's feeder (`Feeder.oldestPendingJobWait`) has waited more
        /// than `queueWaitTarget`, requests on that loop are shed as when the queue wait is over
        /// it. Handlers that hand their work to a feeder need this: the loop runs input first,
        /// so their requests are routed at once and the queue wait stays short while the work
        /// piles up in the feeder. Default none. Costs a look at the feeder per request.
        public var watchedFeeders: [Feeder]

        /// Shedding with a target of `queueWaitTarget`. The durations are periods: zero or
        /// negative stops the program with a message naming them when a server is made.
        public init(queueWaitTarget: Duration = .milliseconds(50), window: Duration = .milliseconds(100),
                    retryAfterSeconds: Int = 1, requestDeadline: Duration? = nil,
                    neverShed: Set<String> = ["/healthz", "/readyz", "/metrics"], watchedFeeders: [Feeder] = [])
        {
            self.queueWaitTarget = queueWaitTarget
            self.window = window
            self.retryAfterSeconds = retryAfterSeconds
            self.requestDeadline = requestDeadline
            self.neverShed = neverShed
            self.watchedFeeders = watchedFeeders
        }

        /// Equal settings: the same values and the same feeders (by identity).
        public static func == (lhs: LoadShedding, rhs: LoadShedding) -> Bool {
            lhs.queueWaitTarget == rhs.queueWaitTarget && lhs.window == rhs.window
                && lhs.retryAfterSeconds == rhs.retryAfterSeconds && lhs.requestDeadline == rhs.requestDeadline
                && lhs.neverShed == rhs.neverShed && lhs.watchedFeeders.count == rhs.watchedFeeders.count
                && zip(lhs.watchedFeeders, rhs.watchedFeeders).allSatisfy { $0 === $1 }
        }
    }
}

/// A route's concurrency limit (`HTTPRoutes.limitConcurrency`): requests in flight over all
/// loops, an atomic count.
final class ConcurrencyLimit: Sendable {
    let limit: Int
    private let inFlight = Atomic<Int>(0)

    init(_ limit: Int) { self.limit = limit }

    /// Takes a place; false (taking none) when all `limit` are taken.
    func enter() -> Bool {
        if inFlight.add(1, ordering: .relaxed).newValue <= limit { return true }
        inFlight.subtract(1, ordering: .relaxed)
        return false
    }

    /// Gives a place back.
    func leave() { inFlight.subtract(1, ordering: .relaxed) }
}

/// One loop's view of its requests' queue waits: whether the p99 of the last full window was
/// over the target — exactly, without a histogram: the p99 of a window is over the target when
/// more than 1% of its waits are. Pure state, no clock of its own: `record` gets the instants.
/// Loop thread only.
struct QueueWaitGauge {
    let target: UInt64
    let window: UInt64
    /// Whether the last full window's p99 was over the target.
    private(set) var isOverTarget = false
    private var windowStart: UInt64 = 0
    private var hasStarted = false
    private var count = 0
    private var over = 0

    init(target: Duration, window: Duration) {
        self.target = target.clampedNanoseconds
        self.window = max(1, window.clampedNanoseconds)
    }

    /// Records a request that waited `wait` ns, dispatched at `now` (ns on the loop's clock).
    /// A window that ended before `now` is closed first, so what a caller reads next is always
    /// the last full window's verdict. After a gap with no request the next window starts now
    /// and the verdict is "under".
    mutating func record(wait: UInt64, now: UInt64) {
        closeWindow(ifEndedBy: now)
        count += 1
        if wait > target { over += 1 }
    }

    /// The last full window's verdict as of `now`, without a sample: a window that has ended
    /// is closed first. For decisions on requests that are never dispatched (shed before their
    /// body): without this, a verdict of "over" would hold for as long as only such requests
    /// came, the overload long gone.
    mutating func verdict(now: UInt64) -> Bool {
        closeWindow(ifEndedBy: now)
        return isOverTarget
    }

    /// Closes the current window if it ended before `now`; after a gap with no request the
    /// next window starts now and the verdict is "under".
    private mutating func closeWindow(ifEndedBy now: UInt64) {
        guard hasStarted else {
            hasStarted = true
            windowStart = now
            return
        }
        let elapsed = now &- windowStart
        guard elapsed >= window else { return }
        // A window that ended a whole window ago or more says nothing of now: no request
        // came meanwhile, so none was waiting.
        isOverTarget = count > 0 && elapsed < 2 &* window && over &* 100 > count
        windowStart = now
        count = 0
        over = 0
    }
}
