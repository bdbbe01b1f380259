import Foundation
import Mainspring
import MainspringHTTP
import MainspringServices
import MainspringTestSupport
import Synchronization
import Testing

/// `HTTPServer.shutdown(gracePeriod:)` in a `ServiceGroup`, on real loops: the group stops the
/// HTTP service only once it has drained, before the services it depends on.
@Suite("HTTP: a server that drains before it stops", .serialized)
struct HTTPDrainTests {
    /// Six slow requests in flight when the group is told to stop. The HTTP service depends on
    /// an upstream service (started before it, so stopped after it); each handler asks the
    /// upstream after 500 ms of work and answers 502 if it is gone. Every request gets 200: the
    /// HTTP service's `run` returns only once its requests are answered, and only then does the
    /// group stop the upstream.
    @Test("a ServiceGroup stops the HTTP service once it has drained, then the service it depends on: six requests in flight all answered 200")
    func aGroupStopsTheServerOnceDrained() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let upstreamUp = Atomic<Bool>(true)
        // Each request is held until the server's shutdown begins (so that all six are in flight
        // then, however slowly a loaded machine connects them), then works 500 ms more.
        let stopping = Atomic<Bool>(false)
        let started = Locked<HTTPServer?>(nil)
        let report = Locked<HTTPServer.ShutdownReport?>(nil)
        var routes = HTTPRoutes()
        routes.get("/slow") { request async throws in
            while !stopping.load(ordering: .acquiring) { try await request.loop.sleep(for: .milliseconds(5)) }
            try await request.loop.sleep(for: .milliseconds(500))
            return upstreamUp.load(ordering: .acquiring) ? .text("upstream answered\n") : .status(502)
        }
        let services = ServiceGroup([
            .init(name: "upstream") { context in
                context.started()
                await context.stopRequested()
                upstreamUp.store(false, ordering: .releasing)
            },
            .init(name: "http") { [routes] context in
                let server = try await HTTPServer(group: group, routes: routes)
                started.withLock { $0 = server }
                context.started()
                await context.stopRequested()
                stopping.store(true, ordering: .releasing)
                let drained = await server.shutdown(gracePeriod: .seconds(20))
                report.withLock { $0 = drained }
            },
        ], configuration: { var configuration = ServiceGroup.Configuration()
                            configuration.stopSignals = []
                            configuration.loop = group.loops[0]
                            return configuration }())
        let running = Task { try await services.run() }
        let deadline = ContinuousClock.now + .seconds(30)
        while started.withLock({ $0 }) == nil && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        guard let server = started.withLock({ $0 }) else {
            services.triggerShutdown()
            Issue.record("the HTTP service did not start within 30 s: the group ended with \(await running.result)")
            await group.shutdown(gracePeriod: .seconds(2))
            return
        }
        let client = HTTPClient(loop: group.loops[1], configuration: .init(maxConnectionsPerHost: 8, responseTimeout: .seconds(20)))
        let url = "http://127.0.0.1:\(server.port)/slow"
        async let statuses = withThrowingTaskGroup(of: Int.self) { tasks in
            for _ in 0..<6 { tasks.addTask { try await client.get(url).status } }
            return try await tasks.reduce(into: []) { $0.append($1) }
        }
        // All six with the server before the group is told to stop.
        while server.statistics.snapshot.requestsInFlight < 6 && ContinuousClock.now < deadline + .seconds(30) {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(server.statistics.snapshot.requestsInFlight == 6)
        services.triggerShutdown()
        let answered = try await statuses
        _ = try await running.value
        #expect(answered == Array(repeating: 200, count: 6), "\(answered)")
        let drained = report.withLock { $0 }
        // All six were in flight when the stop reached the server (held until then), and
        // finished; none was cut.
        #expect(drained?.aborted == 0 && drained?.finished == 6, "\(String(describing: drained))")
        client.shutdown()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}
