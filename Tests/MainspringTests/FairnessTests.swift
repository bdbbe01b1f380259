import Foundation
import Testing
@testable import Mainspring

/// Fairness both ways, measured with real fds (InputSimulator) and real CPU work.
///
/// Wall-clock latency on a loaded 2-core machine (other suites run in parallel) includes the
/// time the OS takes the loop's thread away, so the sharp assertions here are structural: how
/// many chunks *started* between an input record's write and its handling. A preempted loop runs
/// no chunks either, so that count measures the scheduler alone. (The writer thread can still be
/// preempted between stamping a record and writing it, so the 90th percentile of the counts is
/// checked, not the maximum.) Wall-clock bounds are generous; the tight targets live in
/// `mainspring-bench fairness`, `input-flood` and `tiny-chunks`.
@Suite("Fairness: input first, work not starved", .serialized)
struct FairnessTests {
    @Test("a careless flood of 1 ms .normal closures still lets input through (poll-interval rule)")
    func naiveFloodStaysResponsive() async throws {
        let (log, latencies, ran) = try await onLoopThread { loop -> (WorkLog, LatencyHistogram, Int) in
            let log = WorkLog()
            let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(5))) { log.handled($0) }
            nonisolated(unsafe) var ran = 0
            input.start()
            for _ in 0..<300 {
                loop.execute {
                    log.chunkStarted()
                    spin(for: .milliseconds(1))
                    ran += 1
                }
            }
            loop.spin(until: { ran == 300 }, timeout: .seconds(30))
            input.stop()
            loop.spin(until: { input.isFinished }, timeout: .seconds(5))
            return (log, input.latencies, ran)
        }
        #expect(ran == 300)
        #expect(latencies.count >= 30)
        // Without the rule an event would wait for the rest of the 300-closure queue (~150 chunks
        // on average); with it the loop polls every 2 ms: at most 2 chunks start after a write.
        #expect(log.chunksBeforeInput(percentile: 0.9) <= 2, "\(log.summary)")
        #expect(latencies.percentile(0.5) < .milliseconds(25), "p50 \(latencies.percentile(0.5))")
    }

    @Test("a Feeder lets input in after the chunk in progress", arguments: [
        Feeder.Pacing.budget(.milliseconds(1)), .oneChunkPerTurn,
    ])
    func feederKeepsInputResponsive(pacing: Feeder.Pacing) async throws {
        let (log, report) = try await onLoopThread { loop -> (WorkLog, FairnessReport) in
            let log = WorkLog()
            let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(5))) { log.handled($0) }
            let feeder = Feeder(loop: loop, pacing: pacing)
            input.start()
            let job = feeder.feed(chunks: 300) { _ in
                log.chunkStarted()
                spin(for: .milliseconds(1))
            }
            loop.spin(until: { job.isFinished }, timeout: .seconds(30))
            input.stop()
            loop.spin(until: { input.isFinished }, timeout: .seconds(5))
            #expect(job.progress.completed == 300)
            return (log, FairnessReport(metrics: loop.metrics, input: input, work: job))
        }
        #expect(report.inputLatency.count >= 30)
        // Each turn ends with a poll and input runs before the next turn: at most one chunk
        // starts between a write and its handling (the turn that was about to start).
        #expect(log.chunksBeforeInput(percentile: 0.9) <= 1, "\(log.summary)")
        #expect(report.inputLatency.p50 < .milliseconds(25), "\(report.table)")
        #expect(report.workShare > 0.5, "\(report.table)")
    }

    @Test("a flood (input every 100 µs costing 50 µs): work keeps its share and is never starved long")
    func issueFlood() async throws {
        let report = try await floodReport(every: .microseconds(100), cost: .microseconds(50), chunks: 2_000)
        // Targets (benchmark `input-flood`): share ≥ 0.25 (about 0.5 measured), gap ≤ 100 ms, input
        // p99 ≤ 5 ms. Input takes half the CPU here, so on a loaded machine a preempted loop
        // thread turns the flood into an overload (a growing backlog, latency without bound):
        // only the share and the gap are asserted, with room for preemption.
        #expect(report.workShare >= 0.2, "\(report.table)")
        // Wall-clock time: a loop thread preempted by the rest of a parallel test run stalls
        // everything on it; without the guarantee the gap would be the whole flood (seconds).
        #expect(report.starvation < .seconds(1), "\(report.table)")
    }

    @Test("an overload (input every 100 µs costing 150 µs): work still gets a guaranteed share")
    func overload() async throws {
        let report = try await floodReport(every: .microseconds(100), cost: .microseconds(150), chunks: 1_000)
        // Input alone would take 150% of the CPU: without the guaranteed share (default 0.25) the
        // work would get nothing, or one turn per long input callback (about 0.03). Allow for a
        // loaded machine.
        #expect(report.workShare >= 0.15, "\(report.table)")
        #expect(report.starvation < .seconds(1), "\(report.table)")  // wall clock: see the flood test
    }

    /// Runs `chunks` × 200 µs of fed work while input floods the loop.
    private func floodReport(every: Duration, cost: Duration, chunks: Int) async throws -> FairnessReport {
        try await onLoopThread { loop -> FairnessReport in
            let input = try InputSimulator(loop: loop, pattern: .steady(every: every), handlingCost: cost)
            let feeder = Feeder(loop: loop)
            input.start()
            // Let the flood build up first: the work starts under it.
            loop.spin(until: { input.received >= 20 }, timeout: .seconds(10))
            let job = feeder.feed(chunks: chunks) { _ in spin(for: .microseconds(200)) }
            loop.spin(until: { job.isFinished }, timeout: .seconds(60))
            input.stop()
            loop.spin(until: { input.isFinished }, timeout: .seconds(10))
            #expect(job.progress.completed == chunks)
            return FairnessReport(metrics: loop.metrics, input: input, work: job)
        }
    }
}

