import Foundation
import Mainspring
import MainspringHTTP

/// The HTTP side of `mainspring-daemon`, on the loops of an `EventLoopGroup`:
///
/// | request | response |
/// |---|---|
/// | `GET /metrics` | the loops', the work jobs' and the server's metrics (Prometheus text) |
/// | `GET /healthz` | `ok`, or `503` naming a loop stuck in one callback for over `healthThreshold` |
/// | `POST /echo` | the body back, with its `Content-Type` |
/// | `GET /ws/echo` | a WebSocket that sends every text and binary message back (permessage-deflate when offered) |
/// | `GET /work?n=…` | n chunks of `WorkUnit` (about 50 µs each) fed through the loop's `Feeder`, streamed: `progress 10% (…)` per tenth, then `result <n> <checksum>` |
///
/// A library, so that the daemon, the benchmark and the tests serve the very same routes.
public enum HTTPService {
    /// The largest `n` of `/work`.
    public static let maxWorkChunks = 1_000_000

    /// The WebSocket settings of `/ws/echo`: messages up to 16 MiB, permessage-deflate when the
    /// client offers it, the rest the defaults.
    public static let webSocketConfiguration = WebSocket.Configuration(maxMessageBytes: 16 << 20, compression: .init())

    /// The routes, with one `Feeder` per loop of `group` for `/work` (`feeders`, or new ones)
    /// and `exporter` tracking the work jobs. Pass the feeders to shed load on their backlog
    /// (`HTTPServer.LoadShedding.watchedFeeders`). `workUnit` is one chunk of `/work`
    /// (`WorkUnit.run` by default): a simulation passes one that also charges its modelled CPU.
    public static func routes(group: EventLoopGroup, exporter: LoopMetricsExporter,
                              healthThreshold: Duration = .seconds(1), feeders: [Feeder]? = nil,
                              workUnit: @escaping @Sendable (_ seed: UInt64, _ checksum: UInt64) -> UInt64 = WorkUnit.run)
        -> HTTPRoutes
    {
        let feeders = FeederSet(loops: group.loops, feeders: feeders)
        let sequence = Counter()
        var routes = HTTPRoutes()
        routes.serveMetrics(exporter: exporter)
        routes.serveHealth(of: group, threshold: healthThreshold)
        routes.post("/echo") { request in
            var headers: HTTPHeaders = [:]
            headers.add("Content-Type", request.headers["Content-Type"] ?? "application/octet-stream")
            return HTTPResponse(headers: headers, body: request.body)
        }
        routes.webSocket("/ws/echo", configuration: webSocketConfiguration) { socket in
            for await message in socket.messages { try await socket.send(message) }
        }
        routes.on([.get], "/work", streaming: { request, writer in
            guard let text = request.query("n"), let chunks = Int(text), (1...maxWorkChunks).contains(chunks) else {
                throw HTTPError.badRequest("n must be a number in 1...\(maxWorkChunks)")
            }
            let feeder = feeders.feeder(for: request.loop)
            writer.start(headers: ["Content-Type": "text/plain; charset=utf-8"])
            var checksum: UInt64 = 0
            var reported = 0
            var job: FeedJob?
            let made = feeder.feed(chunks: chunks) { index in
                checksum = workUnit(UInt64(index), checksum)
                let tenth = (index + 1) * 10 / chunks
                if tenth > reported && tenth < 10 {
                    reported = tenth
                    writer.write("progress \(tenth * 10)% (\(index + 1)/\(chunks))\n")
                    if !writer.isWritable, let job {
                        job.pause()
                        writer.onWritable { job.resume() }
                    }
                }
            }
            job = made
            exporter.track(made, name: "work-\(sequence.next())")
            made.onCompletion { outcome in
                if outcome == .completed { writer.write("result \(chunks) \(checksum)\n") }
                writer.finish()
            }
            writer.onCancel { made.cancel() }
        })
        return routes
    }
}

/// One `Feeder` per loop (`.background`, the default budget).
private final class FeederSet: Sendable {
    private let feeders: [(loop: EventLoop, feeder: Feeder)]
    init(loops: [EventLoop], feeders given: [Feeder]?) {
        feeders = loops.map { loop in (loop, given?.first { $0.loop === loop } ?? Feeder(loop: loop)) }
    }
    func feeder(for loop: EventLoop) -> Feeder {
        feeders.first { $0.loop === loop }?.feeder ?? Feeder(loop: loop)
    }
}

private final class Counter: Sendable {
    private let value = Guarded(0)
    func next() -> Int { value.withLock { $0 += 1; return $0 } }
}
