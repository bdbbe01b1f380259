import MainspringCore

/// Renders the metrics of a set of loops — and of `Feeder` jobs and an `HTTPServer` — in the
/// Prometheus text exposition format (version 0.0.4), one `loop` label per loop.
///
/// `EventLoop.metrics` can only be read on the loop's own thread, so a scrape posts one closure
/// to each loop (at `.input` priority) and collects the snapshots on the loop that serves the
/// scrape. A loop that has not answered within `timeout` (stuck in a long callback) does not
/// hold the scrape: its last snapshot is used and `mainspring_loop_metrics_stale{loop}` is 1.
/// Cost per scrape: one post per loop, a copy of each loop's counters and histograms (about
/// 60 KB), and the text (a few KB per loop).
///
/// Families (counters end in `_total`, durations are in seconds):
///
/// | name | type | labels |
/// |---|---|---|
/// | `mainspring_loop_callbacks_total` | counter | loop, priority |
/// | `mainspring_loop_busy_seconds_total` | counter | loop, priority |
/// | `mainspring_loop_polls_total`, `_wakeups_total`, `_stalls_total` | counter | loop |
/// | `mainspring_loop_longest_stall_seconds`, `_longest_callback_seconds` | gauge | loop |
/// | `mainspring_loop_queue_wait_seconds` | histogram | loop, priority |
/// | `mainspring_loop_dropped_at_shutdown_total` | counter | loop |
/// | `mainspring_loop_dispatching_seconds` (time since the last poll; 0 while waiting) | gauge | loop |
/// | `mainspring_loop_running`, `mainspring_loop_metrics_stale` (0 or 1) | gauge | loop |
/// | `mainspring_feeder_jobs_in_flight` | gauge | loop |
/// | `mainspring_feeder_job_progress_ratio`, `mainspring_feeder_job_chunks_completed` | gauge | loop, job |
/// | `mainspring_http_requests_total` (responses sent, by status class) | counter | code (`2xx`…) |
/// | `mainspring_http_requests_in_flight`, `mainspring_http_connections_open` | gauge | |
/// | `mainspring_http_connections_accepted_total`, `_timed_out_total` | counter | |
/// | `mainspring_http_requests_shed_total` (load shedding's `503`s) | counter | reason (`lag`, `deadline`, `route_limit`) |
///
/// Thread-safe: `track` and `collect` work from any thread.
public final class LoopMetricsExporter: Sendable {
    /// The loops, labelled `0`, `1`, … in this order.
    public let loops: [EventLoop]
    /// How long a scrape waits for a loop's snapshot.
    public let timeout: Duration
    private let state = Protected(State())

    private struct State {
        var lastSnapshots: [Int: LoopMetrics] = [:]
        var jobs: [(name: String, job: FeedJob)] = []
    }

    /// The application's metrics, rendered after the loops' and the server's; nil for none.
    public let registry: MetricsRegistry?

    /// Exports `loops` (labelled by position), and the application's metrics in `registry`.
    public init(loops: [EventLoop], timeout: Duration = .milliseconds(250), registry: MetricsRegistry? = nil) {
        self.loops = loops
        self.timeout = timeout
        self.registry = registry
    }

    /// Exports the loops of `group`, and the application's metrics in `registry`.
    public convenience init(group: EventLoopGroup, timeout: Duration = .milliseconds(250), registry: MetricsRegistry? = nil) {
        self.init(loops: group.loops, timeout: timeout, registry: registry)
    }

    /// Reports `job`'s progress under `name` (its `job` label) until it finishes. Any thread.
    public func track(_ job: FeedJob, name: String) {
        state.withLock { $0.jobs.append((name, job)) }
    }

