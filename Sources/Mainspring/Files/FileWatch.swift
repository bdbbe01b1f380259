/// Something that happened to a watched file or directory (``EventLoop/observeFile(at:_:)``,
/// `EventLoop.fileChanges(at:)`).
public struct FileEvent: Sendable, Hashable, CustomStringConvertible {
    /// What happened.
    public enum Kind: Sendable, Hashable, CustomStringConvertible {
        /// The contents were written. Writes that arrive together (one read of the kernel's
        /// queue, or while the handler has not run yet) are one event.
        case modified
        /// The permissions, owner, timestamps or link count changed.
        case attributesChanged
        /// The name appeared: created, or (a file watch) moved or renamed there while nothing
        /// had that name.
        case created
        /// The name was removed (`unlink`, `rmdir`).
        case deleted
        /// The name was moved or renamed away (to another directory, or, for a file watch, to
        /// another name).
        case movedAway
        /// (A directory watch) an entry was moved into the directory from elsewhere.
        case movedIn
        /// (A directory watch) an entry was renamed within the directory: ``FileEvent/path`` is
        /// its new name, ``FileEvent/previousPath`` the old one.
        case renamed
        /// (A file watch) another file was renamed over the watched name — an editor's or a
        /// configuration manager's save: write a temporary file, rename it over the original.
        /// One event; the watch goes on, now on the new file.
        case replaced
        /// The watched directory (for a file watch: the directory that holds the file) was
        /// removed, moved away, or its file system unmounted. The watch ends after this event.
        case watchedPathRemoved
        /// The kernel's queue of events overflowed (`IN_Q_OVERFLOW`: more than
        /// `/proc/sys/fs/inotify/max_queued_events` unread, or an async consumer that fell
        /// 4,096 events behind): events were lost. Look at the files again.
        case overflow

        public var description: String {
            switch self {
            case .modified: "modified"
            case .attributesChanged: "attributes changed"
            case .created: "created"
            case .deleted: "deleted"
            case .movedAway: "moved away"
            case .movedIn: "moved in"
            case .renamed: "renamed"
            case .replaced: "replaced"
            case .watchedPathRemoved: "watched path removed"
            case .overflow: "overflow"
            }
        }
    }

    /// What happened.
    public let kind: Kind
    /// The path it happened to: the watched file; an entry of a watched directory (the
    /// directory's path, a slash and the entry's name); the watched directory itself (its
    /// attributes, its removal, an overflow).
    public let path: String
    /// For ``Kind/renamed``: the entry's path before.
    public let previousPath: String?

    /// An event; `previousPath` only for ``Kind/renamed``.
    public init(_ kind: Kind, path: String, previousPath: String? = nil) {
        self.kind = kind
        self.path = path
        self.previousPath = previousPath
    }

    public var description: String {
        if let previousPath { return "\(kind): \(previousPath) -> \(path)" }
        return "\(kind): \(path)"
    }
}

/// File watching: inotify, one descriptor per loop for all its watches.
///
/// A **file** is watched through its directory, for its name: so the watch survives what
/// editors and configuration managers do — write a temporary file and rename it over the
/// original (one ``FileEvent/Kind/replaced`` event), or delete the file and create it again
/// (``FileEvent/Kind/deleted``, then ``FileEvent/Kind/created``). A change made through another
/// name of the same file (a hard link elsewhere, a symbolic link's target) is not seen: watch
/// that path. A **directory** is watched for its entries (created, deleted, modified,
/// attributes, moved in, moved away, renamed within it) and for itself (its attributes, its
/// removal). Neither is recursive.
///
/// Events are read at `.input` priority. The kernel queues them for all of a loop's watches
/// together; when more than `/proc/sys/fs/inotify/max_queued_events` wait unread (a loop stuck
/// in one callback), the rest is lost and every watch gets ``FileEvent/Kind/overflow``.
extension EventLoop {
    /// Calls `handler` on this loop for each change to the file or directory at `path`, until
    /// the watcher is cancelled or the watched path is removed (the last event is then
    /// ``FileEvent/Kind/watchedPathRemoved``). Cancelling removes the kernel's watch (when no
    /// other watch of this loop shares its directory). Loop thread only.
    ///
    /// Costs one inotify watch per directory watched (shared by this loop's watches of that
    /// directory, and of files in it) and one loop source per watch; the loop's inotify
    /// descriptor is made with its first watch and closed with its last.
    /// - Throws: ``FileWatchError/cannotWatch(path:errno:)`` naming the path: `ENOENT` when it
    ///   does not exist, `EACCES`, `ENOSPC` (the kernel's limit of watches, `max_user_watches`),
    ///   `EMFILE` (of inotify instances); `.loop(.wrongThread)` off the loop's thread.
    @available(*, noasync, message: "loop thread only; in async code iterate `fileChanges(at:)`")
    public func observeFile(at path: String, _ handler: @escaping (FileEvent) -> Void) throws(FileWatchError) -> Watcher {
        guard claimThread() else { throw .loop(.wrongThread(function: "EventLoop.observeFile(at:_:)")) }
        let source = try FileWatchSource.start(path: path, on: self, handler: handler)
        return Watcher(source: source)
    }

