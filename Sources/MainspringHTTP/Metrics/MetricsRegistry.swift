import MainspringCore
import Synchronization

// Locks here are the core's `Protected` (a pthread mutex), not `Mutex`: ThreadSanitizer does not see `Mutex`'s futex
// as synchronisation (see Protected).

/// The application's own metrics — counters, gauges and histograms, with labels — served on
/// `/metrics` beside the loops' figures, in the Prometheus text format.
///
/// ```swift
/// let metrics = MetricsRegistry()
/// let requests = try metrics.counter("myapp_requests_total", help: "Requests handled.", labels: ["command"])
/// let echo = requests.series("ECHO")          // keep it: its increment is one atomic add
/// echo.increment()
/// let exporter = LoopMetricsExporter(group: group, registry: metrics)
/// routes.serveMetrics(exporter: exporter)      // GET /metrics: the loops', then the application's
/// ```
///
/// Register each metric once (at start-up) and keep what it returns: registering a name again
/// with the same kind, help and labels returns the same metric; with anything else it is an
/// error. Names follow Prometheus (`[a-zA-Z_:][a-zA-Z0-9_:]*`, a counter's ending in `_total`),
/// label names too (`[a-zA-Z_][a-zA-Z0-9_]*`, none starting with `__`, no `le` on a histogram).
///
/// Thread-safe: register, update and render from any thread. An update of a series is one
/// atomic operation (a gauge's: a compare-and-swap loop; a histogram's observation takes a
/// short lock); looking up a labelled series takes a lock, so keep series you update often.
public final class MetricsRegistry: Sendable {
    private let families = Protected<[String: any MetricFamily]>([:])
    private let order = Protected<[String]>([])

    /// An empty registry.
    public init() {}

    /// A counter: a count that only goes up (requests served, bytes sent).
    /// - Throws: `MetricsError` for an invalid name or label, or a name already registered
    ///   otherwise.
    public func counter(_ name: String, help: String, labels: [String] = []) throws(MetricsError) -> Counter {
        guard name.hasSuffix("_total") else { throw .invalidName(name, "a counter's name ends in _total") }
        return try register(Counter(name: name, help: help, labelNames: labels))
    }

    /// A gauge: a value that goes up and down (connections open, queue length).
    /// - Throws: `MetricsError`, as ``counter(_:help:labels:)``.
    public func gauge(_ name: String, help: String, labels: [String] = []) throws(MetricsError) -> Gauge {
        try register(Gauge(name: name, help: help, labelNames: labels))
    }

    /// A histogram: observations counted in buckets by upper bound (`le`), with their sum and
    /// count (request durations in seconds, say). `buckets` are the upper bounds, ascending;
    /// `+Inf` is added.
    /// - Throws: `MetricsError`, as ``counter(_:help:labels:)``, and for bounds that are not
    ///   ascending and finite, or a label named `le`.
    public func histogram(_ name: String, help: String, buckets: [Double] = Histogram.defaultBuckets,
                          labels: [String] = []) throws(MetricsError) -> Histogram
    {
        guard !buckets.isEmpty, buckets.allSatisfy(\.isFinite), zip(buckets, buckets.dropFirst()).allSatisfy({ $0 < $1 }) else {
            throw .invalidBuckets(name)
        }
        guard !labels.contains("le") else { throw .invalidLabel("le", "a histogram's buckets use it") }
        return try register(Histogram(name: name, help: help, labelNames: labels, bounds: buckets))
    }

    private func register<Family: MetricFamily>(_ family: Family) throws(MetricsError) -> Family {
        try Self.check(family.name, family.labelNames)
        let result: Result<Family, MetricsError> = families.withLock { families in
            if let existing = families[family.name] {
                if let same = existing as? Family, same.help == family.help, same.labelNames == family.labelNames,
                   same.sameShape(as: family)
                {
                    return .success(same)
                }
                return .failure(.alreadyRegistered(family.name))
            }
            families[family.name] = family
            order.withLock { $0.append(family.name) }
            return .success(family)
        }
        return try result.get()
    }

    private static func check(_ name: String, _ labels: [String]) throws(MetricsError) {
        func valid(_ text: String, colons: Bool) -> Bool {
            guard let first = text.unicodeScalars.first else { return false }
            func letter(_ s: Unicode.Scalar) -> Bool {
                (s >= "a" && s <= "z") || (s >= "A" && s <= "Z") || s == "_" || (colons && s == ":")
            }
            return letter(first) && text.unicodeScalars.allSatisfy { letter($0) || ($0 >= "0" && $0 <= "9") }
        }
        guard valid(name, colons: true) else { throw .invalidName(name, "use [a-zA-Z_:][a-zA-Z0-9_:]*") }
        for label in labels {
            guard valid(label, colons: false), !label.hasPrefix("__") else {
                throw .invalidLabel(label, "use [a-zA-Z_][a-zA-Z0-9_]*, not starting with __")
            }
        }
        guard Set(labels).count == labels.count else { throw .invalidLabel(labels.joined(separator: ","), "a label is named twice") }
    }