    /// Collects every loop's metrics and renders the text; `completion` runs on `loop` (the
    /// loop serving the scrape, which must be running). Any thread.
    public func collect(on loop: EventLoop, server: HTTPServerStatistics? = nil,
                        completion: @escaping @Sendable (String) -> Void)
    {
        let gather = Gather(count: loops.count)
        let finish: @Sendable () -> Void = { [self] in
            guard let snapshots = gather.take() else { return }
            completion(render(snapshots: snapshots, server: server))
        }
        for (index, target) in loops.enumerated() {
            target.execute(priority: .input) {
                let snapshot = target.metrics
                loop.execute(priority: .input) {
                    if gather.deliver(index, snapshot) { finish() }
                }
            }
        }
        loop.execute(priority: .input) {
            loop.schedule(after: self.timeout) { finish() }
        }
    }

    /// Renders the text from the snapshots collected (`nil`: the loop did not answer in time).
    func render(snapshots: [LoopMetrics?], server: HTTPServerStatistics?) -> String {
        var text = PrometheusText()
        var resolved: [(label: String, metrics: LoopMetrics?, stale: Bool)] = []
        state.withLock { state in
            for (index, snapshot) in snapshots.enumerated() {
                if let snapshot { state.lastSnapshots[index] = snapshot }
                resolved.append(("\(index)", snapshot ?? state.lastSnapshots[index], snapshot == nil))
            }
        }
        let live = resolved.compactMap { entry in entry.metrics.map { (entry.label, $0) } }
        let priorities = Priority.allCases

        text.family("mainspring_loop_callbacks_total", .counter, "Callbacks run by the loop, by priority.")
        for (label, m) in live {
            for p in priorities { text.sample("mainspring_loop_callbacks_total", ["loop": label, "priority": "\(p)"], Double(m.callbacks[p] ?? 0)) }
        }
        text.family("mainspring_loop_busy_seconds_total", .counter, "Time spent in callbacks, by priority.")
        for (label, m) in live {
            for p in priorities { text.sample("mainspring_loop_busy_seconds_total", ["loop": label, "priority": "\(p)"], (m.busyTime[p] ?? .zero).seconds) }
        }
        let counters: [(String, String, KeyPath<LoopMetrics, Int>)] = [
            ("mainspring_loop_polls_total", "Polls for I/O (event_base_loop calls).", \.polls),
            ("mainspring_loop_wakeups_total", "Times the loop was woken through its eventfd.", \.wakeups),
            ("mainspring_loop_stalls_total", "Callbacks longer than the loop's stall threshold.", \.stalls),
            ("mainspring_loop_dropped_at_shutdown_total", "Work queued but dropped because the loop shut down.", \.droppedAtShutdown),
        ]
        for (name, help, path) in counters {
            text.family(name, .counter, help)
            for (label, m) in live { text.sample(name, ["loop": label], Double(m[keyPath: path])) }
        }
        text.family("mainspring_loop_longest_stall_seconds", .gauge, "The longest stall so far (0 when none).")
        for (label, m) in live { text.sample("mainspring_loop_longest_stall_seconds", ["loop": label], m.longestStall.seconds) }
        text.family("mainspring_loop_longest_callback_seconds", .gauge, "The longest single callback so far.")
        for (label, m) in live { text.sample("mainspring_loop_longest_callback_seconds", ["loop": label], m.longestCallback.seconds) }

        let name = "mainspring_loop_queue_wait_seconds"
        text.family(name, .histogram, "How long ready work waited before it ran, by priority.")
        let bounds = Self.waitBounds
        let boundDurations = bounds.map { Duration.nanoseconds(Int64(($0 * 1e9).rounded())) }
        for (label, m) in live {
            for p in priorities {
                let histogram = m.queueWait[p] ?? LatencyHistogram()
                let counts = histogram.cumulativeCounts(atOrBelow: boundDurations)
                for (bound, count) in zip(bounds, counts) {
                    text.sample(name + "_bucket", ["loop": label, "priority": "\(p)", "le": PrometheusText.format(bound)], Double(count))
                }
                text.sample(name + "_bucket", ["loop": label, "priority": "\(p)", "le": "+Inf"], Double(histogram.count))
                text.sample(name + "_sum", ["loop": label, "priority": "\(p)"], histogram.total.seconds)
                text.sample(name + "_count", ["loop": label, "priority": "\(p)"], Double(histogram.count))
            }
        }

        var activities: [(label: String, dispatching: Double, running: Double)] = []
        for (index, loop) in loops.enumerated() {
            switch loop.activity {
            case .waiting: activities.append(("\(index)", 0, 1))
            case .dispatching(let duration): activities.append(("\(index)", duration.seconds, 1))
            case .notRunning: activities.append(("\(index)", 0, 0))
            }
        }
        text.family("mainspring_loop_dispatching_seconds", .gauge, "Time since the loop last polled while it dispatches (0 while it waits for events).")
        for entry in activities { text.sample("mainspring_loop_dispatching_seconds", ["loop": entry.label], entry.dispatching) }
        text.family("mainspring_loop_running", .gauge, "Whether a thread runs the loop (1) or not (0).")
        for entry in activities { text.sample("mainspring_loop_running", ["loop": entry.label], entry.running) }
        text.family("mainspring_loop_metrics_stale", .gauge, "1 when the loop did not answer this scrape in time (its figures are from an earlier scrape).")
        for (label, _, stale) in resolved { text.sample("mainspring_loop_metrics_stale", ["loop": label], stale ? 1 : 0) }

        // Feeder jobs: those still running.
        let jobs = state.withLock { state -> [(String, FeedJob)] in
            state.jobs.removeAll { $0.job.isFinished }
            return state.jobs.map { ($0.name, $0.job) }
        }
        text.family("mainspring_feeder_jobs_in_flight", .gauge, "Tracked Feeder jobs not finished yet.")
        var perLoop: [String: Int] = [:]
        for index in loops.indices { perLoop["\(index)"] = 0 }
        for (_, job) in jobs { perLoop[label(of: job.feeder.loop), default: 0] += 1 }
        for (label, count) in perLoop.sorted(by: { $0.key < $1.key }) {
            text.sample("mainspring_feeder_jobs_in_flight", ["loop": label], Double(count))
        }
        text.family("mainspring_feeder_job_progress_ratio", .gauge, "Fraction of a tracked job's chunks completed (0 to 1).")
        for (jobName, job) in jobs {
            text.sample("mainspring_feeder_job_progress_ratio", ["loop": label(of: job.feeder.loop), "job": jobName],
                        job.progress.fractionCompleted ?? 0)
        }
        text.family("mainspring_feeder_job_chunks_completed", .gauge, "Chunks of a tracked job completed so far.")
        for (jobName, job) in jobs {
            text.sample("mainspring_feeder_job_chunks_completed", ["loop": label(of: job.feeder.loop), "job": jobName],
                        Double(job.progress.completed))
        }

        if let server {
            let s = server.snapshot
            text.family("mainspring_http_requests_total", .counter, "HTTP responses sent, by status class.")
            for code in ["1xx", "2xx", "3xx", "4xx", "5xx"] {
                text.sample("mainspring_http_requests_total", ["code": code], Double(s.responses[code] ?? 0))
            }
            text.family("mainspring_http_requests_in_flight", .gauge, "HTTP requests read and not yet answered in full.")
            text.sample("mainspring_http_requests_in_flight", [:], Double(s.requestsInFlight))
            text.family("mainspring_http_connections_open", .gauge, "HTTP connections open.")
            text.sample("mainspring_http_connections_open", [:], Double(s.connectionsOpen))
            text.family("mainspring_http_connections_accepted_total", .counter, "HTTP connections accepted.")
            text.sample("mainspring_http_connections_accepted_total", [:], Double(s.connectionsAccepted))
            text.family("mainspring_http_connections_timed_out_total", .counter, "HTTP connections closed because a request arrived too slowly.")
            text.sample("mainspring_http_connections_timed_out_total", [:], Double(s.connectionsTimedOut))
            text.family("mainspring_http_requests_shed_total", .counter,
                        "HTTP requests answered 503 by load shedding: the loop's p99 queue wait over its target (lag), the request past its deadline, or its route at its concurrency limit.")
            text.sample("mainspring_http_requests_shed_total", ["reason": "lag"], Double(s.requestsShed))
            text.sample("mainspring_http_requests_shed_total", ["reason": "deadline"], Double(s.requestsPastDeadline))
            text.sample("mainspring_http_requests_shed_total", ["reason": "route_limit"], Double(s.requestsOverLimit))
        }
        registry?.render(into: &text)
        return text.output
    }

