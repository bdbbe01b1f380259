import ExampleServices
import Foundation
import Mainspring

/// The demo's status lines and its final report (text or JSON).
extension Demo {
    func statusLines() -> [String] {
        switch phase {
        case .running, .paused:
            let numbers = job == nil ? "" : ", \(grouped(chunkSize)) numbers per chunk"
            return [
                "status: \(phase.rawValue), \(formatPercent(sieve.progress)) in \(formatSeconds(elapsed.seconds)): "
                    + "\(grouped(sieve.count)) primes below \(grouped(sieve.position))",
                "        \(grouped(chunksRun)) chunks so far\(numbers)",
            ]
        case .completed, .cancelled:
            return ["status: \(phase.rawValue)"] + resultLines()
        }
    }

    /// What the job found, and what it took:
    /// ```
    /// result: 98,222,287 primes below 2,000,000,000 (completed)
    /// job: 20,000 chunks in 5.63 s
    /// ```
    func resultLines() -> [String] {
        let how = phase == .completed ? "completed" : "\(phase.rawValue) at \(formatPercent(sieve.progress))"
        let paused = pausedTotal >= .milliseconds(10) ? ", \(formatSeconds(pausedTotal.seconds)) of it paused" : ""
        return [
            "result: \(grouped(sieve.count)) primes below \(grouped(sieve.position)) (\(how))",
            "job: \(grouped(chunksRun)) chunks in \(formatSeconds(elapsed.seconds))\(paused)",
        ]
    }

    func fairnessReport() -> FairnessReport {
        var metrics = loop.metrics
        let work: FeedJob.Statistics
        if let flood {
            work = flood.statistics
            // The flood's chunks ran as .normal callbacks: they are the work, not other work.
            metrics.busyTime[.normal] = max(.zero, (metrics.busyTime[.normal] ?? .zero) - work.chunkTime)
        } else if let statistics = job?.statistics {
            // A pause is neither the work's time nor the loop's: leave it out of the elapsed time.
            work = FeedJob.Statistics(
                chunks: statistics.chunks, elapsed: max(statistics.chunkTime, statistics.elapsed - resumedPauses),
                chunkTime: statistics.chunkTime, longestGap: statistics.longestGap, turns: statistics.turns)
        } else {
            work = FeedJob.Statistics(chunks: 0, elapsed: .zero, chunkTime: .zero, longestGap: .zero, turns: 0)
        }
        return FairnessReport(metrics: metrics, input: input?.latencies ?? LatencyHistogram(), work: work)
    }

    func fairnessSummary(_ report: FairnessReport) -> [String] {
        let latency = report.inputLatency
        return [
            "fairness: input p50 \(formatMilliseconds(latency.p50.milliseconds)), p99 "
                + "\(formatMilliseconds(latency.p99.milliseconds)), max \(formatMilliseconds(latency.max.milliseconds))"
                + " (\(grouped(latency.count)) probe records),",
            "          work share \(String(format: "%.3f", report.workShare)), longest starvation "
                + "\(formatMilliseconds(report.starvation.milliseconds)), stalls \(report.stalls)",
        ]
    }

    func tickSummary() -> String {
        "progress timer: asked every \(Int(Self.tickInterval.milliseconds)) ms, longest gap while the job ran "
            + formatMilliseconds(longestTickGap.milliseconds)
    }

    /// The fairness report's JSON object, with the job's own figures under `"job"`.
    func json(_ report: FairnessReport) -> String {
        var object = (try? JSONSerialization.jsonObject(with: Data(report.json.utf8))) as? [String: Any] ?? [:]
        object["job"] = [
            "limit": sieve.limit,
            "primes": sieve.count,
            "sieved_below": sieve.position,
            "outcome": outcome?.description ?? "unfinished",
            "mode": options.naive ? "naive" : "feeder",
            "pacing": options.naive ? "none" : options.pacing.flagValue,
            "chunk_size": chunkSize,
            "elapsed_ms": elapsed.milliseconds,
            "tick_interval_ms": Self.tickInterval.milliseconds,
            "longest_tick_gap_ms": longestTickGap.milliseconds,
        ] as [String: Any]
        object["input"] = "steady every 10 ms"
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return report.json
        }
        return String(decoding: data, as: UTF8.self)
    }
}