    /// Appends every registered metric, in the order registered.
    func render(into text: inout PrometheusText) {
        let names = order.withLock { $0 }
        let snapshot = families.withLock { families in names.compactMap { families[$0] } }
        for family in snapshot { family.render(into: &text) }
    }
}

/// Why a metric could not be registered.
public enum MetricsError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The metric's name is not valid (the name, and what would be).
    case invalidName(String, String)
    /// A label name is not valid (the label, and why).
    case invalidLabel(String, String)
    /// A histogram's bucket bounds are empty, not finite or not ascending (the metric).
    case invalidBuckets(String)
    /// The name is registered already as another kind of metric, or with other help or labels.
    case alreadyRegistered(String)

    public var description: String {
        switch self {
        case .invalidName(let name, let rule): return "invalid metric name \(name.debugDescription): \(rule)"
        case .invalidLabel(let label, let rule): return "invalid label name \(label.debugDescription): \(rule)"
        case .invalidBuckets(let name): return "histogram \(name): bucket bounds must be finite and ascending"
        case .alreadyRegistered(let name): return "metric \(name) is already registered with another kind, help or labels"
        }
    }
}

/// What every kind of metric has: its name, help, label names and labelled series.
protocol MetricFamily: Sendable, AnyObject {
    var name: String { get }
    var help: String { get }
    var labelNames: [String] { get }
    func sameShape(as other: Self) -> Bool
    func render(into text: inout PrometheusText)
}

extension MetricFamily {
    func sameShape(as other: Self) -> Bool { true }
}

/// A family's series by label values, made on first use. The unlabelled series (no label
/// names) is made at once.
final class SeriesTable<Series: Sendable & AnyObject>: Sendable {
    private let table = Protected<[[String]: Series]>([:])
    private let order = Protected<[[String]]>([])
    private let make: @Sendable () -> Series
    let labelNames: [String]
    let family: String
    /// The family's help text.
    let help: String

    /// The series of a metric without labels (nil with labels): no lookup per update.
    let unlabelled: Series?

    init(family: String, help: String, labelNames: [String], make: @escaping @Sendable () -> Series) {
        self.family = family
        self.help = help
        self.labelNames = labelNames
        self.make = make
        unlabelled = labelNames.isEmpty ? make() : nil
        if let unlabelled {
            table.withLock { $0[[]] = unlabelled }
            order.withLock { $0.append([]) }
        }
    }

    /// The unlabelled series; a precondition that the metric has no labels.
    var only: Series {
        guard let unlabelled else {
            preconditionFailure("metric \(family) has labels (\(labelNames.joined(separator: ", "))): use series(…)")
        }
        return unlabelled
    }

    func series(_ values: [String]) -> Series {
        precondition(values.count == labelNames.count,
                     "metric \(family) has \(labelNames.count) labels (\(labelNames.joined(separator: ", "))), given \(values.count) values")
        return table.withLock { table in
            if let found = table[values] { return found }
            let made = make()
            table[values] = made
            order.withLock { $0.append(values) }
            return made
        }
    }

    /// The series with their labels, in the order first used.
    var all: [(labels: [(String, String)], series: Series)] {
        let keys = order.withLock { $0 }
        return table.withLock { table in
            keys.map { values in (Array(zip(labelNames, values)), table[values]!) }
        }
    }
}

/// What a counter, a gauge and a histogram share: the family's name, help text and label names,
/// and its series by label values — made on first use, the unlabelled one at once. Not made
/// directly: ``Counter``, ``Gauge`` and ``Histogram`` are its kinds, made by ``MetricsRegistry``.
/// Any thread.
///
/// (`@unchecked Sendable` because a class with subclasses cannot be checked: its one stored
/// property, the series table, is an immutable `Sendable` reference, and only this module's
/// final kinds subclass it.)
public class MetricSeriesFamily<Series: Sendable & AnyObject>: @unchecked Sendable {
    /// The family's name, as exposed.
    public var name: String { table.family }
    /// The family's help text.
    public var help: String { table.help }
    /// The family's label names, in order.
    public var labelNames: [String] { table.labelNames }
    let table: SeriesTable<Series>

    init(name: String, help: String, labelNames: [String], makeSeries: @escaping @Sendable () -> Series) {
        table = SeriesTable(family: name, help: help, labelNames: labelNames, make: makeSeries)
    }

    /// The series for these label values, in the order of the family's labels (the count of
    /// values must match: a precondition). Made on first use; keep it for frequent updates.
    public func series(_ labelValues: String...) -> Series { table.series(labelValues) }
}

/// A count that only goes up. See ``MetricsRegistry``.
public final class Counter: MetricSeriesFamily<Counter.Series>, MetricFamily, @unchecked Sendable {
    /// One labelled series of a counter.
    public final class Series: Sendable {
        private let count = Atomic<Int>(0)
        /// Adds `amount` (negative amounts are ignored: a counter never goes down).
        public func increment(by amount: Int = 1) {
            if amount > 0 { count.add(amount, ordering: .relaxed) }
        }
        /// The count now.
        public var value: Int { count.load(ordering: .relaxed) }
    }

