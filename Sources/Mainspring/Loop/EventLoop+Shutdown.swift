/// How a loop of an `EventLoopGroup` ends (see `EventLoopGroup.shutdown(gracePeriod:)`).
extension EventLoop {
    /// What one loop's shutdown abandoned.
    struct ShutdownOutcome: Sendable {
        var droppedWork = 0
        var closedSources = 0
        var cancelledTasks = 0
        var timedOut = false
    }

    /// The longest the loop keeps running, after the grace period, for the tasks whose waits it
    /// ended: they unwind (their operations throw) on the loop they prefer.
    static let unwindLimit: Duration = .milliseconds(100)

    /// Loop thread: runs until quiescent or `deadline` (monotonic ns); then, if it is not
    /// quiescent, closes every source — resuming the tasks suspended on them, which then throw
    /// (`CloseReason.cancelled`, or the end of their sequences) — and keeps running for at most
    /// `unwindLimit` while those tasks unwind; then shuts down for good.
    func shutDown(deadline: UInt64) -> ShutdownOutcome {
        var outcome = ShutdownOutcome()
        let now = monotonicNow()
        let quiet = spin(until: { isQuiescent }, timeout: .nanoseconds(Int64(clamping: deadline > now ? deadline - now : 0)))
        if !quiet {
            outcome.timedOut = true
            let open = openSources
            outcome.cancelledTasks = open.reduce(0) { $0 + Self.suspendedTasks(on: $1) }
            for source in open { source.close() }
            outcome.closedSources = open.count
            if outcome.cancelledTasks > 0 {
                spin(until: { !scheduler.hasReadyWork && remote.withLock { $0.isEmpty } }, timeout: Self.unwindLimit)
            }
        }
        let (dropped, closed) = shutdownNow()
        outcome.droppedWork = dropped
        outcome.closedSources += closed
        return outcome
    }

    /// Tasks suspended on `source` (waiting for input, for output to drain, for a close, for a
    /// connection, for a signal).
    private static func suspendedTasks(on source: Source) -> Int {
        switch source {
        case let connection as ConnectionSource: return connection.suspendedTasks
        case let listener as ListenerSource: return listener.suspendedTasks
        case let reader as LineReaderSource: return reader.suspendedTasks()
        case let signal as SignalSource: return signal.suspendedTasks()
        default: return 0
        }
    }
}