    private func label(of loop: EventLoop) -> String {
        loops.firstIndex { $0 === loop }.map { "\($0)" } ?? "other"
    }

    /// Upper bounds of the queue-wait histogram, in seconds.
    static let waitBounds: [Double] = [0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                       0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
}

/// The snapshots of one scrape, on the serving loop (delivered there, taken once).
private final class Gather: @unchecked Sendable {
    private var snapshots: [LoopMetrics?]
    private var remaining: Int
    private var taken = false

    init(count: Int) {
        snapshots = Array(repeating: nil, count: count)
        remaining = count
    }

    /// Stores a snapshot; true when it was the last one missing.
    func deliver(_ index: Int, _ metrics: LoopMetrics) -> Bool {
        guard !taken else { return false }
        snapshots[index] = metrics
        remaining -= 1
        return remaining == 0
    }

    /// The snapshots, once (nil afterwards).
    func take() -> [LoopMetrics?]? {
        guard !taken else { return nil }
        taken = true
        return snapshots
    }
}

extension Duration {
    /// The duration in seconds, as a `Double`.
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

/// Builds Prometheus text format 0.0.4: `# HELP`, `# TYPE`, then samples.
struct PrometheusText {
    enum Kind: String { case counter, gauge, histogram }
    private(set) var output = ""