    init(name: String, help: String, labelNames: [String]) {
        super.init(name: name, help: help, labelNames: labelNames) { Series() }
    }

    /// Adds `amount` to the counter; for a counter without labels (a precondition).
    public func increment(by amount: Int = 1) { table.only.increment(by: amount) }

    func render(into text: inout PrometheusText) {
        text.family(name, .counter, help)
        for (labels, series) in table.all { text.sample(name, ordered: labels, Double(series.value)) }
    }
}

/// A value that goes up and down. See ``MetricsRegistry``.
public final class Gauge: MetricSeriesFamily<Gauge.Series>, MetricFamily, @unchecked Sendable {
    /// One labelled series of a gauge.
    public final class Series: Sendable {
        private let bits = Atomic<UInt64>(0.0.bitPattern)
        /// Sets the value.
        public func set(_ value: Double) { bits.store(value.bitPattern, ordering: .relaxed) }
        /// Adds `amount` (negative to subtract).
        public func add(_ amount: Double) { addDouble(bits, amount) }
        /// The value now.
        public var value: Double { Double(bitPattern: bits.load(ordering: .relaxed)) }
    }

    init(name: String, help: String, labelNames: [String]) {
        super.init(name: name, help: help, labelNames: labelNames) { Series() }
    }

    /// Sets the gauge; for a gauge without labels (a precondition).
    public func set(_ value: Double) { table.only.set(value) }

    /// Adds to the gauge; for a gauge without labels (a precondition).
    public func add(_ amount: Double) { table.only.add(amount) }

    func render(into text: inout PrometheusText) {
        text.family(name, .gauge, help)
        for (labels, series) in table.all { text.sample(name, ordered: labels, series.value) }
    }
}

/// Observations counted in buckets. See ``MetricsRegistry``.
public final class Histogram: MetricSeriesFamily<Histogram.Series>, MetricFamily, @unchecked Sendable {
    /// Prometheus clients' default bounds, in seconds: 5 ms to 10 s.
    public static let defaultBuckets: [Double] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

    /// One labelled series of a histogram.
    public final class Series: Sendable {
        private let bounds: [Double]
        /// Counts per bucket (`+Inf` last, not cumulative), the sum and the count, together, so
        /// a scrape sees them agree.
        private let state: Protected<(counts: [Int], sum: Double, count: Int)>

        init(bounds: [Double]) {
            self.bounds = bounds
            state = Protected((Array(repeating: 0, count: bounds.count + 1), 0, 0))
        }

        /// Counts `value` in the first bucket whose bound is at least `value` (`+Inf` past the
        /// last), and adds it to the sum.
        public func observe(_ value: Double) {
            var index = 0
            while index < bounds.count && value > bounds[index] { index += 1 }
            state.withLock { state in
                state.counts[index] += 1
                state.sum += value
                state.count += 1
            }
        }

        /// A duration, in seconds.
        public func observe(_ duration: Duration) { observe(duration.seconds) }

        /// Observations so far.
        public var count: Int { state.withLock { $0.count } }
        /// Their sum.
        public var sum: Double { state.withLock { $0.sum } }
        /// Cumulative counts per bound (`+Inf` last), the sum and the count, at one instant.
        var snapshot: (cumulative: [Int], sum: Double, count: Int) {
            let (counts, sum, count) = state.withLock { ($0.counts, $0.sum, $0.count) }
            var running = 0
            return (counts.map { running += $0; return running }, sum, count)
        }
    }

    /// The upper bounds (`+Inf` implied).
    public let bounds: [Double]

    init(name: String, help: String, labelNames: [String], bounds: [Double]) {
        self.bounds = bounds
        super.init(name: name, help: help, labelNames: labelNames) { Series(bounds: bounds) }
    }

    func sameShape(as other: Histogram) -> Bool { bounds == other.bounds }

    /// Observes `value`; for a histogram without labels (a precondition).
    public func observe(_ value: Double) { table.only.observe(value) }

    /// Observes `duration` (in seconds); for a histogram without labels (a precondition).
    public func observe(_ duration: Duration) { table.only.observe(duration) }

    func render(into text: inout PrometheusText) {
        text.family(name, .histogram, help)
        for (labels, series) in table.all {
            let (cumulative, sum, count) = series.snapshot
            for (index, running) in cumulative.enumerated() {
                let bound = index < bounds.count ? PrometheusText.format(bounds[index]) : "+Inf"
                text.sample(name + "_bucket", ordered: labels + [("le", bound)], Double(running))
            }
            text.sample(name + "_sum", ordered: labels, sum)
            text.sample(name + "_count", ordered: labels, Double(count))
        }
    }
}

/// Adds `amount` to the `Double` whose bits `bits` holds (a compare-and-swap loop).
private func addDouble(_ bits: borrowing Atomic<UInt64>, _ amount: Double) {
    var current = bits.load(ordering: .relaxed)
    while true {
        let next = (Double(bitPattern: current) + amount).bitPattern
        let (exchanged, original) = bits.compareExchange(expected: current, desired: next, ordering: .relaxed)
        if exchanged { return }
        current = original
    }
}
