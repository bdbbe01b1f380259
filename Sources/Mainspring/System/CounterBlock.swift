/// A fixed block of `UInt64` counters in raw memory, allocated zeroed at creation and freed in
/// `deinit`: reads and writes are a load or a store, with no uniqueness or bounds check (the
/// caller keeps indexes below `count`). What the loop's live histograms are kept in.
///
/// Not thread-safe: one thread uses it (the owning loop's).
final class CounterBlock {
    private let cells: UnsafeMutablePointer<UInt64>
    let count: Int

    init(count: Int) {
        self.count = count
        cells = UnsafeMutablePointer<UInt64>.allocate(capacity: count)
        cells.initialize(repeating: 0, count: count)
    }

    deinit {
        cells.deinitialize(count: count)
        cells.deallocate()
    }

    /// The counter at `index` (below `count`; not checked).
    @inline(__always)
    subscript(index: Int) -> UInt64 {
        get { cells[index] }
        set { cells[index] = newValue }
    }

    /// The counters `range` as an array (a copy).
    /// - Complexity: O(`range.count`).
    func copy(_ range: Range<Int>) -> [UInt64] {
        Array(UnsafeBufferPointer(start: cells + range.lowerBound, count: range.count))
    }
}