/// When chunks started and when input records were written and handled (`CLOCK_MONOTONIC`).
/// Loop thread only while the loop runs; read afterwards.
final class WorkLog: @unchecked Sendable {
    private var chunkStarts: [UInt64] = []
    private var events: [(written: UInt64, handled: UInt64)] = []

    func chunkStarted() { chunkStarts.append(monotonicNanoseconds()) }

    /// Called from `onEvent` (after the handling cost: no chunk can start meanwhile).
    func handled(_ event: InputSimulator.Event) {
        let now = monotonicNanoseconds()
        let latency = UInt64(event.latency.components.attoseconds / 1_000_000_000)
            + UInt64(event.latency.components.seconds) * 1_000_000_000
        events.append((now - min(now, latency), now))
    }

    /// For each input record: how many chunks started after it was written and before it was
    /// handled. In event order.
    var chunksBeforeInput: [Int] {
        events.map { event in index(after: event.handled) - index(after: event.written) }
    }

    /// The `p` quantile (0...1) of `chunksBeforeInput` (0 without events).
    func chunksBeforeInput(percentile p: Double) -> Int {
        let sorted = chunksBeforeInput.sorted()
        guard !sorted.isEmpty else { return 0 }
        return sorted[min(sorted.count - 1, max(0, Int((p * Double(sorted.count)).rounded(.up)) - 1))]
    }

    var summary: String {
        let counts = chunksBeforeInput
        return "chunks started before an input: p50 \(chunksBeforeInput(percentile: 0.5)), "
            + "p90 \(chunksBeforeInput(percentile: 0.9)), max \(counts.max() ?? 0) over \(counts.count) events"
    }

    /// How many chunk starts are at or before `time` (starts are in order: one thread).
    private func index(after time: UInt64) -> Int {
        var low = 0, high = chunkStarts.count
        while low < high {
            let mid = (low + high) / 2
            if chunkStarts[mid] <= time { low = mid + 1 } else { high = mid }
        }
        return low
    }
}

