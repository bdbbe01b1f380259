/// Posting work to a loop, from its own thread or any other.
extension EventLoop {
    /// Runs `work` on the loop's thread, exactly once, in FIFO order with the other work the
    /// same thread posts at the same priority. Any thread.
    ///
    /// From the loop's own thread this is a lock-free append; from another thread it takes one
    /// mutex and wakes the loop (an eventfd write) only when the loop is asleep.
    /// Work posted before `stop()` runs on the next `run`, or is counted in
    /// `LoopMetrics.droppedAtShutdown` if the loop is freed first.
    ///
    /// `work` is taken over (`consuming`): the loop stores the caller's reference instead of
    /// retaining a new one, so a post costs the closure's own reference count and nothing more.
    public func execute(priority: Priority = .normal, _ work: consuming @escaping @Sendable () -> Void) {
        if ownerThread.load(ordering: .relaxed) == currentThreadID() {
            if lifecycle.isShutDown {
                scheduler.counters.droppedAtShutdown += 1
                return
            }
            scheduler.enqueue(ReadyRecord(work: work, stamp: scheduler.cachedNow), priority)
        } else {
            executeFromOtherThread(priority: priority, work)
        }
    }

    private func executeFromOtherThread(priority: Priority, _ work: consuming @escaping @Sendable () -> Void) {
        // Moved into the queue inside the lock (no retain); if the loop is closed it is released
        // here, after the lock, so no deinit runs while the lock is held.
        // (An item, not `Optional(work)`: a closure in a generic `Optional` is reabstracted,
        // which costs a thunk and an allocation each way.)
        var item = Optional(RemoteItem(work: consume work, stamp: 0))
        // (`configuration`, which nobody writes, not the scheduler's counters: the loop writes
        // their cache lines after every callback, so reading them here costs both threads a miss.)
        let clock = configuration.collectsMetrics ? self.timeSource : nil
        let outcome = remote.withLock { queue in queue.post(&item, priority, clock: clock) }
        if outcome == .queued(wake: true) { wakeup.signal() }
    }

    /// Queues `work` for the next turn: it becomes ready only after the loop has polled again.
    /// Loop thread only. This is how fed work yields to input.
    /// `package`: MainspringTLS hands a simulated handshake's connection to its user with it, as
    /// a dispatch of the loop rather than inside the network's delivery.
    package func executeNextTurn(priority: Priority, _ work: @escaping () -> Void) {
        scheduler.enqueueNextTurn(ReadyRecord(loopWork: work, stamp: 0, priority: priority))
    }

    /// Calls `participant.prepareForPoll()` once on this loop before it next polls — including a
    /// poll of a nested spin — at the latest just before the poll, or earlier in the pass: once
    /// its `.input` callbacks have run and lower-priority work is next (so that replies to input
    /// do not wait for that work). Loop thread only. For work that must be done before libevent
    /// next looks at the sockets, such as handing it coalesced output. An object, not a closure:
    /// registering costs no allocation.
    func beforeNextPoll(_ participant: some PollPreparing) {
        prePollParticipants.append(participant)
    }

    /// Queues a fired source (at most once: `Source.fire` guards it).
    @inline(__always)
    func enqueue(source: Source) {
        if pollStamp == 0 { pollStamp = timeSource.now() }
        scheduler.enqueue(ReadyRecord(source: source, stamp: pollStamp, priority: source.priority), source.priority)
    }

    /// Queues a source for the next turn (fd sources that epoll cannot watch: always ready).
    func enqueueNextTurn(source: Source) {
        scheduler.enqueueNextTurn(ReadyRecord(source: source, stamp: 0, priority: source.priority))
    }
}

/// Something the loop asks to prepare just before its next poll (see `beforeNextPoll`).
protocol PollPreparing: AnyObject {
    /// Called once per `beforeNextPoll`, on the loop's thread, before the loop polls.
    func prepareForPoll()
}
