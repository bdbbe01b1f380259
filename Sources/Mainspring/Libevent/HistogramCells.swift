// Raw storage for the loop's live queue-wait histograms. It lives here because it is the only
// kind of code allowed to hold raw pointers (see EventBase.swift).

/// Live `LatencyHistogram` counters for a fixed number of series (one per priority), in one block
/// of raw memory allocated at creation and freed in `deinit`.
///
/// Why not three `LatencyHistogram` values: recording into an array stored in a struct stored in
/// the loop costs a uniqueness check (and a bounds check) on every callback, and the public
/// snapshot shares the array, so the next record copies 20 KB. Here a record is a handful of
/// instructions on memory that only the loop's thread touches, and `histogram(_:)` copies the
/// counters out into an independent value.
///
/// Not thread-safe: the owning loop's thread only.
final class HistogramCells {
    /// Counters per series: the buckets, then count, sum, minimum, maximum.
    private static let stride = LatencyHistogram.bucketCount + 4
    private let cells: UnsafeMutablePointer<UInt64>
    let seriesCount: Int

    init(series: Int) {
        seriesCount = series
        let total = series * Self.stride
        cells = UnsafeMutablePointer<UInt64>.allocate(capacity: total)
        cells.initialize(repeating: 0, count: total)
        for s in 0..<series { cells[s * Self.stride + LatencyHistogram.bucketCount + 2] = .max }  // minimum
    }

    deinit {
        cells.deinitialize(count: seriesCount * Self.stride)
        cells.deallocate()
    }

    /// Records `value` (ns) in series `series`. O(1), no allocation, no checks (the series index
    /// comes from `Priority.queueIndex`, always below `seriesCount`).
    @inline(__always)
    func record(_ value: UInt64, series: Int) {
        let base = cells + series &* Self.stride
        base[LatencyHistogram.index(of: value)] &+= 1
        let stats = base + LatencyHistogram.bucketCount
        stats[0] &+= 1
        stats[1] &+= value
        if value < stats[2] { stats[2] = value }
        if value > stats[3] { stats[3] = value }
    }

    /// An independent copy of series `series`.
    /// - Complexity: O(number of buckets): one 20 KB copy.
    func histogram(_ series: Int) -> LatencyHistogram {
        let base = cells + series * Self.stride
        let stats = base + LatencyHistogram.bucketCount
        return LatencyHistogram(
            buckets: Array(UnsafeBufferPointer(start: base, count: LatencyHistogram.bucketCount)),
            count: Int(stats[0]), sum: stats[1], minimum: stats[2], maximum: stats[3])
    }
}
