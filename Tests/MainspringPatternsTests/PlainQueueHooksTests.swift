import Foundation
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore

/// What the deprecated hooks of a plain `OperationQueue` stand on (`drainTracker`; the deprecated
/// methods are one-line forwards to it, and calling them here would warn): work added with
/// `addTrackedOperation(s)` is counted on a plain queue, and a `TrackedOperationQueue` reached
/// through a plain `OperationQueue` reference uses its own full count.
@Suite("Drain hooks on a plain OperationQueue (deprecated, still working)")
struct PlainQueueHooksTests {
    @Test("a plain queue: tracked adds fire the hook once per drain, on the loop's thread")
    func plainQueueTrackedAdds() async throws {
        let drains = try await onLoopThread { loop -> Int in
            let queue = OperationQueue()
            let tracker = queue.drainTracker
            #expect(tracker === queue.drainTracker)  // one tracker per queue
            nonisolated(unsafe) var drains = 0
            _ = tracker.addHook(on: loop) {
                precondition(loop.isCurrent)
                drains += 1
            }
            for round in 1...3 {
                let operations = (0..<10).map { _ in BlockOperation { usleep(100) } }
                tracker.track(operations)
                queue.addOperations(operations, waitUntilFinished: false)
                loop.spin(until: { drains == round }, timeout: .seconds(10))
            }
            return drains
        }
        #expect(drains == 3)
    }

    @Test("a TrackedOperationQueue reached through a plain OperationQueue reference counts Foundation's adds")
    func trackedQueueThroughPlainReference() async throws {
        let drains = try await onLoopThread { loop -> Int in
            let tracked = TrackedOperationQueue()
            let queue: OperationQueue = tracked
            #expect(queue.drainTracker === tracked.tracker)
            nonisolated(unsafe) var drains = 0
            _ = queue.drainTracker.addHook(on: loop) { drains += 1 }
            queue.addOperation { usleep(1_000) }  // Foundation's own add, through the plain type
            loop.spin(until: { drains == 1 }, timeout: .seconds(10))
            return drains
        }
        #expect(drains == 1)
    }
}
