import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// The README's code, compiled and run.
@Suite("README examples")
struct QuickStartTests {
    /// The package root, from this file's path (Tests/MainspringTests/QuickStartTests.swift).
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test("the README's quick start is Examples/QuickStart/main.swift, character for character")
    func quickStartIsTheExample() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let example = try String(contentsOf: Self.root.appendingPathComponent("Examples/QuickStart/main.swift"),
                                 encoding: .utf8)
        let section = try #require(readme.range(of: "## Quick start"))
        let blockStart = try #require(readme.range(of: "```swift\n", range: section.upperBound..<readme.endIndex))
        let blockEnd = try #require(readme.range(of: "```\n", range: blockStart.upperBound..<readme.endIndex))
        #expect(String(readme[blockStart.upperBound..<blockEnd.lowerBound]) == example)
    }

    @Test("the quick start runs: lines and bad bytes from stdin, a result from another thread, stop at end of input")
    func quickStartRuns() async throws {
        let result = try await runExecutable("mainspring-quickstart", stdinBytes: Array("one\n".utf8) + [0xFF, 0x0A, 0x74, 0x77, 0x6F])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stderr.isEmpty)
        let lines = result.lines.filter { $0 != "tick" }
        #expect(Set(lines) == ["got one", "skipped 1 bad bytes", "got two", "sum from another thread: 500000500000"])
        #expect(lines.firstIndex(of: "got one")! < lines.firstIndex(of: "skipped 1 bad bytes")!)
        #expect(lines.firstIndex(of: "skipped 1 bad bytes")! < lines.firstIndex(of: "got two")!)
    }

    @Test("the README's async daemon is Examples/Echo/main.swift, character for character")
    func asyncDaemonIsTheExample() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let example = try String(contentsOf: Self.root.appendingPathComponent("Examples/Echo/main.swift"),
                                 encoding: .utf8)
        let section = try #require(readme.range(of: "## A daemon with async/await"))
        let blockStart = try #require(readme.range(of: "```swift\n", range: section.upperBound..<readme.endIndex))
        let blockEnd = try #require(readme.range(of: "```\n", range: blockStart.upperBound..<readme.endIndex))
        #expect(String(readme[blockStart.upperBound..<blockEnd.lowerBound]) == example)
    }

    @Test("the async daemon runs: replies per line, bad lines refused, several clients at once, SIGTERM stops it")
    func asyncDaemonRuns() async throws {
        // Port 0: the kernel picks a free one, which the example prints ("listening on port N").
        // Its stdout is a pipe, so fully buffered: stdbuf makes it line-buffered, so the line
        // arrives while it runs.
        let daemon = try startProgram("/usr/bin/stdbuf", arguments: ["-oL", try executableURL("mainspring-echo").path, "0"])
        defer { if !daemon.hasExited { daemon.send(SIGKILL) } }
        let banner = await daemon.readLine(timeout: .seconds(30))
        let prefix = "listening on port "
        guard let banner, banner.hasPrefix(prefix), let port = UInt16(banner.dropFirst(prefix.count)), port != 0 else {
            if !daemon.hasExited { daemon.send(SIGKILL) }
            Issue.record("no 'listening on port N' line: \(await daemon.waitForExit(timeout: .seconds(30)).summary)")
            return
        }
        var clients = try (0..<3).map { _ in try TestClient(port: port) }
        for (index, client) in clients.enumerated() { client.send("hello \(index)\n") }
        for (index, client) in clients.enumerated() { #expect(client.readLine() == "you said: hello \(index)") }
        clients[0].send(String(repeating: "x", count: 5_000) + "\n")
        #expect(clients[0].readLine() == "ERR bad line")
        clients[1].shutdownWrite()
        #expect(clients[1].readLine() == nil, "the connection closes after the client's end of input")
        clients.removeAll()
        daemon.send(SIGTERM)
        let result = await daemon.waitForExit(timeout: .seconds(30))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(result.stdout.hasPrefix("listening on port \(port)\n"), "\(result.summary)")
        #expect(result.stdout.contains("stopped: dropped 0 work item(s)"), "\(result.summary)")
    }

    @Test("the README's spin example: waiting inside a handler keeps the loop running")
    func spinExample() async throws {
        let printed = try await onLoopThread { loop -> [String] in
            nonisolated(unsafe) var printed: [String] = []
            @Sendable func print(_ text: String) { printed.append(text) }
            loop.execute {
                var reply: String?
                loop.schedule(after: .milliseconds(50)) { reply = "pong" }
                if loop.spin(until: { reply != nil }, timeout: .seconds(1)) {
                    print(reply!)
                }
            }
            loop.spin(until: { printed.last == "pong" }, timeout: .seconds(5))
            return printed
        }
        #expect(printed == ["pong"])
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
            let listener = try? Listener(.tcp(host: "127.0.0.1", port: 0), on: acceptor, group: group,
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
        let report = await group.shutdown(gracePeriod: .seconds(5))
        #expect(report.droppedWork == 0 && !report.timedOut)
    }
}