    mutating func family(_ name: String, _ kind: Kind, _ help: String) {
        output += "# HELP \(name) \(help.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\n", with: "\\n"))\n"
        output += "# TYPE \(name) \(kind.rawValue)\n"
    }

    mutating func sample(_ name: String, _ labels: KeyValuePairs<String, String>, _ value: Double) {
        output += name
        if !labels.isEmpty {
            output += "{" + labels.map { "\($0.key)=\"\(Self.escape($0.value))\"" }.joined(separator: ",") + "}"
        }
        output += " " + Self.format(value) + "\n"
    }

    /// A sample whose labels are in the order given (the application's metrics).
    mutating func sample(_ name: String, ordered labels: [(String, String)], _ value: Double) {
        output += name
        if !labels.isEmpty {
            output += "{" + labels.map { "\($0.0)=\"\(Self.escape($0.1))\"" }.joined(separator: ",") + "}"
        }
        output += " " + Self.format(value) + "\n"
    }

    mutating func sample(_ name: String, _ labels: [String: String], _ value: Double) {
        output += name
        if !labels.isEmpty {
            // Stable order: loop, priority, job, code, le.
            let order = ["loop", "priority", "job", "code", "le"]
            let sorted = labels.sorted { (order.firstIndex(of: $0.key) ?? 99, $0.key) < (order.firstIndex(of: $1.key) ?? 99, $1.key) }
            output += "{" + sorted.map { "\($0.key)=\"\(Self.escape($0.value))\"" }.joined(separator: ",") + "}"
        }
        output += " " + Self.format(value) + "\n"
    }

    static func escape(_ value: String) -> String {
        var result = ""
        for character in value {
            switch character {
            case "\\": result += "\\\\"
            case "\"": result += "\\\""
            case "\n": result += "\\n"
            default: result.append(character)
            }
        }
        return result
    }

    static func format(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded() && abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }
}
