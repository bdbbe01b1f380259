import ExampleServices
import Foundation
import Synchronization
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// Async TCP continued: the priority a resumed task runs at, bad input through `lines` and
/// `bytes`, two loops talking, and a group shut down with handlers in flight (the servers of
/// AsyncNetworkTests.swift's `startAsyncServer`).
@Suite("Async TCP: priorities, bad input, loop to loop, shutdown in flight", .serialized)
struct AsyncServerBehaviourTests {
    @Test("a task resumed by input runs at .input priority: before posted work that was queued first")
    func inputResumesAtInputPriority() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let log = Locked<[String]>([])
        let waiting = Atomic<Bool>(false)
        let (listener, server) = try await startAsyncServer(group: group) { connection in
            do {
                var lines = connection.lines.makeAsyncIterator()
                waiting.store(true, ordering: .releasing)
                if case .line(let text)? = try await lines.next() { log.withLock { $0.append(text) } }
            } catch {
                Issue.record("lines threw \(error)")
            }
            connection.close()
        }
        let client = try TestClient(port: listener.port)
        let deadline = ContinuousClock.now + .seconds(30)
        while !waiting.load(ordering: .acquiring) && ContinuousClock.now < deadline { usleep(1_000) }
        let handlerStarted = waiting.load(ordering: .acquiring)
        try #require(handlerStarted, "the handler never started")
        // Posted after the handler's job set `waiting`: it runs once that job has ended, with the
        // handler suspended in `lines`.
        try await loop.submit {}
        // While the loop is busy, queue posted work, then let the line arrive behind it.
        let busy = DispatchSemaphore(value: 0)
        loop.execute { busy.wait() }
        for i in 0..<5 { loop.execute { log.withLock { $0.append("work \(i)") } } }
        client.send("line\n")
        usleep(20_000)
        busy.signal()
        #expect(client.readLine() == nil)  // the handler has run and closed
        try await loop.submit {}  // posted after the work: it has all run
        // After the busy callback the loop polls: the line resumes the task at .input, ahead
        // of the .normal work already queued.
        #expect(log.value.first == "line", "\(log.value)")
        #expect(log.value.count == 6, "\(log.value)")
        listener.close()
        try await server.value
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("lines: EOF mid-line, overlong lines, invalid UTF-8 and NUL bytes, in order; bytes: chunks then the end")
    func junkThroughLines() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let events = Locked<[LineEvent]>([])
        let (listener, server) = try await startAsyncServer(group: group, options: .init(maxLineLength: 16)) {
            connection in
            do {
                for try await event in connection.lines { events.withLock { $0.append(event) } }
            } catch {
                Issue.record("lines threw \(error)")
            }
            connection.close()
        }
        let client = try TestClient(port: listener.port)
        var junk = Array("ok\r\n".utf8) + Array(String(repeating: "x", count: 40).utf8) + [0x0A]
        junk += [0x61, 0x00, 0x62, 0x0A] + [0xFF, 0xFE, 0x0A] + Array("after\n".utf8) + Array("tail".utf8)
        _ = junk.withUnsafeBytes { send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        client.shutdownWrite()
        #expect(client.readLine() == nil)
        #expect(events.value == [.line("ok"), .tooLong(40), .line("a\u{0}b"), .invalidUTF8(2), .line("after"),
                                 .line("tail"), .endOfFile])
        listener.close()
        try await server.value

        // The same input as bytes: every byte, in order, then the end of the sequence.
        let chunks = Locked<[UInt8]>([])
        let (bytesListener, bytesServer) = try await startAsyncServer(group: group) { connection in
            do {
                for try await chunk in connection.bytes { chunks.withLock { $0 += chunk } }
            } catch {
                Issue.record("bytes threw \(error)")
            }
            connection.close()
        }
        let bytesClient = try TestClient(port: bytesListener.port)
        _ = junk.withUnsafeBytes { send(bytesClient.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        bytesClient.shutdownWrite()
        #expect(bytesClient.readLine() == nil)
        #expect(chunks.value == junk)
        bytesListener.close()
        try await bytesServer.value
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("async connect, send and lines between two Mainspring loops; a refused connect throws")
    func connectAndTalk() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let (listener, server) = try await startAsyncServer(group: group)
        let client = try await Connection.connect(to: "127.0.0.1", port: listener.port, on: group.loops[1])
        try await client.send(line: "one")
        try await client.send("two\n")
        try await client.send(Array("three\n".utf8))
        var replies: [String] = []
        for try await event in client.lines {
            if case .line(let text) = event { replies.append(text) }
            if replies.count == 3 { break }
        }
        #expect(replies == ["echo: one", "echo: two", "echo: three"])
        client.close()
        #expect(await client.closed == .closed)
        #expect(!client.isOpen)
        await #expect(throws: Connection.CloseReason.closed) { try await client.send(line: "late") }

        listener.close()
        try await server.value
        // A port bound for the whole test and never listened on: the connect is refused.
        let refusing = try RefusingPort()
        do {
            let stranger = try await Connection.connect(to: "127.0.0.1", port: refusing.port, on: group.loops[1])
            Issue.record("a connect to a port nobody listens on succeeded")
            stranger.close()
        } catch {
            guard case .system(_, let code) = error else {
                Issue.record("a refused connect threw \(error), not .system(errno: ECONNREFUSED)")
                throw error
            }
            #expect(code == ECONNREFUSED, "errno \(code)")
        }
        withExtendedLifetime(refusing) {}
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("group shutdown with async handlers in flight: they finish within the grace period; after it they are cancelled and counted")
    func shutdownWithHandlersInFlight() async throws {
        // In flight, finishing in time: each handler waits 300 ms on its loop's timer, replies, closes.
        let group = try EventLoopGroup(loopCount: 2)
        let sleeping = Counter()
        let (listener, server) = try await startAsyncServer(group: group) { connection in
            do {
                for try await event in connection.lines {
                    guard case .line(let text) = event else { continue }
                    sleeping.increment()
                    try await connection.loop.sleep(for: .milliseconds(300))
                    try await connection.send(line: "late \(text)")
                    break
                }
            } catch {
                Issue.record("handler failed: \(error)")
            }
            connection.close()
        }
        let clients = try (0..<4).map { _ in try TestClient(port: listener.port) }
        for (index, client) in clients.enumerated() { client.send("\(index)\n") }
        // Every connection accepted and every handler at its sleep: then the shutdown comes.
        let deadline = ContinuousClock.now + .seconds(30)
        while (listener.acceptedCount < clients.count || sleeping.count < clients.count) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(1))
        }
        #expect(listener.acceptedCount == clients.count && sleeping.count == clients.count,
                "accepted \(listener.acceptedCount), sleeping \(sleeping.count) of \(clients.count)")
        listener.close()
        let report = await group.shutdown(gracePeriod: .seconds(5))
        #expect(!report.timedOut && report.closedSources == 0 && report.stuckLoops == 0 && report.cancelledTasks == 0,
                "\(report)")
        // Each loop ends once it is quiet. The accepting task (on loop 0) waits for its handlers,
        // which may end on loop 1 after loop 0 went quiet: its last resumption then reaches a
        // loop that has ended, and is counted as dropped work and run on the fallback queue —
        // the one item of work that may be counted here. Nothing is lost: the task finishes.
        #expect(report.droppedWork <= 1, "\(report)")
        try await server.value
        for (index, client) in clients.enumerated() { #expect(client.readLine() == "late \(index)") }

        // In flight past the grace period: handlers waiting for input that never comes.
        let stuck = try EventLoopGroup(loopCount: 2)
        let outcomes = Locked<[Connection.CloseReason]>([])
        let waiting = Counter()
        let (stuckListener, stuckServer) = try await startAsyncServer(group: stuck) { connection in
            do throws(Connection.CloseReason) {
                waiting.increment()
                for try await _ in connection.lines {}
            } catch {
                outcomes.withLock { $0.append(error) }
            }
        }
        let idle = try (0..<6).map { _ in try TestClient(port: stuckListener.port) }
        let stuckDeadline = ContinuousClock.now + .seconds(30)
        while (stuckListener.acceptedCount < idle.count || waiting.count < idle.count) && ContinuousClock.now < stuckDeadline {
            try await Task.sleep(for: .milliseconds(1))
        }
        #expect(stuckListener.acceptedCount == idle.count && waiting.count == idle.count,
                "accepted \(stuckListener.acceptedCount), started \(waiting.count) of \(idle.count)")
        // Posted after every handler's first job: each loop runs it once they are suspended in `lines`.
        for loop in stuck.loops { try await loop.submit {} }
        stuckListener.close()
        let start = ContinuousClock.now
        let forced = await stuck.shutdown(gracePeriod: .milliseconds(200))
        #expect(ContinuousClock.now - start < .seconds(3))
        #expect(forced.timedOut)
        #expect(forced.cancelledTasks == idle.count, "\(forced)")
        #expect(forced.closedSources == idle.count)
        #expect(forced.stuckLoops == 0)
        try await stuckServer.value  // every handler has returned
        #expect(outcomes.value == Array(repeating: .cancelled, count: idle.count))
        for client in idle { #expect(client.readLine() == nil) }
    }
}
