import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

// Fairness both ways — input first behind a careless flood of closures and behind a Feeder,
// work's share under an input flood and an overload — is tested exactly on modelled CPU in
// Tests/MainspringTestingTests/FairnessSimulationTests.swift (InputSimulator on virtual time),
// and end to end on real pipes by InputSimulatorTests; the tight real-time targets live in
// `mainspring-bench fairness`, `input-flood` and `tiny-chunks`.

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
