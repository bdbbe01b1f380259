import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// The loop's lifecycle values on their own: the cross-thread queue's phases (awake, sleeping,
/// closed), the loop-thread lifecycle, and the ownership word — no threads, no loop running.
@Suite("Loop lifecycle state machines (no threads)")
struct LoopLifecycleTests {
    private func item(_ ran: @escaping @Sendable () -> Void = {}) -> RemoteItem? { RemoteItem(work: ran, stamp: 0) }

    @Test("a post to a sleeping loop asks for one wake-up; the next posts do not")
    func wakeOnce() {
        var queue = RemoteQueue()
        let maySleep = queue.sleepIfEmpty()
        #expect(maySleep, "empty: the loop may sleep")
        #expect(queue.phase == .sleeping)
        var first = item()
        let firstOutcome = queue.post(&first, .normal, clock: nil as FastClock?)
        #expect(firstOutcome == .queued(wake: true))
        #expect(first == nil, "moved into the queue")
        var second = item()
        let secondOutcome = queue.post(&second, .input, clock: nil as FastClock?)
        #expect(secondOutcome == .queued(wake: false), "awake already: no second eventfd write")
        #expect(queue.count == 2)
    }

    @Test("the loop does not sleep while posts wait; after a poll it is awake")
    func noSleepWithPosts() {
        var queue = RemoteQueue()
        var posted = item()
        _ = queue.post(&posted, .background, clock: nil as FastClock?)
        let mayNotSleep = queue.sleepIfEmpty()
        #expect(!mayNotSleep, "posts are waiting: take them instead")
        #expect(queue.phase == .awake)
        var empty = RemoteQueue()
        _ = empty.sleepIfEmpty()
        empty.wake()
        #expect(empty.phase == .awake)
    }

    @Test("closing hands back what was queued and counts every later post as dropped")
    func closing() {
        var queue = RemoteQueue()
        var one = item()
        var two = item()
        _ = queue.post(&one, .normal, clock: nil as FastClock?)
        _ = queue.post(&two, .normal, clock: nil as FastClock?)
        let waiting = queue.close()
        #expect(waiting.count == 2, "returned, to be dropped after the lock")
        #expect(queue.isEmpty && queue.phase == .closed)
        var late = item()
        let lateOutcome = queue.post(&late, .normal, clock: nil as FastClock?)
        #expect(lateOutcome == .dropped)
        #expect(late != nil, "not taken: the producer releases it")
        #expect(queue.droppedWhileClosed == 1)
        let closedMaySleep = queue.sleepIfEmpty()
        #expect(closedMaySleep, "a closed loop may sleep")
        #expect(queue.phase == .closed, "closed for good")
    }

    @Test("the loop-thread lifecycle: open, shut down once, then being freed")
    func lifecycle() {
        var lifecycle = LoopLifecycle()
        #expect(!lifecycle.isShutDown)
        let first = lifecycle.shutDown()
        let second = lifecycle.shutDown()
        #expect(first)
        #expect(!second, "once")
        #expect(lifecycle.isShutDown && !lifecycle.isBeingFreed)
        lifecycle.beginFreeing()
        #expect(lifecycle.isShutDown && lifecycle.isBeingFreed)
        var freed = LoopLifecycle()
        freed.beginFreeing()
        #expect(freed.isShutDown, "freed without a shutdown first accepts nothing either")
    }

    @Test("the ownership word: unbound, owned by a thread, orphaned for good")
    func ownership() {
        #expect(LoopOwnership(word: 0) == .unbound)
        #expect(LoopOwnership(word: 12_345) == .owned(12_345))
        #expect(LoopOwnership(word: EventLoop.deadOwner) == .orphaned)
        for state in [LoopOwnership.unbound, .owned(99), .orphaned] { #expect(LoopOwnership(word: state.word) == state) }
    }
}