    /// The changes to the file or directory at `path` as an async sequence, following the rules
    /// of `observeFile(at:_:)`; it ends after ``FileEvent/Kind/watchedPathRemoved``.
    ///
    /// ```swift
    /// for await event in try loop.fileChanges(at: "/etc/myapp/config.json") where event.kind != .attributesChanged {
    ///     reload()
    /// }
    /// ```
    ///
    /// The watch starts at once (a missing path throws here). Events wait for the consumer, up
    /// to 4,096; past that they are dropped and one ``FileEvent/Kind/overflow`` takes their
    /// place. One consumer. Cancelling the iterating task ends the sequence (`nil`) and removes
    /// the watch; so does dropping the sequence. Loop thread only (the `async` overload works
    /// from any task).
    /// - Throws: as `observeFile(at:_:)`.
    public func fileChanges(at path: String) throws(FileWatchError) -> FileEvents {
        guard claimThread() else { throw .loop(.wrongThread(function: "EventLoop.fileChanges(at:)")) }
        let feed = LoopFeed<FileEvent>(loop: self, bound: Int.max)
        var overflowed = false
        let source = try FileWatchSource.start(path: path, on: self) { [weak feed] event in
            guard let feed else { return }
            if feed.buffered < FileEvents.limit {
                overflowed = false
                feed.yield(event)
            } else if !overflowed {
                overflowed = true
                feed.yield(FileEvent(.overflow, path: path))
            }
        }
        source.onClosed = { [weak feed] in feed?.finish() }
        feed.attach(sources: [source])
        return FileEvents(feed: feed)
    }

    /// `fileChanges(at:)` from any task: starts the watch on this loop (no hop from a task
    /// already on it).
    /// - Throws: as `fileChanges(at:)`, and `.loop(.loopClosed)` when the loop has shut down.
    public nonisolated(nonsending) func fileChanges(at path: String) async throws(FileWatchError) -> FileEvents {
        try await onLoop(closed: .loop(.loopClosed)) { () throws(FileWatchError) in try self.fileChanges(at: path) }
    }

    /// ``observeFile(at:_:)``, its failures as `EventLoopError` (`.watchFailed`, `.wrongThread`).
    @available(*, deprecated, message: "observeFile(at:_:) throws FileWatchError, the errors of watching a path")
    public func watchFile(at path: String, _ handler: @escaping (FileEvent) -> Void) throws(EventLoopError) -> Watcher {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.watchFile(at:_:)") }
        do { return try observeFile(at: path, handler) } catch { throw error.watchError }
    }

    /// `fileChanges(at:)`, its failures as `EventLoopError` (`.watchFailed`, `.wrongThread`).
    @available(*, deprecated, message: "fileChanges(at:) throws FileWatchError, the errors of watching a path")
    public func fileEvents(at path: String) throws(EventLoopError) -> FileEvents {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.fileEvents(at:)") }
        do { return try fileChanges(at: path) } catch { throw error.watchError }
    }

    /// `fileChanges(at:)` from any task, its failures as `EventLoopError`.
    @available(*, deprecated, message: "fileChanges(at:) throws FileWatchError, the errors of watching a path")
    public nonisolated(nonsending) func fileEvents(at path: String) async throws(EventLoopError) -> FileEvents {
        do { return try await fileChanges(at: path) } catch { throw error.watchError }
    }

    /// `EventLoop.fileChanges(at:)`: an `AsyncSequence` of ``FileEvent``s.
    public struct FileEvents: AsyncSequence, Sendable {
        public typealias Element = FileEvent
        public typealias Failure = Never
        /// Events kept for a consumer that has not taken them; past it, one `.overflow`.
        static let limit = 4_096
        let feed: LoopFeed<FileEvent>

        public func makeAsyncIterator() -> Iterator {
            feed.claim("EventLoop.fileChanges(at:)")
            return Iterator(feed: feed)
        }

        /// The iterator: use it from one task.
        public struct Iterator: AsyncIteratorProtocol {
            let feed: LoopFeed<FileEvent>

            public nonisolated(nonsending) mutating func next() async -> FileEvent? { await feed.next() }

            /// `next()`, on the caller's executor (see `Connection.Lines.Iterator`).
            public nonisolated(nonsending) mutating func next(isolation actor: (any Actor)?) async -> FileEvent? {
                await feed.next()
            }
        }
    }
}
