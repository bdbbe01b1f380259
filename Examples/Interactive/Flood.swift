import Mainspring

/// `--naive`: every chunk posted up front; what ran, timed the way `FeedJob.statistics` is.
struct Flood {
    let posted: Int
    /// Posted chunks that have not run yet.
    var remaining: Int
    /// Set by `cancel`: the chunks still queued run, but do nothing.
    var isCancelled = false
    private(set) var chunks = 0
    private var firstStart: ContinuousClock.Instant?
    private var lastEnd: ContinuousClock.Instant?
    private var chunkTime = Duration.zero
    private var longestGap = Duration.zero

    init(posted: Int) {
        self.posted = posted
        remaining = posted
    }

    mutating func record(start: ContinuousClock.Instant, end: ContinuousClock.Instant) {
        if let lastEnd { longestGap = max(longestGap, start - lastEnd) }
        if firstStart == nil { firstStart = start }
        lastEnd = end
        chunkTime += end - start
        chunks += 1
    }

    var statistics: FeedJob.Statistics {
        let elapsed = firstStart.flatMap { first in lastEnd.map { $0 - first } } ?? .zero
        return FeedJob.Statistics(chunks: chunks, elapsed: elapsed, chunkTime: chunkTime, longestGap: longestGap,
                                  turns: chunks)
    }
}
