import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("Loop activity, seen from another thread", .serialized)
struct ActivityTests {
    /// Polls `loop.activity` from this (non-loop) thread until `matches` holds, for 10 s at most.
    private func waitForActivity(_ loop: EventLoop, _ matches: (LoopActivity) -> Bool) async throws -> LoopActivity {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let activity = loop.activity
            if matches(activity) { return activity }
            try await Task.sleep(for: .milliseconds(1))
        }
        return loop.activity
    }

    @Test("not running, then waiting, then dispatching while a callback blocks, then waiting, then not running")
    func lifecycle() async throws {
        let loop = try EventLoop()
        #expect(loop.activity == .notRunning)
        #expect(!loop.activity.isResponsive(within: .seconds(1)))
        let finished = startThread { try? loop.run() }

        let idle = try await waitForActivity(loop) { $0 == .waiting }
        #expect(idle == .waiting)
        #expect(idle.isResponsive(within: .zero))

        let release = DispatchSemaphore(value: 0)
        loop.execute { release.wait() }  // a callback stuck until the test lets it go
        let stuck = try await waitForActivity(loop) {
            if case .dispatching(let duration) = $0 { return duration >= .milliseconds(300) }
            return false
        }
        guard case .dispatching(let duration) = stuck else {
            Issue.record("expected .dispatching, saw \(stuck)")
            release.signal()
            return
        }
        #expect(duration >= .milliseconds(300))
        #expect(!stuck.isResponsive(within: .milliseconds(100)))
        #expect(stuck.description.hasPrefix("dispatching for "))
        release.signal()

        let recovered = try await waitForActivity(loop) { $0 == .waiting }
        #expect(recovered == .waiting)
        loop.stop()
        finished.wait()
        #expect(loop.activity == .notRunning)
    }

    @Test("a loop kept busy by short callbacks stays responsive: it polls every poll interval")
    func busyButResponsive() async throws {
        let loop = try EventLoop(configuration: .init(pollInterval: .milliseconds(2)))
        let stop = Protected(false)
        @Sendable func spinFor(_ duration: Duration) {
            let end = ContinuousClock.now + duration
            while ContinuousClock.now < end {}
        }
        @Sendable func chain() {
            spinFor(.microseconds(200))
            if !stop.withLock({ $0 }) { loop.execute(chain) }
        }
        let finished = startThread { try? loop.run() }
        loop.execute(chain)
        var worst: Duration = .zero
        for _ in 0..<200 {
            if case .dispatching(let duration) = loop.activity { worst = max(worst, duration) }
            try await Task.sleep(for: .milliseconds(1))
        }
        stop.withLock { $0 = true }
        loop.stop()
        finished.wait()
        // 2 ms passes of 0.2 ms callbacks; a loaded CI machine may deschedule the loop thread
        // for a while, so the bound is generous: far below a stuck callback's seconds.
        #expect(worst < .milliseconds(250), "longest dispatching stretch \(worst)")
    }
}
