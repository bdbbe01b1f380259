import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringHTTP
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The gauge's arithmetic, exactly: its instants are given, not read.
@Suite("Load shedding: the queue-wait gauge")
struct QueueWaitGaugeTests {
    private let ms: UInt64 = 1_000_000

    @Test("a window's p99 is over the target when more than 1% of its waits are; the verdict holds for the next window")
    func percentileVerdict() {
        var gauge = QueueWaitGauge(target: .milliseconds(10), window: .milliseconds(100))
        // Window 1 (instants 1…99 ms): 100 waits, one of them over the target: p99 is not over.
        for index in 0..<100 { gauge.record(wait: index == 50 ? 11 * ms : 2 * ms, now: (1 + UInt64(index)) * ms) }
        #expect(!gauge.isOverTarget, "no window closed yet")
        // Window 2 opens at 101 ms and closes window 1: 1 of 100 is exactly 1%, not more.
        gauge.record(wait: 2 * ms, now: 101 * ms)
        #expect(!gauge.isOverTarget)
        // Window 2 gets 99 more, two of them just over the target: 2 of 100 is over 1%.
        for index in 0..<99 { gauge.record(wait: index < 2 ? 10 * ms + 1 : 10 * ms, now: (102 + UInt64(index)) * ms) }
        #expect(!gauge.isOverTarget, "window 2 is still open: window 1's verdict holds")
        gauge.record(wait: 0, now: 201 * ms)
        #expect(gauge.isOverTarget, "2 of 100 waits over 10 ms: the p99 is over")
        // A wait of exactly the target is not over it.
        var exact = QueueWaitGauge(target: .milliseconds(10), window: .milliseconds(100))
        for index in 0..<10 { exact.record(wait: 10 * ms, now: (1 + UInt64(index)) * ms) }
        exact.record(wait: 0, now: 150 * ms)
        #expect(!exact.isOverTarget)
    }

    @Test("after a gap of two windows with no request, the old verdict no longer holds")
    func staleVerdict() {
        var gauge = QueueWaitGauge(target: .milliseconds(10), window: .milliseconds(100))
        gauge.record(wait: 50 * ms, now: 1 * ms)
        gauge.record(wait: 50 * ms, now: 120 * ms)  // closes [1, 101): over
        #expect(gauge.isOverTarget)
        gauge.record(wait: 1 * ms, now: 330 * ms)  // window [120, 220) ended 110 ms ago: stale
        #expect(!gauge.isOverTarget)
        // Within one window of its end, a verdict is used.
        gauge.record(wait: 50 * ms, now: 335 * ms)
        gauge.record(wait: 1 * ms, now: 520 * ms)  // [330, 430) ended 90 ms ago: 1 of 2 over
        #expect(gauge.isOverTarget)
    }

    @Test("the verdict read without a sample (requests shed before their body, never dispatched) goes stale as time passes")
    func verdictWithoutSamples() {
        var gauge = QueueWaitGauge(target: .milliseconds(10), window: .milliseconds(100))
        gauge.record(wait: 50 * ms, now: 1 * ms)
        let closed = gauge.verdict(now: 120 * ms)
        #expect(closed, "[1, 101) closed: over")
        let open = gauge.verdict(now: 200 * ms)
        #expect(open, "the window from 120 ms is still open: the verdict holds")
        // No dispatched request since: at 230 ms the window [120, 220) closes empty, and so
        // the overload's verdict is gone, though nothing was recorded to say so.
        let emptied = gauge.verdict(now: 230 * ms)
        #expect(!emptied)
        let later = gauge.verdict(now: 5_000 * ms)
        #expect(!later)
    }
}

/// A server on one loop whose `/work` burns `work` of CPU in its handler, with `/healthz`.
private final class BusyServer: @unchecked Sendable {
    let group: EventLoopGroup
    let server: HTTPServer

    init(shedding: HTTPServer.LoadShedding?, work: Duration) throws {
        group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPRoutes()
        routes.get("/work") { _ in
            let end = ContinuousClock.now + work
            var x: UInt64 = 1
            while ContinuousClock.now < end { x = x &* 6364136223846793005 &+ 1 }
            return .text(x == 0 ? "never\n" : "done\n")
        }
        routes.get("/healthz") { _ in .text("ok\n") }
        var configuration = HTTPServer.Configuration()
        configuration.loadShedding = shedding
        server = try HTTPServer(group: group, configuration: configuration, routes: routes)
    }

