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

/// The documented async pattern: the listener's connections iterated in a discarding task
/// group, each served in a child task on its own loop.
func startAsyncServer(group: EventLoopGroup, options: Connection.Options = .init(),
                              serve: @escaping @Sendable (Connection) async -> Void = echoLines) async throws
    -> (Listener, Task<Void, any Error>)
{
    let listener = try await Listener(.tcp(), on: group.loops[0], group: group, options: options)
    // The accepting task runs on the acceptor loop too: it needs no thread of the cooperative
    // pool (which the test itself blocks with its plain socket calls).
    let server = Task(executorPreference: group.loops[0]) {
        try await withThrowingDiscardingTaskGroup { tasks in
            for try await connection in listener.connections {
                tasks.addTask(executorPreference: connection.loop) { await serve(connection) }
            }
        }
    }
    return (listener, server)
}

/// Each line back as "echo: <line>", bad input reported; closes when the client is done.
@Sendable func echoLines(_ connection: Connection) async {
    do {
        for try await event in connection.lines {
            switch event {
            case .line(let text): try await connection.send(line: "echo: \(text)")
            case .tooLong(let n): try await connection.send(line: "error: line of \(n) bytes is too long")
            case .invalidUTF8(let n): try await connection.send(line: "error: invalid UTF-8 (\(n) bytes)")
            case .endOfFile, .error: break
            }
        }
    } catch {
        // Closed under us: this connection's task ends, the server goes on.
    }
    connection.close()
}

/// Raises the soft descriptor limit to the hard one; returns the limit now in force.
func raiseDescriptorLimit() -> Int {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
    return Int(clamping: limit.rlim_cur)
}

/// Writes 1 KiB lines to a socket, without blocking, until it stays full for 100 ms (or
/// `limit`); returns how many bytes (the last line may be partial).
private func writeUntilFull(_ fd: Int32, limit: Int) -> Int {
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    let line = Array((String(repeating: "z", count: 1_023) + "\n").utf8)
    var sent = 0
    var offset = 0  // into the line being written
    var idle = 0
    while sent < limit && idle < 50 {
        let n = line.withUnsafeBytes { send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
        if n > 0 {
            sent += n
            offset = (offset + n) % line.count
            idle = 0
        } else {
            idle += 1
            usleep(2_000)  // let the other side read what it will
        }
    }
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
    return sent
}

@Suite("Listener.connections: accepting pauses and resumes with its consumer")
struct ConnectionQueueTests {
    @Test("a connection handed straight to the waiting consumer, or one that failed, lets a paused accept resume")
    func handOffResumesAccepting() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        var fds: [Int32] = [0, 0]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds) == 0)
        let (mine, peer) = (fds[0], fds[1])
        let connection = try await loop.submit {
            Connection(source: try ConnectionSource(loop: loop, endpoint: .descriptor(mine), peer: "test", options: .init()))
        }
        let queue = ConnectionQueue()
        for _ in 0..<Listener.maxWaitingConnections { _ = queue.reserve() }
        #expect(queue.isAcceptPaused, "the last reservation reached the limit")
        // The consumer waits, and the next connection goes straight to it: no `take` sees the
        // count go down, so the hand-off itself must resume accepting (or it stays paused).
        let consumer = Task { () async -> ConnectionQueue.Outcome in
            await withUnsafeContinuation { _ = queue.takeOrPark($0) }
        }
        while !queue.hasWaiter { try await Task.sleep(for: .milliseconds(1)) }
        #expect(queue.push(connection))
        #expect(!queue.isAcceptPaused)
        guard case .element = await consumer.value else {
            Issue.record("the waiting consumer did not get the connection")
            return
        }
        // Paused again, then a reserved connection fails on its way: that too resumes.
        _ = queue.reserve()
        #expect(queue.isAcceptPaused)
        #expect(queue.release())
        #expect(!queue.isAcceptPaused)
        connection.close()
        close(peer)
        await group.shutdown(gracePeriod: .seconds(1))
    }
}

