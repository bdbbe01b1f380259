import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// The listener's queue of accepted connections on its own: elements are plain numbers and the
/// waiter a name, so the transitions are tested without sockets or tasks.
@Suite("Accept queue state machine (no sockets)")
struct AcceptQueueStateTests {
    typealias Queue = AcceptQueueState<Int, String>

    private func isElement(_ outcome: AcceptOutcome<Int>, _ value: Int) -> Bool {
        if case .element(let element) = outcome { return element == value }
        return false
    }

    @Test("accepting pauses at the limit and resumes when a take brings the count below it")
    func pauseAndTake() {
        var queue = Queue(limit: 3)
        let v1 = queue.claim()
        let v2 = queue.claim()
        #expect(v1 && !v2, "one consumer")
        let v3 = queue.reserve()
        let v4 = queue.reserve()
        #expect(!v3 && !v4)
        let v5 = queue.reserve()
        #expect(v5, "the third pending one pauses accepting")
        let v6 = queue.reserve()
        #expect(!v6, "paused once")
        for value in 1...4 { #expect(queue.push(value).wake == nil) }
        let first = queue.take()
        #expect(isElement(first.outcome, 1) && !first.resumeAccepting, "4 pending: 3 still at the limit")
        let second = queue.take()
        #expect(isElement(second.outcome, 2) && second.resumeAccepting)
        #expect(!queue.isAcceptPaused)
    }

    @Test("the sequence CI found: paused, the consumer waits, the next element goes straight to it — accepting resumes")
    func handOffResumes() {
        var queue = Queue(limit: 2)
        _ = queue.claim()
        _ = queue.reserve()
        let v7 = queue.reserve()
        #expect(v7, "paused with two on their way")
        let parked = queue.takeOrPark("consumer")
        #expect(parked.parked && queue.hasWaiter)
        let handed = queue.push(10)
        #expect(handed.wake?.waiter == "consumer")
        #expect(handed.wake.map { isElement($0.outcome, 10) } == true)
        #expect(handed.resumeAccepting, "no take will see the count go down: the hand-off must resume")
        #expect(!queue.isAcceptPaused && !queue.hasWaiter)
        // And an element that fails on its way does the same.
        let v8 = queue.reserve()
        #expect(v8, "paused again")
        let released = queue.release()
        #expect(released.resumeAccepting && released.wake == nil)
    }

    @Test("the listener closes: the consumer gets what is pending, then the end — also while it waits")
    func finishing() {
        var queue = Queue(limit: 16)
        _ = queue.claim()
        _ = queue.reserve()
        _ = queue.reserve()
        _ = queue.push(1)
        let v9 = queue.finish()
        #expect(v9 == nil, "one still on its way")
        let v10 = queue.take()
        #expect(isElement(v10.outcome, 1))
        let parked = queue.takeOrPark("consumer")
        #expect(parked.parked)
        let failed = queue.release()
        #expect(failed.wake?.waiter == "consumer", "the last pending one failed: the waiting consumer ends")
        if case .end? = failed.wake?.outcome {} else { Issue.record("expected the end, got \(String(describing: failed.wake?.outcome))") }
        if case .end = queue.take().outcome {} else { Issue.record("the iteration stays ended") }
    }

    @Test("a cancelled consumer is resumed with .wait and never parks again")
    func cancelling() {
        var queue = Queue(limit: 16)
        _ = queue.claim()
        let v11 = queue.takeOrPark("consumer")
        #expect(v11.parked)
        let v12 = queue.cancel()
        #expect(v12 == "consumer")
        let again = queue.takeOrPark("consumer")
        #expect(!again.parked, "cancelled: its next throws instead of waiting")
        if case .wait = again.outcome {} else { Issue.record("expected .wait") }
        let v13 = queue.cancel()
        #expect(v13 == nil)
    }
}