    func stop() {
        server.close()
        group.shutdownBlocking(gracePeriod: .seconds(5))
    }
}

/// Statuses (and each 503's Retry-After) of `count` requests for `path` from each of
/// `clients` tasks at once, one request at a time per task.
private func offer(_ path: String, port: UInt16, clients: Int, count: Int, on client: HTTPClient) async -> [(Int, String?)] {
    await withTaskGroup(of: [(Int, String?)].self) { tasks in
        for _ in 0..<clients {
            tasks.addTask {
                var seen: [(Int, String?)] = []
                for _ in 0..<count {
                    do {
                        let response = try await client.get("http://127.0.0.1:\(port)\(path)")
                        seen.append((response.status, response.headers["retry-after"]))
                    } catch {
                        seen.append((0, "\(error)"))
                    }
                }
                return seen
            }
        }
        var all: [(Int, String?)] = []
        for await seen in tasks { all += seen }
        return all
    }
}

@Suite("Load shedding: an overloaded server answers 503 at once and keeps /healthz", .serialized)
struct LoadSheddingTests {
    @Test("at several times its capacity: some requests served, the excess shed with 503 + Retry-After, every /healthz answered 200, counted on /metrics")
    func shedsOverload() async throws {
        let busy = try BusyServer(shedding: .init(queueWaitTarget: .milliseconds(20), window: .milliseconds(50)),
                                  work: .milliseconds(10))
        let clients = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: clients.loops[0], configuration: .init(maxConnectionsPerHost: 32, responseTimeout: .seconds(120)))
        async let health = offer("/healthz", port: busy.server.port, clients: 1, count: 20, on: client)
        // 16 clients each with one request in flight: 16 × 10 ms queued behind one another.
        let work = await offer("/work", port: busy.server.port, clients: 16, count: 15, on: client)
        let healthStatuses = await health
        let served = work.filter { $0.0 == 200 }.count
        let shed = work.filter { $0.0 == 503 }
        #expect(served + shed.count == work.count, "only 200 and 503: \(Set(work.map { "\($0.0) \($0.1 ?? "")" }))")
        #expect(served > 0, "the server kept serving")
        #expect(!shed.isEmpty, "16 requests at once on 10 ms each wait up to 160 ms, over the 20 ms target: some are shed")
        #expect(shed.allSatisfy { $0.1 == "1" }, "each 503 says Retry-After: 1")
        #expect(healthStatuses.allSatisfy { $0.0 == 200 }, "/healthz is never shed: \(healthStatuses.map(\.0))")
        let statistics = busy.server.statistics.snapshot
        #expect(statistics.requestsShed == shed.count && statistics.requestsPastDeadline == 0, "\(statistics)")
        let metrics = LoopMetricsExporter(group: busy.group).render(snapshots: [], server: busy.server.statistics)
        #expect(metrics.contains("mainspring_http_requests_shed_total{reason=\"lag\"} \(shed.count)"), "\(metrics.suffix(600))")
        client.shutdown()
        busy.stop()
        await clients.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a request that waited past its deadline is answered 503, not run; without shedding every request is served however late")
    func deadlineAndOff() async throws {
        let busy = try BusyServer(shedding: .init(queueWaitTarget: .seconds(60), requestDeadline: .milliseconds(60)),
                                  work: .milliseconds(10))
        let clients = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: clients.loops[0], configuration: .init(maxConnectionsPerHost: 32, responseTimeout: .seconds(120)))
        let work = await offer("/work", port: busy.server.port, clients: 12, count: 5, on: client)
        let late = work.filter { $0.0 == 503 }.count
        #expect(work.allSatisfy { $0.0 == 200 || $0.0 == 503 }, "\(work.map(\.0))")
        #expect(late > 0, "12 requests at once on 10 ms each: the later ones wait past 60 ms")
        #expect(work.contains { $0.0 == 200 })
        let statistics = busy.server.statistics.snapshot
        #expect(statistics.requestsPastDeadline == late && statistics.requestsShed == 0, "\(statistics)")
        busy.stop()