@Suite("Async TCP: connections, lines and sends as Swift concurrency", .serialized)
struct AsyncServerTests {
    @Test("1,000 concurrent connections served by async handlers on a 2-loop group: every reply correct, in order")
    func manyConnections() async throws {
        let limit = raiseDescriptorLimit()
        let connections = min(1_000 * (stressScale > 1 ? 5 : 1), (limit - 256) / 2)
        let lines = 10 * (stressScale > 1 ? 10 : 1)
        let group = try EventLoopGroup(loopCount: 2)
        let (listener, server) = try await startAsyncServer(group: group)
        // All connected at once, then driven by 4 threads: every line pipelined, then every reply.
        let clients = try (0..<connections).map { _ in try TestClient(port: listener.port) }
        let failures = Locked<[String]>([])
        let done = (0..<4).map { part in
            startThread {
                let mine = stride(from: part, to: clients.count, by: 4).map { ($0, clients[$0]) }
                for (index, client) in mine {
                    var request = ""
                    for line in 0..<lines { request += "c\(index) #\(line)\n" }
                    client.send(request)
                }
                for (index, client) in mine {
                    for line in 0..<lines {
                        let reply = client.readLine()
                        if reply != "echo: c\(index) #\(line)" {
                            failures.withLock { $0.append("client \(index) #\(line): \(reply ?? "nil")") }
                            return
                        }
                    }
                    client.shutdownWrite()
                    if let extra = client.readLine() { failures.withLock { $0.append("client \(index): extra \(extra)") } }
                }
            }
        }
        for thread in done { #expect(thread.wait(timeout: .now() + 120) == .success) }
        #expect(failures.value.isEmpty, "\(failures.value.prefix(3))")
        #expect(listener.acceptedCount == connections)
        listener.close()
        try await server.value  // every handler has returned
        let report = await group.shutdown(gracePeriod: .seconds(5))
        #expect(report == .init(droppedWork: 0, closedSources: 0, timedOut: false, stuckLoops: 0, cancelledTasks: 0))
        #expect(group.loops.allSatisfy { $0.metrics.callbacks[.input]! > 0 }, "connections were spread over both loops")
    }

    @Test("a peer that never reads: send suspends, output stays bounded; the peer reads and everything arrives in order")
    func sendWaitsForThePeer() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let outputLimit = 64 << 10
        let sent = Atomic<Int>(0)
        let total = 4_000  // lines of 4 KiB: 16 MB
        let finished = Atomic<Bool>(false)
        let (listener, server) = try await startAsyncServer(group: group, options: .init(outputLimit: outputLimit)) {
            connection in
            let payload = String(repeating: "p", count: 4_090)
            do {
                for i in 0..<total {
                    try await connection.send(line: String(format: "%05d", i) + payload)
                    sent.add(1, ordering: .relaxed)
                    let buffered = try await connection.loop.submit { connection.bufferedOutputBytes }
                    if buffered > outputLimit + 8_192 { Issue.record("buffered output \(buffered) over the limit") }
                }
            } catch {
                Issue.record("send failed: \(error)")
            }
            finished.store(true, ordering: .relaxed)
            connection.close()
        }
        let client = try TestClient(port: listener.port)
        // The client does not read: the sender stops once the kernel buffers and the output
        // limit are full.
        var stalled = 0
        var previous = -1
        for _ in 0..<200 where stalled < 5 {
            usleep(20_000)
            let now = sent.load(ordering: .relaxed)
            stalled = now == previous ? stalled + 1 : 0
            previous = now
        }
        let whileBlocked = sent.load(ordering: .relaxed)
        #expect(stalled >= 5, "the sender never stopped")
        #expect(whileBlocked < total / 2, "\(whileBlocked) lines of 4 KiB went out to a peer that reads nothing")
        let finishedEarly = finished.load(ordering: .relaxed)
        #expect(!finishedEarly)
        // Now the peer reads: the sender resumes, and every line arrives in order.
        for i in 0..<total {
            guard let line = client.readLine() else {
                Issue.record("the connection ended at line \(i)")
                break
            }
            if !line.hasPrefix(String(format: "%05d", i)) || line.count != 4_095 {
                Issue.record("line \(i) is \(line.prefix(10))… (\(line.count) bytes)")
                break
            }
        }
        #expect(client.readLine() == nil)
        let finishedAtEnd = finished.load(ordering: .relaxed)
        #expect(finishedAtEnd)
        listener.close()
        try await server.value
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("a consumer that does not pull: reading pauses, the sender's kernel buffer fills; then every line arrives")
    func readingWaitsForTheConsumer() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let gate = Gate()
        let received = Locked<[String]>([])
        let (listener, server) = try await startAsyncServer(group: group) { connection in
            do {
                var iterator = connection.lines.makeAsyncIterator()
                if case .line(let first)? = try await iterator.next() { received.withLock { $0.append(first) } }
                await gate.wait()  // the consumer stops pulling
                while let event = try await iterator.next() {
                    if case .line(let text) = event { received.withLock { $0.append(text) } }
                }
            } catch {
                Issue.record("reading failed: \(error)")
            }
            connection.close()
        }
        let client = try TestClient(port: listener.port)
        client.send("first\n")
        while received.value.isEmpty { usleep(1_000) }
        // Far more than the kernel's buffers and the connection's input buffer hold.
        let written = writeUntilFull(client.fd, limit: 256 << 20)
        #expect(written < 64 << 20, "\(written) bytes went to a consumer that takes nothing")
        #expect(received.value.count == 1)
        gate.open()
        client.shutdownWrite()
        #expect(client.readLine() == nil)  // the server closes once it has read everything
        // Every whole line, then the partial last one (delivered at the end of input).
        let partial = written % 1_024
        #expect(received.value.count == 1 + written / 1_024 + (partial > 0 ? 1 : 0))
        #expect(received.value.dropFirst().dropLast(partial > 0 ? 1 : 0).allSatisfy { $0.count == 1_023 })
        if partial > 0 { #expect(received.value.last?.count == partial) }
        listener.close()
        try await server.value
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("a connection's task costs its loop a few callbacks per batch of pipelined requests, not per request (nonisolated and actor handlers)")
    func callbacksPerBatch() async throws {
        /// Loop callbacks per request while one client sends 100 batches of 16 pipelined lines.
        func callbacksPerRequest(loop: EventLoop, port: UInt16, request: (Int) -> String) async throws -> Double {
            let client = try TestClient(port: port)
            client.send(request(0) + "\n")
            _ = client.readLine()
            let before = try await loop.submit { loop.metrics.totalCallbacks }
            for batch in 0..<100 {
                client.send((0..<16).map { request(batch * 16 + $0) + "\n" }.joined())
                for _ in 0..<16 { _ = client.readLine() }
            }
            let after = try await loop.submit { loop.metrics.totalCallbacks }
            return Double(after - before - 1) / 1_600
        }
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        // A nonisolated handler (the README's shape).
        let (listener, server) = try await startAsyncServer(group: group)
        let nonisolated = try await callbacksPerRequest(loop: loop, port: listener.port) { "line \($0)" }
        listener.close()
        // An actor pinned to the connection's loop (mainspring-daemon's shape).
        let service = try await AsyncLineService(group: group, options: .init(idleTimeout: nil))
        let actor = try await callbacksPerRequest(loop: loop, port: service.port) { "ECHO \($0)" }
        // About three per batch of 16 (the socket's event, the resumed task, the output's
        // event); a runtime executor switch per request would add one or more per request.
        #expect(nonisolated < 0.5, "\(nonisolated) callbacks per request, nonisolated handler")
        #expect(actor < 0.5, "\(actor) callbacks per request, actor handler")
        try await server.value
        await service.shutdown(gracePeriod: .seconds(1))
    }

    @Test("cancellation: the task iterating connections closes the listener; a cancelled task's next call closes its connection")
    func cancellationOfListenerAndIdleCalls() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let listener = try await Listener(.tcp(), on: loop, group: group)
        let accepting = Task(executorPreference: loop) { () -> String in
            do {
                for try await _ in listener.connections {}
                return "ended"
            } catch {
                return "threw \(type(of: error))"
            }
        }
        // Cancel only once the task is suspended in `connections` (its listener counts it).
        let suspendedDeadline = ContinuousClock.now + .seconds(10)
        var suspended = 0
        while ContinuousClock.now < suspendedDeadline {
            suspended = try await loop.submit {
                loop.openSources.reduce(0) { $0 + (($1 as? ListenerSource)?.suspendedTasks ?? 0) }
            }
            if suspended == 1 { break }
            try await Task.sleep(for: .milliseconds(1))
        }
        #expect(suspended == 1, "the task never suspended waiting for a connection")
        accepting.cancel()
        #expect(await accepting.value == "threw CancellationError")
        let closeDeadline = ContinuousClock.now + .seconds(10)
        while listener.isListening && ContinuousClock.now < closeDeadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(!listener.isListening, "the cancelled iteration did not close the listener")
        // Nobody listens there any more. (A test running in parallel may have been given the
        // freed port for a listener of its own: then the connect works, but not through ours.)
        let acceptedBefore = listener.acceptedCount
        if let stranger = try? TestClient(port: listener.port) {
            // The connection is queued in the kernel once the connect returns. Three round
            // trips to the loop are three passes that each polled after it: a listener still
            // registered there would have seen it and accepted it by the end of them.
            for _ in 0..<3 { try await loop.submit {} }
            #expect(listener.acceptedCount == acceptedBefore, "the closed listener accepted a connection")
            withExtendedLifetime(stranger) {}
        }

        // A task cancelled before it asks for a line or sends: that call closes the connection.
        let second = try await Listener(.tcp(), on: group.loops[0], group: group)
        let client = try TestClient(port: second.port)
        client.send("buffered\n")
        var accepted = second.connections.makeAsyncIterator()
        let connection = try #require(try await accepted.next())
        let outcome = await Task(executorPreference: connection.loop) { () -> String in
            withUnsafeCurrentTask { $0?.cancel() }
            do {
                var lines = connection.lines.makeAsyncIterator()
                _ = try await lines.next()
                return "read a line"
            } catch {
                return "threw \(error)"
            }
        }.value
        #expect(outcome == "threw cancelled")
        #expect(await connection.closed == .cancelled)
        #expect(client.readLine() == nil)
        second.close()
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

/// Holds tasks until opened. Not an actor: a waiting task is resumed straight onto its own
/// executor (its loop), needing no thread of the cooperative pool.
final class Gate: Sendable {
    private let state = Locked<(isOpen: Bool, waiters: [UnsafeContinuation<Void, Never>])>((false, []))

    func wait() async {
        await withUnsafeContinuation { continuation in
            let open = state.withLock { state -> Bool in
                if !state.isOpen { state.waiters.append(continuation) }
                return state.isOpen
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state -> [UnsafeContinuation<Void, Never>] in
            state.isOpen = true
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
