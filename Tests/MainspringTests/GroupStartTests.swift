import Foundation
import Mainspring
import MainspringTestSupport
import Testing

@Suite("EventLoopGroup: its loops are their threads' from the moment init returns (subprocess)")
struct GroupStartTests {
    /// Runs `rounds` fixture processes, `parallel` at a time, and returns their results.
    private func rounds(_ count: Int, mode: String, parallel: Int = 4) async throws -> [FixtureResult] {
        try await withThrowingTaskGroup(of: [FixtureResult].self) { group in
            for worker in 0..<parallel {
                group.addTask {
                    var results: [FixtureResult] = []
                    for _ in stride(from: worker, to: count, by: parallel) {
                        // No crash reporter: a trap per process, and 200 of them.
                        results.append(try await runFixture("group-takeover", arguments: [mode],
                                                            environment: ["SWIFT_BACKTRACE": "enable=no"]))
                    }
                    return results
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    @Test("200 rounds: a loop-only call on a new group's loop from the main thread traps, every time")
    func directCallTraps() async throws {
        let results = try await rounds(200, mode: "direct")
        let trapped = results.filter {
            $0.crashedBySignal && $0.stderr.contains("must be called on the loop's own thread")
                && $0.stderr.contains("from another thread use execute(after:_:)")
        }
        let accepted = results.filter { $0["accepted"] == "true" }
        #expect(results.count == 200)
        #expect(accepted.isEmpty, "\(accepted.count) took the loop over; first: \(accepted.first?.summary ?? "")")
        #expect(trapped.count == 200, "\(results.first { !$0.crashedBySignal }?.summary ?? "")")
    }

    @Test("200 rounds: the same call through execute works, every time")
    func executeWorks() async throws {
        let results = try await rounds(200, mode: "execute")
        let fired = results.filter { $0.status == 0 && !$0.crashedBySignal && $0["fired"] == "1" }
        #expect(fired.count == 200, "\(results.first { $0.status != 0 || $0.crashedBySignal }?.summary ?? "")")
    }
}
