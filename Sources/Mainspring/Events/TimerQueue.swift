/// A source that fires at a deadline on the monotonic clock: a timer, a timeline's frame timer.
///
/// Its deadline is kept by its loop's `TimerQueue` (in nanoseconds, with its creation order),
/// not by libevent, so sources due at the same instant fire in the order they were created.
/// Arming, re-arming and disarming are loop-thread only.
class DeadlineSource: Source {
    /// The deadline last armed (monotonic ns); still set after it fired.
    fileprivate(set) var deadline: UInt64 = 0
    /// The source's creation order on its loop: breaks ties between equal deadlines.
    fileprivate let sequence: UInt64
    /// The source's place in the queue's heap; -1 while not armed.
    @exclusivity(unchecked) fileprivate var heapIndex = -1

    override init(loop: EventLoop, priority: Priority, keepsLoopBusy: Bool = false) {
        sequence = loop.timerQueue.makeSequence()
        super.init(loop: loop, priority: priority, keepsLoopBusy: keepsLoopBusy)
    }

    /// Whether a deadline is set and has not fired yet.
    final var isArmed: Bool { heapIndex >= 0 }

    /// Sets the deadline (monotonic ns), replacing one not yet reached. A deadline in the past
    /// fires at the next poll. Does nothing once the source is closed. O(log n) in the loop's
    /// armed sources.
    final func arm(at deadline: UInt64) {
        guard !isClosed else { return }
        // Through `withLoop`: `loop` retains the loop, whose side table makes that the slow path
        // (a quarter of a repeating timer's cost when it was there).
        withLoop { $0.timerQueue.arm(self, at: deadline) }
    }

    /// Subclasses that override this must call it.
    override func didClose() {
        if isArmed { loop.timerQueue.disarm(self) }
    }
}

/// A loop's armed deadline sources, in the library's min-heap (`MinHeap`) ordered by (deadline,
/// creation order), behind one libevent timer armed for the earliest deadline.
///
/// Why not one libevent timer per source: libevent keeps deadlines in microseconds in a heap
/// that is not stable for equal keys, so timers created within one microsecond (several are,
/// back to back, in optimised code) would fire in an arbitrary order. Here equal deadlines fire
/// in creation order, and deadlines keep their nanoseconds. When libevent's timer fires, every source whose
/// deadline has passed is queued, in that order, and the timer is re-armed for the next one
/// before the loop polls again. A source is never queued before its deadline.
///
/// Cost: arming and disarming are O(log n) with no allocation once the heap has grown; libevent
/// is told (one `event_add` or `event_del`) only when the earliest deadline changes.
final class TimerQueue: NativeEventTarget {
    /// One armed source: its key inline (comparisons touch only the heap's own memory), the
    /// source unretained — an armed source is open, so its loop holds it (closing disarms).
    private struct Entry: MinHeapElement {
        var deadline: UInt64
        var sequence: UInt64
        unowned(unsafe) var source: DeadlineSource

        @inline(__always)
        func precedes(_ other: Entry) -> Bool {
            deadline < other.deadline || (deadline == other.deadline && sequence < other.sequence)
        }

        /// The source keeps its place, for re-arming and disarming without a search.
        @inline(__always)
        func movedTo(index: Int) { source.heapIndex = index }
    }

    private unowned(unsafe) let loop: EventLoop
    /// Whether libevent's timer stands for the queue (a real loop's); a simulation reads
    /// `nextDeadline` instead. The loop's world, asked once.
    private let armsNativeTimer: Bool
    @exclusivity(unchecked) private var heap = MinHeap<Entry>()
    private var lastSequence: UInt64 = 0
    /// libevent's timer, made on first use.
    private var native: NativeEvent?
    /// The deadline libevent's timer is pending for, or nil when it is not pending.
    private var nativeDeadline: UInt64?
    /// Whether the queue asked the loop to re-arm libevent's timer before the next poll.
    private var rearmIsQueued = false

    /// - Parameter loop: the loop that owns the queue (and outlives it).
    init(loop: EventLoop) {
        self.loop = loop
        armsNativeTimer = loop.world.armsNativeTimers
    }

    /// The next creation sequence number.
    func makeSequence() -> UInt64 {
        lastSequence &+= 1
        return lastSequence
    }

    /// The number of armed sources.
    var count: Int { heap.count }

    func arm(_ source: DeadlineSource, at deadline: UInt64) {
        source.deadline = deadline
        let index = source.heapIndex
        if index < 0 {
            heap.insert(Entry(deadline: deadline, sequence: source.sequence, source: source))
        } else {
            heap.update(at: index) { $0.deadline = deadline }
        }
        updateNative()
    }

    func disarm(_ source: DeadlineSource) {
        guard source.heapIndex >= 0 else { return }
        heap.remove(at: source.heapIndex)
        updateNative()
    }

    /// libevent's timer fired (inside the poll): queue every source that is due, in order. The
    /// timer is re-armed just before the next poll, outside libevent, whose clock is cached
    /// while it runs callbacks.
    override func nativeEventFired(_ readiness: Readiness) {
        nativeDeadline = nil
        fireDue(now: loop.monotonicNow())
        if !heap.isEmpty && !rearmIsQueued {
            rearmIsQueued = true
            loop.beforeNextPoll(self)
        }
    }

    /// Queues every source whose deadline is at or before `now`, in (deadline, creation) order.
    /// A simulated loop calls this at each virtual instant; a real one when libevent's timer
    /// fires.
    func fireDue(now: UInt64) {
        while let first = heap.first, first.deadline <= now {
            heap.removeFirst()
            first.source.fire(.timeout)
        }
    }

    /// The earliest armed deadline, if any.
    var nextDeadline: UInt64? { heap.first?.deadline }

    /// Makes libevent's timer pending for the earliest deadline, or not pending when none is
    /// armed. Nothing to do when it already is, or on a simulated loop (whose simulation reads
    /// `nextDeadline` instead).
    private func updateNative() {
        guard !rearmIsQueued, armsNativeTimer else { return }
        guard let first = heap.first else {
            if nativeDeadline != nil {
                native?.delete()
                nativeDeadline = nil
            }
            return
        }
        guard nativeDeadline != first.deadline else { return }
        let now = loop.monotonicNow()
        // event_add on a timer fails only when libevent runs out of memory; there is no way on.
        do {
            try nativeEvent().add(timeoutNanoseconds: first.deadline > now ? first.deadline - now : 0)
        } catch {
            fatalError("Mainspring: cannot arm the loop's timer: \(error)")
        }
        nativeDeadline = first.deadline
    }

    private func nativeEvent() throws(EventLoopError) -> NativeEvent {
        if let native { return native }
        let made = try NativeEvent(timerOn: loop.base, target: self)
        native = made
        return made
    }
}

extension TimerQueue: PollPreparing {
    /// Re-arms libevent's timer after it fired, before the loop polls again.
    func prepareForPoll() {
        rearmIsQueued = false
        updateNative()
    }
}
