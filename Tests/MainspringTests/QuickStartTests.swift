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
