/// A loop's sources (registered, counted, closed at shutdown) and its metrics.
extension EventLoop {
    // MARK: Sources

    func register(_ source: Source) {
        sources[ObjectIdentifier(source)] = source
        if source.keepsLoopBusy { busySources += 1 }
        world.sourceRegistered(source)
    }

    func unregister(_ source: Source) {
        if sources.removeValue(forKey: ObjectIdentifier(source)) != nil, source.keepsLoopBusy { busySources -= 1 }
        world.sourceUnregistered(source)
    }

    /// The number of open sources (timers, watchers, readers) on this loop.
    var sourceCount: Int { sources.count }

    /// The open sources (a copy). Loop thread only.
    var openSources: [Source] { Array(sources.values) }

    /// Whether the loop has nothing left to do: no ready work, no cross-thread posts waiting, no
    /// in-flight sources (connections, one-shot timers). Standing sources (fd watchers,
    /// repeating timers, listeners) do not count. Loop thread only.
    var isQuiescent: Bool {
        busySources == 0 && !scheduler.hasReadyWork && remote.withLock { $0.isEmpty }
    }

    /// Ends the loop for good, on its thread: closes every source (handlers are dropped, not
    /// called), drops the queued work, and from now on counts posts as dropped instead of
    /// queueing them. Returns (work dropped, sources closed). `run()` returns afterwards.
    func shutdownNow() -> (droppedWork: Int, closedSources: Int) {
        let waitingQueue = remote.withLock { $0.close() }
        let waiting = waitingQueue.count
        let open = Array(sources.values)
        for source in open { source.close() }
        let dropped = scheduler.removeAll() + waiting
        scheduler.counters.droppedAtShutdown += dropped
        lifecycle.shutDown()
        world.loopShutDown(self)
        stop()
        _ = consume waitingQueue  // the dropped closures are released here, after the lock
        return (dropped, open.count)
    }

    // MARK: Metrics

    /// A snapshot of what the loop has done so far: a copy of its counters and its queue-wait
    /// histograms (about 60 KB with metrics on). Read it on the loop's thread, or once no thread
    /// runs the loop any more (precondition).
    public var metrics: LoopMetrics {
        requireUsage(
            isCurrent || !isBoundToLiveThread,
            "Mainspring: EventLoop.metrics must be read on the loop's own thread; use submit { loop.metrics } to get there")
        var snapshot = scheduler.counters.snapshot()
        snapshot.droppedAtShutdown += remote.withLock { $0.droppedWhileClosed }
        return snapshot
    }
}
