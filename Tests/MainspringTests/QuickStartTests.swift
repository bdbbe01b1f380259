import Foundation
import Testing
@testable import Mainspring

/// The README's quick start, compiled and run against a pipe instead of stdin.
@Suite("README quick start")
struct QuickStartTests {
    @Test("the quick start runs: lines in, ticks, a cross-thread post, stop at end of input")
    func quickStart() async throws {
        let input = Pipe()
        let output = try await onLoopThread { loop -> [String] in
            nonisolated(unsafe) var printed: [String] = []
            @Sendable func print(_ text: String) { printed.append(text) }

            let ticker = loop.schedule(every: .milliseconds(10)) { _ in print("tick") }
            let reader = try loop.readLines(from: input.readEnd) { event in
                switch event {
                case .line(let text): print("got \(text)")
                case .tooLong(let n), .invalidUTF8(let n): print("skipped \(n) bad bytes")
                case .endOfFile, .error:
                    ticker.cancel()
                    loop.stop()
                }
            }
            Thread.detachNewThread { loop.execute { print("hello from another thread") } }
            startThread {
                usleep(30_000)
                input.write("one\n")
                input.write([0xFF, 0x0A])
                input.closeWrite()
            }
            try loop.run()
            _ = reader

            loop.execute {
                var reply: String?
                loop.schedule(after: .milliseconds(5)) { reply = "pong" }
                if loop.spin(until: { reply != nil }, timeout: .seconds(1)) { print(reply!) }
            }
            loop.spin(until: { printed.last == "pong" }, timeout: .seconds(2))
            return printed
        }
        #expect(output.contains("got one"))
        #expect(output.contains("skipped 1 bad bytes"))
        #expect(output.contains("hello from another thread"))
        #expect(output.contains("tick"))
        #expect(output.last == "pong")
    }

    @Test("the README's feeder example runs: work, input between chunks, a report")
    func feederExample() async throws {
        let (printed, report) = try await onLoopThread { loop -> ([String], FairnessReport) in
            nonisolated(unsafe) var printed: [String] = []
            @Sendable func print(_ text: String) { printed.append(text) }
            func render(_ row: Int) { spin(for: .microseconds(500)) }

            let feeder = Feeder(loop: loop)
            let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(10)))
            input.start()
            let job = feeder.feed(chunks: 200) { row in render(row) }
            job.onCompletion { outcome in
                input.stop()
                print("rendering \(outcome): \(job.progress)")
            }
            feeder.enqueue { print("runs after the job") }
            loop.spin(until: { job.isFinished && input.isFinished }, timeout: .seconds(30))
            let report = FairnessReport(metrics: loop.metrics, input: input, work: job)
            print(report.table)
            return (printed, report)
        }
        #expect(printed.first == "rendering completed: 200/200")
        // The enqueued chunk runs in a later turn, maybe after the spin ended; the report is last.
        #expect(printed.last?.hasPrefix("input events") == true)
        #expect(report.chunks == 200)
        #expect(report.inputLatency.count >= 5)
    }
}

/// The README's daemon shape, compiled and exercised on an ephemeral port (no signal: the test
/// shuts the group down itself).
@Suite("README daemon on an EventLoopGroup")
struct ReadmeGroupDaemonTests {
    @Test("the README's group daemon answers lines and shuts down cleanly")
    func groupDaemon() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let acceptor = group.loops[0]
        let port = Locked<UInt16>(0)
        let ready = DispatchSemaphore(value: 0)
        acceptor.execute {
            let listener = try? Listener(host: "127.0.0.1", port: 0, on: acceptor, group: group,
                                         options: .init(maxLineLength: 4_096, outputLimit: 256 << 10,
                                                        idleTimeout: .seconds(300))) { connection in
                connection.readLines { event in
                    switch event {
                    case .line(let text): connection.writeLine("you said: \(text)")
                    case .tooLong, .invalidUTF8: connection.writeLine("ERR bad line")
                    case .endOfFile, .error: connection.close()
                    }
                }
                connection.onClose { _ in }
            }
            port.withLock { $0 = listener?.port ?? 0 }
            ready.signal()
        }
        ready.wait()
        let client = try TestClient(port: port.value)
        client.send("hi\n")
        #expect(client.readLine() == "you said: hi")
        client.send(String(repeating: "x", count: 5_000) + "\n")
        #expect(client.readLine() == "ERR bad line")
        client.shutdownWrite()
        #expect(client.readLine() == nil)
        let report = group.shutdown(gracePeriod: .seconds(5))
        #expect(report.droppedWork == 0 && !report.timedOut)
    }
}
