import Foundation
import Synchronization
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("LoopMetrics", .serialized)
struct MetricsTests {
    @Test("callbacks, busy time and queue-wait histograms are kept per priority")
    func perPriority() async throws {
        let (before, after) = try await onLoopThread { loop -> (LoopMetrics, LoopMetrics) in
            let before = loop.metrics
            nonisolated(unsafe) var done = 0
            loop.execute {
                for _ in 0..<3 { loop.execute(priority: .input) { spin(for: .milliseconds(2)); done += 1 } }
                for _ in 0..<2 { loop.execute(priority: .normal) { spin(for: .milliseconds(2)); done += 1 } }
                loop.execute(priority: .background) { spin(for: .milliseconds(2)); done += 1 }
            }
            loop.spin(until: { done == 6 }, timeout: .seconds(5))
            return (before, loop.metrics)
        }
        func delta(_ p: Priority) -> Int { (after.callbacks[p] ?? 0) - (before.callbacks[p] ?? 0) }
        func busy(_ p: Priority) -> Duration { (after.busyTime[p] ?? .zero) - (before.busyTime[p] ?? .zero) }
        #expect(delta(.input) == 3)
        #expect(delta(.normal) == 3)  // the posting closure and two posts
        #expect(delta(.background) == 1)
        #expect(busy(.input) >= .microseconds(5_700))  // (cycle-counter clock: a little slack)
        #expect(busy(.normal) >= .microseconds(3_800))
        #expect(busy(.background) >= .microseconds(1_900))
        for p in Priority.allCases {
            #expect(after.queueWait[p]?.count == after.callbacks[p], "\(p)")
        }
        // The background closure waited behind higher-priority work until it had earned its
        // share (a third of their time, a quantum of 1 ms): at least two 2 ms callbacks.
        #expect((after.queueWait[.background]?.max ?? .zero) >= .milliseconds(3))
        #expect(after.totalCallbacks == after.callbacks.values.reduce(0, +))
    }

    @Test("a callback longer than stallThreshold is a stall, with its duration; shorter ones are not")
    func stalls() async throws {
        // A threshold far above the short callback: on a loaded machine the thread can be
        // descheduled for tens of milliseconds right at the end of a callback.
        let (before, after) = try await onLoopThread { _ -> (LoopMetrics, LoopMetrics) in
            let loop = try EventLoop(configuration: .init(stallThreshold: .milliseconds(150)))
            let before = loop.metrics
            nonisolated(unsafe) var done = 0
            loop.execute { spin(for: .milliseconds(2)); done += 1 }
            loop.execute { spin(for: .milliseconds(200)); done += 1 }
            loop.spin(until: { done == 2 }, timeout: .seconds(5))
            return (before, loop.metrics)
        }
        #expect(after.stalls - before.stalls == 1)
        // (The loop's clock is a calibrated cycle counter: allow it a little disagreement.)
        #expect(after.longestStall >= .milliseconds(195))
        #expect(after.longestCallback >= .milliseconds(195))
    }

    @Test("iterations and polls count loop passes")
    func iterationsAndPolls() async throws {
        let (polls, iterations) = try await onLoopThread { loop -> (Int, Int) in
            let before = loop.metrics
            for _ in 0..<5 { loop.runOnce(blocking: false) }
            let after = loop.metrics
            return (after.polls - before.polls, after.iterations - before.iterations)
        }
        #expect(polls == 5)
        #expect(iterations == 5)
    }

    @Test("a snapshot is a value: later work does not change it")
    func snapshotIsIndependent() async throws {
        let (first, again, later) = try await onLoopThread { loop -> (LoopMetrics, LoopMetrics, LoopMetrics) in
            nonisolated(unsafe) var done = false
            loop.execute { done = true }
            loop.spin(until: { done })
            let first = loop.metrics
            let again = loop.metrics
            done = false
            loop.execute { done = true }
            loop.spin(until: { done })
            return (first, again, loop.metrics)
        }
        #expect(first.queueWait[.normal] == again.queueWait[.normal])
        #expect((later.queueWait[.normal]?.count ?? 0) == (first.queueWait[.normal]?.count ?? 0) + 1)
    }

    @Test("a post from another thread waits from when it was posted, not from when the loop took it")
    func remoteQueueWait() async throws {
        let waits = try await onLoopThread { loop -> LatencyHistogram? in
            let holding = DispatchSemaphore(value: 0)
            let posted = DispatchSemaphore(value: 0)
            let ran = Atomic<Int>(0)
            // The loop is held in an `.input` callback while another thread posts 100 `.normal`
            // closures, then for 30 ms more: each of them waits at least that long, although the
            // loop only takes them after the callback.
            loop.execute(priority: .input) {
                holding.signal()
                posted.wait()
                spin(for: .milliseconds(30))
            }
            startThread {
                holding.wait()
                for _ in 0..<100 { loop.execute { ran.add(1, ordering: .relaxed) } }
                posted.signal()
            }
            loop.spin(until: { ran.load(ordering: .relaxed) == 100 }, timeout: .seconds(10))
            return loop.metrics.queueWait[.normal]
        }
        let normal = try #require(waits)
        #expect(normal.count == 100)
        // Posts between two clock readings (see RemoteQueue) take the earlier one: a wait may be
        // over-reported a little, never under-reported.
        #expect(normal.min >= .milliseconds(29), "shortest wait \(normal.min)")
        #expect(normal.max < .seconds(10))
    }

    @Test("with collectsMetrics off, callbacks are still counted but no queue wait is kept")
    func metricsOff() async throws {
        let metrics = try await onLoopThread { _ -> LoopMetrics in
            let loop = try EventLoop(configuration: .init(collectsMetrics: false))
            nonisolated(unsafe) var done = false
            loop.execute { done = true }
            loop.spin(until: { done }, timeout: .seconds(5))
            return loop.metrics
        }
        #expect(metrics.queueWait.isEmpty)
        #expect(metrics.callbacks[.normal] == 1)
    }
}