        let unshed = try BusyServer(shedding: nil, work: .milliseconds(10))
        let all = await offer("/work", port: unshed.server.port, clients: 12, count: 3, on: client)
        #expect(all.allSatisfy { $0.0 == 200 }, "\(all.map(\.0))")
        #expect(unshed.server.statistics.snapshot.requestsShed == 0)
        client.shutdown()
        unshed.stop()
        await clients.shutdown(gracePeriod: .seconds(2))
    }

    @Test("work handed to a feeder: requests are routed at once while the work piles up; with the feeder watched, its backlog sheds /fed and spares /healthz")
    func shedsOnFeederBacklog() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let feeder = Feeder(loop: group.loops[0])
        let longJobRunning = Locked(false)
        var routes = HTTPRoutes()
        // Each chunk 200 µs of CPU: the loop reads and routes requests between chunks.
        routes.on([.get], "/fed", responding: { request, responder in
            let chunks = Int(request.query("chunks") ?? "1") ?? 1
            let job = feeder.feed(chunks: chunks) { _ in
                if chunks > 1 { longJobRunning.withLock { $0 = true } }
                let end = ContinuousClock.now + .microseconds(200)
                while ContinuousClock.now < end {}
            }
            job.onCompletion { outcome in responder.send(.text("\(outcome)\n")) }
        })
        routes.get("/healthz") { _ in .text("ok\n") }
        var configuration = HTTPServer.Configuration()
        configuration.loadShedding = .init(queueWaitTarget: .milliseconds(20), watchedFeeders: [feeder])
        let server = try await HTTPServer(group: group, configuration: configuration, routes: routes)
        let clients = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: clients.loops[0], configuration: .init(maxConnectionsPerHost: 16, responseTimeout: .seconds(120)))
        let base = "http://127.0.0.1:\(server.port)"
        // A job of 20 s of chunks, running, then one queued behind it: the backlog grows from there.
        let long = Task { try await client.get("\(base)/fed?chunks=100000") }
        #expect(await eventually { longJobRunning.value }, "the long job never started")
        let queued = Task { try await client.get("\(base)/fed?chunks=1") }
        // Until the queued job has waited past the target (it waits on: the long job runs 20 s).
        let deadline = ContinuousClock.now + .seconds(30)
        #expect(try await waitForBacklog(of: feeder, over: .milliseconds(20)))
        #expect(server.statistics.snapshot.requestsShed == 0, "the requests' own queue waits stay short: nothing shed for them")
        let shed = try await client.get("\(base)/fed?chunks=1")
        #expect(shed.status == 503 && shed.headers["retry-after"] == "1", "shed: the feeder's oldest job has waited over 20 ms")
        #expect(try await client.get("\(base)/healthz").status == 200, "/healthz is never shed")
        #expect(server.statistics.snapshot.requestsShed >= 1)
        feeder.cancelAll()
        #expect(try await long.value.text == "cancelled\n")
        #expect(try await queued.value.text == "cancelled\n")
        // The backlog is gone: /fed is served again.
        var served = false
        while !served && ContinuousClock.now < deadline + .seconds(30) {
            served = try await client.get("\(base)/fed?chunks=1").status == 200
        }
        #expect(served)
        client.shutdown()
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
        await clients.shutdown(gracePeriod: .seconds(2))
    }

    @Test("while shedding, a request that announces a body is answered 503 + Retry-After as soon as its head is in: its body is never read; /healthz's body is")
    func shedsBeforeTheBody() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let feeder = Feeder(loop: loop)
        var routes = HTTPRoutes()
        routes.post("/upload") { request in .text("\(request.body.count) bytes\n") }
        routes.post("/healthz") { request in .text("ok \(request.body.count)\n") }
        var configuration = HTTPServer.Configuration()
        configuration.bodyTimeout = .seconds(10)  // a body that never comes ends the exchange at the latest then
        configuration.loadShedding = .init(queueWaitTarget: .milliseconds(20), watchedFeeders: [feeder])
        let server = try await HTTPServer(group: group, configuration: configuration, routes: routes)
        let port = server.port
        // Overloaded, as the watched feeder says: paused with a job that waits to start, until it
        // has waited past the target.
        try await loop.submit {
            feeder.pause()
            _ = feeder.feed(chunks: 1) { _ in }
        }
        #expect(try await waitForBacklog(of: feeder, over: .milliseconds(20)))
        let (shed, sending, exempt) = await onPlainThread { () -> (String, String, String) in
            // A head announcing 10 MB, and not one byte of the body: the answer comes anyway.
            let uploader = try? TestClient(port: port)
            uploader?.send("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n")
            let shed = uploader?.readToEnd() ?? ""
            // One that goes on sending its body for a while before it reads (a slow uploader):
            // the server reads and drops what comes after its answer (a lingering close), so
            // the answer is not lost to the reset that closing on unread input would send.
            var refusedSends = 0
            let busy = try? TestClient(port: port)
            busy?.send("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n")
            let chunk = [UInt8](repeating: 0x62, count: 16_384)
            for _ in 0..<20 {  // 0.4 s: past the sweep that closed at once (≤ 250 ms), within the 2 s linger
                if let busy, chunk.withUnsafeBytes({ Glibc.send(busy.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) < 0 {
                    refusedSends += 1  // EPIPE or ECONNRESET: the server closed on it
                }
                usleep(20_000)
            }
            let sending = busy?.readToEnd() ?? ""
            let prober = try? TestClient(port: port)
            prober?.send("POST /healthz HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            return (shed, sending + (refusedSends > 0 ? " [\(refusedSends) sends refused]" : ""), prober?.readToEnd() ?? "")
        }
        #expect(shed.hasPrefix("HTTP/1.1 503 Service Unavailable\r\n"), "\(shed)")
        #expect(shed.contains("\r\nRetry-After: 1\r\n") && shed.contains("\r\nConnection: close\r\n"), "\(shed)")
        #expect(sending.hasPrefix("HTTP/1.1 503 Service Unavailable\r\n") && !sending.contains("sends refused"),
                "the uploader's sends go on being read after the answer (within the 2 s linger): \(sending)")
        #expect(exempt.hasPrefix("HTTP/1.1 200") && exempt.hasSuffix("ok 5\n"), "\(exempt)")
        #expect(server.statistics.snapshot.requestsShed == 2)
        feeder.cancelAll()
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a route limited to 2 in flight: with 2 parked, 4 more get 503 + Retry-After at once; places come back when responses are written")
    func routeConcurrencyLimit() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let parked = Locked<[HTTPResponder]>([])
        var routes = HTTPRoutes()
        routes.on([.get], "/parked", responding: { _, responder in parked.withLock { $0.append(responder) } })
        routes.limitConcurrency(of: "/parked", to: 2)
        routes.get("/free") { _ in .text("free\n") }
        let server = try await HTTPServer(group: group, routes: routes)
        let clients = try EventLoopGroup(loopCount: 1)
        let client = HTTPClient(loop: clients.loops[0], configuration: .init(maxConnectionsPerHost: 16, responseTimeout: .seconds(120)))
        let url = "http://127.0.0.1:\(server.port)/parked"
        let first = (0..<2).map { _ in Task { try await client.get(url) } }
        // Both reach their handler (and hold their places) before the rest are sent.
        let deadline = ContinuousClock.now + .seconds(30)
        while parked.withLock({ $0.count }) < 2 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(parked.withLock { $0.count } == 2)
        let refused = try await withThrowingTaskGroup(of: (Int, String?).self) { tasks in
            for _ in 0..<4 { tasks.addTask { let r = try await client.get(url); return (r.status, r.headers["retry-after"]) } }
            return try await tasks.reduce(into: []) { $0.append($1) }
        }
        #expect(refused.count == 4 && refused.allSatisfy { $0.0 == 503 && $0.1 == "1" }, "\(refused)")
        #expect(try await client.get("http://127.0.0.1:\(server.port)/free").status == 200, "other routes are not limited")
        for responder in parked.withLock({ $0 }) { responder.send(.text("done\n")) }
        for task in first { #expect(try await task.value.status == 200) }
        // The places are back: the next one is served.
        let again = Task { try await client.get(url) }
        while parked.withLock({ $0.count }) < 3 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        parked.withLock { $0.last?.send(.text("done\n")) }
        #expect(try await again.value.status == 200)
        #expect(server.statistics.snapshot.requestsOverLimit == 4)
        client.shutdown()
        await server.closeAndWait()
        await group.shutdown(gracePeriod: .seconds(2))
        await clients.shutdown(gracePeriod: .seconds(2))
    }
}

/// Waits (up to 30 s) until the job that has waited longest in `feeder` has waited more than
/// `target` — a wait that only grows while the feeder is held back; whether it got there.
private func waitForBacklog(of feeder: Feeder, over target: Duration) async throws -> Bool {
    let deadline = ContinuousClock.now + .seconds(30)
    while ContinuousClock.now < deadline {
        if try await feeder.loop.submit({ feeder.oldestPendingJobWait }) > target { return true }
        try await Task.sleep(for: .milliseconds(5))
    }
    return false
}
