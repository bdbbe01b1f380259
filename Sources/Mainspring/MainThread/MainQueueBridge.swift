/// The Dispatch main queue as a source of `EventLoop.main`: `DispatchQueue.main.async`,
/// `asyncAfter`, `MainActor.run`, `Task { @MainActor in … }` and everything else that lands on
/// the main queue runs inside `EventLoop.main.run()` (or `spin`, `runOnce`) on the main thread.
///
/// It watches libdispatch's main-queue eventfd at `.normal` priority, like any fd watcher, and on
/// readiness resets the fd and drains the queue — what `CFRunLoop` does on Linux. So:
///
/// - **Fair interleaving.** One drain runs the blocks that were queued when it started; blocks
///   queued while it runs (a chain of `DispatchQueue.main.async` calls, a `@MainActor` task that
///   awaits) wait for the next poll, behind ready input, timers and posted work. A single large
///   burst (say 10,000 blocks queued at once from another thread) still runs as one drain:
///   libdispatch offers no way to take fewer.
/// - **No re-entrant drain.** A source is never re-entered: while a drain runs (a block spins the
///   loop, or waits on a `Semaphore` on the main thread), the main-queue source is held back, so
///   the nested spin runs timers, fds and posted work but no main-queue block; those run after
///   the block that spins returns. This is libdispatch's own rule as well (its drain returns at
///   once when re-entered). A block that waits *for another main-queue block* therefore waits
///   until its timeout; wait for loop work (`execute`, timers, fds) instead.
/// - The bridge is installed the first time the main thread runs the main loop. Programs that
///   call `dispatchMain()` instead never install it (libdispatch then runs the main queue on a
///   worker thread, and refuses to be drained by anyone else).
/// - libdispatch creates the main queue's eventfd on that first run and *aborts the process* if
///   it cannot (out of descriptors). A program that may run out of descriptors later (a server
///   under an EMFILE storm) should run the main loop once early — `EventLoop.main.runOnce(blocking:
///   false)` at start-up — as `mainspring-daemon` does.
final class MainQueueSource: DescriptorSource {
    init(loop: EventLoop) throws(EventLoopError) {
        try super.init(loop: loop, fd: DispatchMainQueue.handle, events: .read, priority: .normal)
    }

    override func perform(_ readiness: Readiness) {
        // Reset first: libdispatch writes the fd again for blocks queued during the drain, and
        // that wake-up must survive.
        resetEventCounter(fd)
        DispatchMainQueue.drain()
    }
}

extension EventLoop {
    /// Installs the main-queue bridge on `EventLoop.main` (main thread, once). Called when the
    /// main loop starts running; a no-op on other loops.
    func installMainQueueBridgeIfNeeded() throws(EventLoopError) {
        guard isMainLoop, mainQueueSource == nil else { return }
        mainQueueSource = try MainQueueSource(loop: self)
    }
}

extension EventLoop {
    /// For the calls that cannot throw (`spin`, `runOnce`): without the bridge the main queue
    /// would silently never run, so failing to install it (out of file descriptors) is fatal.
    func installMainQueueBridgeOrDie() {
        do {
            try installMainQueueBridgeIfNeeded()
        } catch {
            fatalError("Mainspring: cannot watch the Dispatch main queue: \(error)")
        }
    }
}
