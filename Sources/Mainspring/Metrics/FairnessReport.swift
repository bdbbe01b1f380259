import Foundation

/// How fair a loop was to its input and to fed work over one job: input latency, the work's
/// share and throughput, its longest starvation gap, stalls and the feeder's overhead.
///
/// ```swift
/// let report = FairnessReport(metrics: loop.metrics, input: simulator, work: job)
/// print(report.table)
/// ```
///
/// A value: make it on the loop's thread once the job has finished (the simulator is
/// loop-bound), then use it anywhere. `table` is aligned text for people, `json` one JSON object
/// for tools (durations in milliseconds, shares and overhead as fractions).
public struct FairnessReport: Sendable {
    /// A latency distribution, summarised.
    public struct Latency: Sendable, Hashable {
        /// How many latencies were recorded.
        public let count: Int
        /// The median.
        public let p50: Duration
        /// The 90th percentile.
        public let p90: Duration
        /// The 99th percentile.
        public let p99: Duration
        /// The longest.
        public let max: Duration

        /// Summarises `histogram`.
        public init(_ histogram: LatencyHistogram) {
            count = histogram.count
            p50 = histogram.percentile(0.5)
            p90 = histogram.percentile(0.9)
            p99 = histogram.percentile(0.99)
            max = histogram.max
        }
    }

    /// Input events: write-to-handling latency.
    public let inputLatency: Latency
    /// Chunks of work that ran.
    public let chunks: Int
    /// The work's wall-clock time, from its first chunk's start to its last chunk's end.
    public let elapsed: Duration
    /// The fraction of that time spent in the work's own chunks (0...1): close to 1 when the
    /// loop had little else to do; under an input flood, what the work still got.
    public let workShare: Double
    /// The longest the work waited between two chunks: its worst starvation.
    public let starvation: Duration
    /// Callbacks longer than the loop's `stallThreshold` (from `metrics`).
    public let stalls: Int
    /// The longest of those stalls (zero when there was none).
    public let longestStall: Duration
    /// Chunks per second of wall-clock time.
    public let throughput: Double
    /// Time the work took beyond running its chunks straight, as a fraction of that (0.003 is
    /// 0.3%). With `baseline`, relative to it; without, the job's wall-clock time minus its chunks
    /// and minus the loop's `.input` and `.normal` busy time (so take `metrics` from a loop that
    /// did nothing else before the job), relative to the chunks' own time.
    public let overhead: Double

    /// Makes a report from the pieces.
    ///
    /// - Parameters:
    ///   - metrics: the loop's metrics (stalls; busy time when there is no `baseline`).
    ///   - input: the input events' latencies (an `InputSimulator`'s `latencies`).
    ///   - work: the job's statistics (`FeedJob.statistics`).
    ///   - baseline: how long running the same chunks straight took, if measured.
    public init(metrics: LoopMetrics, input: LatencyHistogram, work: FeedJob.Statistics, baseline: Duration? = nil) {
        inputLatency = Latency(input)
        chunks = work.chunks
        elapsed = work.elapsed
        let elapsedSeconds = work.elapsed.inSeconds
        let chunkSeconds = work.chunkTime.inSeconds
        workShare = elapsedSeconds > 0 ? Swift.min(1, chunkSeconds / elapsedSeconds) : 0
        starvation = work.longestGap
        stalls = metrics.stalls
        longestStall = metrics.longestStall
        throughput = elapsedSeconds > 0 ? Double(work.chunks) / elapsedSeconds : 0
        if let baseline, baseline.inSeconds > 0 {
            overhead = elapsedSeconds / baseline.inSeconds - 1
        } else if chunkSeconds > 0 {
            let others = (metrics.busyTime[.input] ?? .zero) + (metrics.busyTime[.normal] ?? .zero)
            overhead = Swift.max(0, elapsedSeconds - chunkSeconds - others.inSeconds) / chunkSeconds
        } else {
            overhead = 0
        }
    }

    /// Makes a report from a finished job and the simulator that ran alongside it. Call it on the
    /// loop's thread (the simulator is loop-bound).
    public init(metrics: LoopMetrics, input: InputSimulator, work: FeedJob, baseline: Duration? = nil) {
        self.init(metrics: metrics, input: input.latencies, work: work.statistics, baseline: baseline)
    }

    /// The report as aligned text, one figure per line.
    public var table: String {
        let rows: [(String, String)] = [
            ("input events", "\(inputLatency.count)"),
            ("input p50", Self.milliseconds(inputLatency.p50)),
            ("input p90", Self.milliseconds(inputLatency.p90)),
            ("input p99", Self.milliseconds(inputLatency.p99)),
            ("input max", Self.milliseconds(inputLatency.max)),
            ("work chunks", "\(chunks)"),
            ("work elapsed", Self.milliseconds(elapsed)),
            ("work throughput", String(format: "%.0f chunks/s", throughput)),
            ("work share", String(format: "%.3f", workShare)),
            ("longest starvation", Self.milliseconds(starvation)),
            ("stalls", "\(stalls) (longest \(Self.milliseconds(longestStall)))"),
            ("overhead", String(format: "%.2f%%", overhead * 100)),
        ]
        let width = rows.map(\.0.count).max() ?? 0
        return rows.map { $0.0.padding(toLength: width, withPad: " ", startingAt: 0) + "  " + $0.1 }
            .joined(separator: "\n")
    }

    /// The report as one JSON object (sorted keys; durations in ms as numbers).
    public var json: String {
        let object: [String: Any] = [
            "input_events": inputLatency.count,
            "input_p50_ms": inputLatency.p50.inMilliseconds,
            "input_p90_ms": inputLatency.p90.inMilliseconds,
            "input_p99_ms": inputLatency.p99.inMilliseconds,
            "input_max_ms": inputLatency.max.inMilliseconds,
            "chunks": chunks,
            "elapsed_ms": elapsed.inMilliseconds,
            "throughput_per_s": throughput,
            "work_share": workShare,
            "max_starvation_ms": starvation.inMilliseconds,
            "stalls": stalls,
            "longest_stall_ms": longestStall.inMilliseconds,
            "overhead": overhead,
        ]
        // JSON has no NaN or infinity: such a figure (there should be none) is written as 0.
        let finite = object.mapValues { value -> Any in
            if let number = value as? Double, !number.isFinite { return 0.0 }
            return value
        }
        // `try?` is safe here: the object holds only strings and finite numbers, which
        // JSONSerialization always writes; "{}" is unreachable.
        guard let data = try? JSONSerialization.data(withJSONObject: finite, options: [.sortedKeys]) else {
            return "{}"
        }
        return String(decoding: data, as: UTF8.self)
    }

    private static func milliseconds(_ duration: Duration) -> String {
        String(format: "%.3f ms", duration.inMilliseconds)
    }
}

extension Duration {
    /// The duration in seconds, as a `Double`.
    var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
    /// The duration in milliseconds, as a `Double`.
    var inMilliseconds: Double { inSeconds * 1_000 }
}
