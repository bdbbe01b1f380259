import MainspringCore

extension HTTPRoutes {
    /// `GET path` answers with `exporter`'s metrics and the serving server's counters, in the
    /// Prometheus text format (`text/plain; version=0.0.4`). A loop stuck in a long callback
    /// delays the answer by at most `exporter.timeout` (see `LoopMetricsExporter`).
    public mutating func serveMetrics(at path: String = "/metrics", exporter: LoopMetricsExporter) {
        on([.get], path, responding: { request, responder in
            exporter.collect(on: request.loop, server: request.server) { text in
                responder.send(.text(text, headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"]))
            }
        })
    }

    /// `GET path` with the metrics of every loop of `group` (a `LoopMetricsExporter` of its own).
    public mutating func serveMetrics(at path: String = "/metrics", of group: EventLoopGroup) {
        serveMetrics(at: path, exporter: LoopMetricsExporter(group: group))
    }

    /// `GET path` answers `200 ok` while every loop of `loops` is responsive — waiting for events,
    /// or dispatching for no longer than `threshold` since its last poll — and otherwise `503`
    /// with one line naming the first loop that is not (stuck in one callback, or not running).
    /// Answered at once by the loop that serves the request, from each loop's `activity` (an
    /// atomic read): a stuck loop takes no new connections, so a healthy one answers.
    /// `threshold` is a period: zero or negative stops the program (Mainspring's "Durations").
    public mutating func serveHealth(at path: String = "/healthz", of loops: [EventLoop], threshold: Duration = .seconds(1)) {
        _ = requirePositive(threshold, "HTTPRoutes.serveHealth(at:of:threshold:)'s threshold")
        get(path) { _ in
            for (index, loop) in loops.enumerated() {
                switch loop.activity {
                case .waiting:
                    continue
                case .dispatching(let duration) where duration <= threshold:
                    continue
                case .dispatching(let duration):
                    let milliseconds = Int((duration.seconds * 1000).rounded())
                    return .text("loop \(index) is stuck: one callback has run for \(milliseconds) ms without a poll\n", status: 503)
                case .notRunning:
                    return .text("loop \(index) is not running\n", status: 503)
                }
            }
            return .text("ok\n")
        }
    }

    /// `serveHealth(at:of:threshold:)` for the loops of `group`.
    public mutating func serveHealth(at path: String = "/healthz", of group: EventLoopGroup, threshold: Duration = .seconds(1)) {
        serveHealth(at: path, of: group.loops, threshold: threshold)
    }
}
