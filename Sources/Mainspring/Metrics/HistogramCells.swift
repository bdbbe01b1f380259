/// Live `LatencyHistogram` counters for a fixed number of series (one per priority), in one
/// `CounterBlock` allocated at creation.
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
    private static let statistics = LatencyHistogram.bucketCount
    private let cells: CounterBlock
    let seriesCount: Int

    init(series: Int) {
        seriesCount = series
        cells = CounterBlock(count: series * Self.stride)
        for s in 0..<series { cells[s * Self.stride + Self.statistics + 2] = .max }  // minimum
    }

    /// Records `value` (ns) in series `series`. O(1), no allocation, no checks (the series index
    /// comes from `Priority.queueIndex`, always below `seriesCount`).
    @inline(__always)
    func record(_ value: UInt64, series: Int) {
        let base = series &* Self.stride
        cells[base &+ LatencyHistogram.index(of: value)] &+= 1
        let stats = base &+ Self.statistics
        cells[stats] &+= 1
        cells[stats &+ 1] &+= value
        if value < cells[stats &+ 2] { cells[stats &+ 2] = value }
        if value > cells[stats &+ 3] { cells[stats &+ 3] = value }
    }

    /// An independent copy of series `series`.
    /// - Complexity: O(number of buckets): one 20 KB copy.
    func histogram(_ series: Int) -> LatencyHistogram {
        let base = series * Self.stride
        let stats = base + Self.statistics
        return LatencyHistogram(
            buckets: cells.copy(base..<stats),
            count: Int(cells[stats]), sum: cells[stats + 1], minimum: cells[stats + 2], maximum: cells[stats + 3])
    }
}
