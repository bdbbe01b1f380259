extension EventLoop {
    /// How a loop balances input, normal work and background work, and what it measures.
    ///
    /// The defaults suit interactive programs and daemons: input waits at most about one poll
    /// interval behind other work, and `.background` work keeps a quarter of a saturated loop
    /// (`Scheduler` explains the rules these settings tune). Its three durations are periods:
    /// a loop made with one that is zero or negative stops the program with a message naming it
    /// (see <doc:Durations>). `backgroundShare` is clamped to `0...0.9`.
    public struct Configuration: Sendable, Equatable {
        /// The longest the loop dispatches ready work before it polls for new I/O again. An input
        /// event therefore waits at most this long plus the one callback in progress.
        /// Shorter means snappier input and more `epoll_wait` calls. Default 2 ms.
        public var pollInterval: Duration

        /// The share of the loop's busy time that `.background` work is guaranteed while
        /// higher-priority work keeps the loop saturated (0...0.9). Default 0.25.
        public var backgroundShare: Double

        /// The longest a ready `.background` item waits while higher-priority work runs; past
        /// that it runs next. Default 100 ms.
        public var maxStarvation: Duration

        /// A callback that runs longer than this is counted as a stall in `LoopMetrics`.
        /// Default 50 ms.
        public var stallThreshold: Duration

        /// Whether the loop records per-callback metrics (queue-wait histograms; the busy time
        /// and counters are always kept). Costs one clock read per cross-thread post. Default on.
        public var collectsMetrics: Bool

        /// Creates a configuration; every parameter has the documented default.
        public init(
            pollInterval: Duration = .milliseconds(2),
            backgroundShare: Double = 0.25,
            maxStarvation: Duration = .milliseconds(100),
            stallThreshold: Duration = .milliseconds(50),
            collectsMetrics: Bool = true
        ) {
            self.pollInterval = pollInterval
            self.backgroundShare = backgroundShare
            self.maxStarvation = maxStarvation
            self.stallThreshold = stallThreshold
            self.collectsMetrics = collectsMetrics
        }
    }
}
