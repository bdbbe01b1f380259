/// Readiness of one descriptor that its user owns outright — for package modules that drive
/// a protocol step by step on a raw socket (a TLS handshake, `MainspringTLS`) before handing it
/// to a connection. Unlike `EventLoop.watch(_:for:priority:_:)` it checks nothing about the
/// descriptor (no `fstat`, no stale-watcher sweep over the loop's sources), and the events
/// waited for change from one wait to the next. Loop thread only.
///
/// `wait(for:)` arms one wait: `handler` runs once, at `priority`, when `fd` is ready for one
/// of the events (or `cancel()` ends it). Costs one libevent event per wait.
package final class DescriptorReadiness {
    private let source: ReadinessSource

    /// `handler` runs on `loop`'s thread, at `priority`, each time an armed wait completes.
    package init(loop: EventLoop, fd: Int32, priority: Priority, handler: @escaping () -> Void) {
        loop.preconditionOnLoop("DescriptorReadiness.init")
        source = ReadinessSource(loop: loop, fd: fd, priority: priority, handler: handler)
    }

    /// Waits for `events` (replacing a wait in progress).
    /// - Throws: `.libevent` (with errno) when the loop refuses the descriptor.
    package func wait(for events: IOEvents) throws(EventLoopError) {
        try source.wait(for: events)
    }

    /// Ends the wait for good: `handler` never runs again. Does not close `fd`. Idempotent.
    package func cancel() { source.close() }

    deinit { source.close() }
}

/// The source behind `DescriptorReadiness`.
private final class ReadinessSource: Source {
    let fd: Int32
    private var handler: (() -> Void)?

    init(loop: EventLoop, fd: Int32, priority: Priority, handler: @escaping () -> Void) {
        self.fd = fd
        self.handler = handler
        super.init(loop: loop, priority: priority)
    }

    func wait(for events: IOEvents) throws(EventLoopError) {
        guard !isClosed else { return }
        native?.delete()
        try addNativeEvent(fd: fd, readiness: events.readiness, persistent: false)
    }

    override func perform(_ readiness: Readiness) {
        native = nil  // one-shot: it fired
        handler?()
    }

    override func didClose() { handler = nil }
}
