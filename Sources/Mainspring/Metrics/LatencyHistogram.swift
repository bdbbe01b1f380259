/// A log-linear histogram of durations: constant memory, mergeable, O(1) recording without
/// allocation, percentiles within 1% relative error.
///
/// Values are nanoseconds. Below 64 ns each value has its own bucket; above, every power of two
/// is split into 64 equal buckets, so a bucket is at most 1/64 of its lower bound wide and its
/// midpoint is within 0.78% of any value in it. Values from 2^44 ns (about 4.9 hours) up share
/// the last bucket. Memory: 2,496 counters (about 20 KB), allocated once at creation.
public struct LatencyHistogram: Sendable, Equatable {
    private static let subBucketBits = 6
    private static let subBuckets = 1 << subBucketBits  // 64
    private static let maxExponent = 43                    // values < 2^44 ns are exact to 1/64
    static let bucketCount = subBuckets + (maxExponent - subBucketBits + 1) * subBuckets

    private var buckets: [UInt64]
    /// How many durations were recorded.
    public private(set) var count: Int = 0
    private var sum: UInt64 = 0
    private var minimum: UInt64 = .max
    private var maximum: UInt64 = 0

    /// An empty histogram.
    public init() {
        buckets = [UInt64](repeating: 0, count: Self.bucketCount)
    }

    /// A histogram made of counters kept elsewhere (the loop's `HistogramCells`).
    init(buckets: [UInt64], count: Int, sum: UInt64, minimum: UInt64, maximum: UInt64) {
        precondition(buckets.count == Self.bucketCount, "LatencyHistogram: wrong bucket count")
        self.buckets = buckets
        self.count = count
        self.sum = sum
        self.minimum = count == 0 ? .max : minimum
        self.maximum = maximum
    }

    /// Records one duration (negative durations count as zero). O(1), no allocation (unless
    /// this copy shares its storage with another, as after a snapshot: then it copies once).
    public mutating func record(_ duration: Duration) {
        record(nanoseconds: duration.clampedNanoseconds)
    }

    @inline(__always)
    mutating func record(nanoseconds value: UInt64) {
        buckets[Self.index(of: value)] &+= 1
        count &+= 1
        sum &+= value
        if value < minimum { minimum = value }
        if value > maximum { maximum = value }
    }

    /// The bucket of `value` (ns).
    @inline(__always)
    static func index(of value: UInt64) -> Int {
        if value < UInt64(subBuckets) { return Int(value) }
        let exponent = Swift.min(63 - value.leadingZeroBitCount, maxExponent + 1)
        if exponent > maxExponent { return bucketCount - 1 }
        let shift = exponent - subBucketBits
        let mantissa = Int(value >> UInt64(shift))  // in 64..<128
        return subBuckets + shift * subBuckets + (mantissa - subBuckets)
    }

    /// The midpoint of bucket `index`, in nanoseconds.
    private static func representative(ofBucket index: Int) -> UInt64 {
        if index < subBuckets { return UInt64(index) }
        let shift = (index - subBuckets) / subBuckets
        let mantissa = UInt64(subBuckets + (index - subBuckets) % subBuckets)
        let low = mantissa << UInt64(shift)
        return low + (UInt64(1) << UInt64(shift)) / 2
    }

    /// The duration below or at which a fraction `p` (0...1) of the recorded durations lie:
    /// `percentile(0.99)` is the p99. Exact at 0 (the minimum) and 1 (the maximum), within 1%
    /// elsewhere. Zero when empty.
    /// - Complexity: O(number of buckets), about 2,500 steps.
    public func percentile(_ p: Double) -> Duration {
        guard count > 0 else { return .zero }
        let fraction = p.isNaN ? 0 : Swift.min(Swift.max(p, 0), 1)
        if fraction <= 0 { return Duration(nanoseconds: minimum) }
        if fraction >= 1 { return Duration(nanoseconds: maximum) }
        let rank = Swift.max(1, Int((fraction * Double(count)).rounded(.up)))
        var seen = 0
        for (index, n) in buckets.enumerated() where n > 0 {
            seen += Int(n)
            if seen >= rank {
                let value = Self.representative(ofBucket: index)
                return Duration(nanoseconds: Swift.min(Swift.max(value, minimum), maximum))
            }
        }
        return Duration(nanoseconds: maximum)
    }

    /// The longest recorded duration (zero when empty).
    public var max: Duration { Duration(nanoseconds: count == 0 ? 0 : maximum) }

    /// The shortest recorded duration (zero when empty).
    public var min: Duration { Duration(nanoseconds: count == 0 ? 0 : minimum) }

    /// The mean of the recorded durations (zero when empty).
    public var mean: Duration { count == 0 ? .zero : Duration(nanoseconds: sum / UInt64(count)) }

    /// The sum of the recorded durations (for a Prometheus histogram's `_sum`).
    public var total: Duration { Duration(nanoseconds: sum) }

    /// For each bound (in ascending order), how many recorded durations are at or below it: the
    /// cumulative counts of a Prometheus histogram's `_bucket{le=…}` series. A bucket of this
    /// histogram counts as at or below a bound when its upper edge is, so a count may leave out
    /// values up to one bucket width (1/64 of the value) under the bound. Non-decreasing.
    /// - Complexity: one pass over the buckets, whatever the number of bounds.
    public func cumulativeCounts(atOrBelow bounds: [Duration]) -> [Int] {
        var counts = [Int](repeating: 0, count: bounds.count)
        guard count > 0, !bounds.isEmpty else { return counts }
        let limits = bounds.map(\.clampedNanoseconds)
        var boundIndex = 0
        var seen = 0
        for index in buckets.indices {
            let upper = Self.upperEdge(ofBucket: index)
            while boundIndex < limits.count && upper > limits[boundIndex] {
                counts[boundIndex] = seen
                boundIndex += 1
            }
            if boundIndex == limits.count { break }
            seen += Int(buckets[index])
        }
        while boundIndex < limits.count {
            counts[boundIndex] = seen
            boundIndex += 1
        }
        // Monotonic even for unsorted bounds.
        for i in counts.indices.dropFirst() where counts[i] < counts[i - 1] { counts[i] = counts[i - 1] }
        return counts
    }

    /// The largest value (ns) that falls into bucket `index`.
    private static func upperEdge(ofBucket index: Int) -> UInt64 {
        if index < subBuckets { return UInt64(index) }
        if index == bucketCount - 1 { return .max }
        let shift = (index - subBuckets) / subBuckets
        let mantissa = UInt64(subBuckets + (index - subBuckets) % subBuckets)
        return ((mantissa + 1) << UInt64(shift)) - 1
    }

    /// Adds every duration recorded in `other` to this histogram.
    /// - Complexity: O(number of buckets).
    public mutating func merge(_ other: LatencyHistogram) {
        guard other.count > 0 else { return }
        for index in other.buckets.indices where other.buckets[index] > 0 {
            buckets[index] &+= other.buckets[index]
        }
        count += other.count
        sum &+= other.sum
        minimum = Swift.min(minimum, other.minimum)
        maximum = Swift.max(maximum, other.maximum)
    }
}
