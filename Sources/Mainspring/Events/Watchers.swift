/// A handle on a registered source (fd watcher, line reader, signal watcher): `cancel()` it.
/// The loop keeps the source alive until it is cancelled (or ends itself, as a line reader does
/// at end of file); dropping the handle does not cancel it. See `Cancellable`.
///
/// Loop-bound: use it on the loop's thread.
public final class Watcher: Cancellable {
    private let reference: SourceReference

    init(source: Source) { reference = SourceReference(source) }

    /// Cancels the source: once this returns (on the loop's thread) its handler never runs
    /// again, even if its event was already ready. Idempotent. Does not close the fd.
    public func cancel() { reference.cancel("Watcher.cancel()") }

    /// Whether the source is cancelled or ended.
    public var isCancelled: Bool { reference.isCancelled }
}

@available(*, unavailable)
extension Watcher: Sendable {}

/// Level-triggered readiness of one fd. Fds that epoll cannot watch (regular files, /dev/null)
/// are always ready: the source is then queued once per loop turn instead.
class DescriptorSource: Source {
    let fd: Int32
    /// Which file `fd` named when the watch began (device and inode).
    let file: FileIdentity?
    private(set) var isAlwaysReady = false

    init(loop: EventLoop, fd: Int32, events: IOEvents, priority: Priority) throws(EventLoopError) {
        self.fd = fd
        self.file = FileIdentity(of: fd)
        super.init(loop: loop, priority: priority)
        guard isOpenDescriptor(fd), let file else {
            close()
            throw .badDescriptor(fd)
        }
        // A watcher whose fd was closed behind its back (without cancelling it) is dead — epoll
        // dropped the closed file — and, worse, libevent still counts its interest in that fd
        // *number*, so it would not register the new file that reuses the number: a new watcher
        // would never fire. Such stale watchers are recognised by their file's identity and
        // closed first.
        loop.closeStaleDescriptorSources(fd: fd, file: file, except: self)
        guard epollAccepts(fd) else {
            // epoll refuses regular files and some character devices (/dev/null): they never
            // block, so they are ready on every turn.
            isAlwaysReady = true
            turnReadiness = events.readiness
            loop.enqueueNextTurn(source: self)
            return
        }
        do {
            try addNativeEvent(fd: fd, readiness: events.readiness, persistent: true)
        } catch {
            close()
            throw error
        }
    }

    override var keepsFiring: Bool { true }

    override func didRun() {
        if isAlwaysReady { loop.enqueueNextTurn(source: self) }
    }

    /// Called when the source is found stale (its fd was closed and the number reused): ends it.
    /// Line readers report `.error(EBADF)` first.
    func endStale() { close() }
}

extension EventLoop {
    /// Closes the open fd sources on `fd` whose file is no longer the one now behind `fd`.
    func closeStaleDescriptorSources(fd: Int32, file: FileIdentity, except current: DescriptorSource) {
        for source in openSources {
            guard let watcher = source as? DescriptorSource, watcher !== current, watcher.fd == fd,
                  watcher.file != file else { continue }
            watcher.endStale()
        }
    }
}

/// `watch(_:for:priority:_:)`: calls the handler with the ready events.
final class WatchSource: DescriptorSource {
    private var handler: ((IOEvents) -> Void)?

    init(loop: EventLoop, fd: Int32, events: IOEvents, priority: Priority,
         handler: @escaping (IOEvents) -> Void) throws(EventLoopError)
    {
        self.handler = handler
        try super.init(loop: loop, fd: fd, events: events, priority: priority)
    }

    override func perform(_ readiness: Readiness) { handler?(IOEvents(readiness)) }

    override func didClose() { handler = nil }
}

extension EventLoop {
    /// Calls `handler` on this loop whenever `fd` is ready for `events` (level-triggered: again
    /// on every turn while the condition holds, so read what is there). The handler gets the
    /// events that are ready and is never re-entered.
    ///
    /// An fd that epoll cannot watch (a regular file, `/dev/null`) is always ready: the handler
    /// runs once per loop turn until cancelled. Cancel the watcher before closing the fd.
    /// Loop thread only.
    /// - Parameters:
    ///   - fd: the file descriptor to watch; it stays yours (the watcher never closes it).
    ///   - events: the readiness to watch for: `.read`, `.write` or both.
    ///   - priority: where the handler runs; `.input` by default.
    ///   - handler: called on this loop with the events that are ready.
    /// - Returns: the watcher, to `cancel()` it; the loop keeps it alive without the handle.
    /// - Throws: `EventLoopError.badDescriptor` when `fd` is not open, `.wrongThread` off the
    ///   loop's thread, `.libevent` when libevent refuses the fd.
    @available(*, noasync, message: "loop thread only; in async code watch from the loop: `try await loop.submit { try loop.watch(…) }`")
    public func watch(_ fd: Int32, for events: IOEvents, priority: Priority = .input,
                      _ handler: @escaping (IOEvents) -> Void) throws(EventLoopError) -> Watcher
    {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.watch(_:for:priority:_:)") }
        let source = try WatchSource(loop: self, fd: fd, events: events, priority: priority, handler: handler)
        return Watcher(source: source)
    }
}
