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
}