@Suite("FairnessReport")
struct FairnessReportTests {
    private func sample() -> FairnessReport {
        var input = LatencyHistogram()
        for i in 1...100 { input.record(.microseconds(10 * i)) }
        var metrics = LoopMetrics(
            iterations: 10, polls: 10, wakeups: 0, remoteItems: 0, callbacks: [:],
            busyTime: [.input: .milliseconds(10), .normal: .zero, .background: .milliseconds(100)],
            queueWait: [:], stalls: 2, longestStall: .milliseconds(70), longestCallback: .milliseconds(70),
            droppedAtShutdown: 0)
        metrics.iterations = 10
        let work = FeedJob.Statistics(chunks: 100, elapsed: .milliseconds(120), chunkTime: .milliseconds(100),
                                      longestGap: .milliseconds(3), turns: 100)
        return FairnessReport(metrics: metrics, input: input, work: work)
    }

    @Test("figures: percentiles, share, throughput, starvation, stalls, overhead")
    func figures() {
        let report = sample()
        #expect(report.inputLatency.count == 100)
        #expect(report.inputLatency.max == .microseconds(1_000))
        #expect(abs(report.inputLatency.p50.inMilliseconds - 0.5) < 0.01)
        #expect(abs(report.inputLatency.p99.inMilliseconds - 0.99) < 0.01)
        #expect(abs(report.workShare - 100.0 / 120.0) < 1e-9)
        #expect(abs(report.throughput - 100 / 0.12) < 1e-6)
        #expect(report.starvation == .milliseconds(3))
        #expect(report.stalls == 2 && report.longestStall == .milliseconds(70))
        // 120 ms elapsed − 100 ms of chunks − 10 ms of input = 10 ms: 10% of the chunks' time.
        #expect(abs(report.overhead - 0.1) < 1e-9)
        let withBaseline = FairnessReport(metrics: LoopMetrics.empty, input: LatencyHistogram(),
                                          work: FeedJob.Statistics(chunks: 1, elapsed: .milliseconds(101),
                                                                   chunkTime: .milliseconds(100), longestGap: .zero,
                                                                   turns: 1),
                                          baseline: .milliseconds(100))
        #expect(abs(withBaseline.overhead - 0.01) < 1e-9)
    }

    @Test("json is one valid JSON object with every figure")
    func json() throws {
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(sample().json.utf8)) as? [String: Any])
        for key in ["input_events", "input_p50_ms", "input_p90_ms", "input_p99_ms", "input_max_ms", "chunks",
                    "elapsed_ms", "throughput_per_s", "work_share", "max_starvation_ms", "stalls",
                    "longest_stall_ms", "overhead"]
        {
            #expect(object[key] is NSNumber, "\(key)")
        }
        #expect((object["input_max_ms"] as? Double) == 1.0)
        // An empty report is valid JSON too (no NaN).
        let empty = FairnessReport(metrics: .empty, input: LatencyHistogram(),
                                   work: FeedJob.Statistics(chunks: 0, elapsed: .zero, chunkTime: .zero,
                                                            longestGap: .zero, turns: 0))
        #expect(try JSONSerialization.jsonObject(with: Data(empty.json.utf8)) is [String: Any])
    }

    @Test("table is aligned text: one figure per line, values in one column")
    func table() {
        let lines = sample().table.split(separator: "\n").map(String.init)
        #expect(lines.count == 12)
        // Every value starts in the same column, after at least two spaces.
        let columns = lines.map { line -> Int? in
            guard let gap = line.range(of: "  ") else { return nil }
            let value = line[gap.upperBound...].firstIndex { $0 != " " }
            return value.map { line.distance(from: line.startIndex, to: $0) }
        }
        #expect(columns.allSatisfy { $0 != nil && $0 == columns[0] }, "\(columns)")
        #expect(lines.contains { $0.hasPrefix("input p99") && $0.hasSuffix(" ms") })
    }
}

extension LoopMetrics {
    static let empty = LoopMetrics(
        iterations: 0, polls: 0, wakeups: 0, remoteItems: 0, callbacks: [:], busyTime: [:], queueWait: [:],
        stalls: 0, longestStall: .zero, longestCallback: .zero, droppedAtShutdown: 0)
}

/// Busy-waits (real CPU work) for `duration`.
func spin(for duration: Duration) {
    let end = ContinuousClock.now + duration
    var x: UInt64 = 0
    while ContinuousClock.now < end { x = x &* 6364136223846793005 &+ 1 }
    _ = x
}
