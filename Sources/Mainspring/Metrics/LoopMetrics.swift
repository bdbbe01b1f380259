/// A snapshot of what a loop has done since it was created: how often it polled and dispatched,
/// how much time each priority used, how long ready work waited, and how often it stalled.
public struct LoopMetrics: Sendable {
    /// Dispatch passes (one after every poll).
    public var iterations: Int
    /// `event_base_loop` calls.
    public var polls: Int
    /// Times the loop was woken through its eventfd (cross-thread posts to a sleeping loop, `stop`).
    public var wakeups: Int
    /// Closures posted from other threads and taken by the loop.
    public var remoteItems: Int
    /// Callbacks run, by priority.
    public var callbacks: [Priority: Int]
    /// Time spent in callbacks, by priority (nested spins are counted once, in the inner callbacks).
    public var busyTime: [Priority: Duration]
    /// How long records waited between becoming ready (posted, fired) and starting, by priority.
    /// Empty when `Configuration.collectsMetrics` is off.
    public var queueWait: [Priority: LatencyHistogram]
    /// Callbacks longer than `Configuration.stallThreshold`.
    public var stalls: Int
    /// The longest stall (zero when there was none).
    public var longestStall: Duration
    /// The longest single callback.
    public var longestCallback: Duration
    /// Work that was queued but never ran because the loop was shut down or freed.
    public var droppedAtShutdown: Int
    /// Sources ended because the loop could not register their event again (`event_add`
    /// failed: a descriptor closed behind the loop's back, out of memory). Each was told: a
    /// connection closes with `.error(errno)`, a line reader delivers `.error(errno)`, a plain
    /// watcher is cancelled. Normally 0.
    public var sourceFailures: Int = 0

    /// All callbacks, whatever their priority.
    public var totalCallbacks: Int { callbacks.values.reduce(0, +) }

    /// All busy time, whatever the priority.
    public var totalBusyTime: Duration { busyTime.values.reduce(.zero, +) }

    /// Cross-thread items per eventfd wake-up (0 when the loop was never woken).
    public var itemsPerWakeup: Double { wakeups == 0 ? 0 : Double(remoteItems) / Double(wakeups) }
}

/// The loop's live counters. Loop thread only; `snapshot()` makes the public value.
struct LoopCounters {
    var iterations = 0
    var polls = 0
    var wakeups = 0
    var remoteItems = 0
    var droppedAtShutdown = 0
    var sourceFailures = 0
    var stalls = 0
    var longestStall: UInt64 = 0
    var longestCallback: UInt64 = 0
    private var callbacks = PerPriority(repeating: 0)
    private var busy = PerPriority<UInt64>(repeating: 0)
    /// Queue-wait histograms, one series per priority (`Priority.queueIndex`); raw storage, so a
    /// record costs no uniqueness or bounds check. `nil` when metrics are off.
    private let waits: HistogramCells?
    let collectsQueueWait: Bool

    init(collectsQueueWait: Bool) {
        self.collectsQueueWait = collectsQueueWait
        waits = collectsQueueWait ? HistogramCells(series: 3) : nil
    }

    @inline(__always)
    mutating func record(priority: Priority, own: UInt64, waited: UInt64) {
        callbacks.update(priority) { $0 &+= 1 }
        busy.update(priority) { $0 &+= own }
        if let waits { waits.record(waited, series: priority.queueIndex) }
        if own > longestCallback { longestCallback = own }
    }

    mutating func recordStall(_ duration: UInt64) {
        stalls += 1
        if duration > longestStall { longestStall = duration }
    }

    func snapshot() -> LoopMetrics {
        let waitByPriority = waits.map { waits in
            PerPriority { waits.histogram($0.queueIndex) }.dictionary { $0 }
        }
        return LoopMetrics(
            iterations: iterations, polls: polls, wakeups: wakeups, remoteItems: remoteItems,
            callbacks: callbacks.dictionary { $0 },
            busyTime: busy.dictionary { Duration(nanoseconds: $0) },
            queueWait: waitByPriority ?? [:], stalls: stalls, longestStall: Duration(nanoseconds: longestStall),
            longestCallback: Duration(nanoseconds: longestCallback), droppedAtShutdown: droppedAtShutdown,
            sourceFailures: sourceFailures)
    }
}
