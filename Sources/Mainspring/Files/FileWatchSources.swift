#if canImport(Glibc)
import Glibc
#endif

/// A loop's inotify descriptor and the watches on it: reads the kernel's records (at `.input`
/// priority, at most `readsPerTurn` reads a turn) and hands each watch what concerns it. Made
/// with the loop's first file watch (`EventLoop.fileWatchHub`), closed with its last. Loop
/// thread only.
final class InotifyHub: Source {
    let fd: Int32
    private var buffer = [UInt8](repeating: 0, count: 65_536)
    /// The watches by kernel watch descriptor (several watches of one directory share one).
    private var watches: [Int32: [FileWatchSource]] = [:]

    /// The mask every watch uses (so that a directory watched twice keeps one mask).
    static let mask: InotifyMask = [.modify, .attributes, .movedFrom, .movedTo, .create, .delete, .deleteSelf,
                                    .moveSelf, .onlyDirectory, .excludeUnlinked]
    static let readsPerTurn = 4

    /// The loop's hub, made if it has none. - Throws: `.cannotWatch(path, errno)` when no
    /// inotify descriptor can be made (`EMFILE`: the user's limit of instances).
    static func hub(of loop: EventLoop, for path: String) throws(FileWatchError) -> InotifyHub {
        if let hub = loop.fileWatchHub, !hub.isClosed { return hub }
        let fd: Int32
        switch makeInotifyDescriptor() {
        case .success(let made): fd = made
        case .failure(let error): throw .cannotWatch(path: path, errno: error.code)
        }
        let hub: InotifyHub
        do {
            hub = try InotifyHub(loop: loop, fd: fd)
        } catch {
            throw .loop(error)
        }
        loop.fileWatchHub = hub
        return hub
    }

    private init(loop: EventLoop, fd: Int32) throws(EventLoopError) {
        self.fd = fd
        super.init(loop: loop, priority: .input)
        do {
            try addNativeEvent(fd: fd, readiness: .read, persistent: true)
        } catch {
            close()
            throw error
        }
    }

    override var keepsFiring: Bool { true }

    /// Adds the kernel watch of `directory` for `watch`; returns its descriptor.
    func add(_ watch: FileWatchSource, directory: String, path: String) throws(FileWatchError) -> Int32 {
        switch addInotifyWatch(fd, path: directory, mask: Self.mask) {
        case .success(let descriptor):
            watches[descriptor, default: []].append(watch)
            return descriptor
        case .failure(let error):
            throw .cannotWatch(path: error.code == ENOTDIR ? path : directory, errno: error.code)
        }
    }

    /// `watch` ended: its kernel watch goes when no other watch shares it, and the hub when it
    /// was the last.
    func remove(_ watch: FileWatchSource) {
        guard var list = watches[watch.watchDescriptor] else { return }
        list.removeAll { $0 === watch }
        if list.isEmpty {
            watches.removeValue(forKey: watch.watchDescriptor)
            if !watch.kernelRemovedWatch { removeInotifyWatch(fd, watch: watch.watchDescriptor) }
        } else {
            watches[watch.watchDescriptor] = list
        }
        if watches.isEmpty { close() }
    }

    /// How many kernel watches the descriptor holds (from `/proc/self/fdinfo`; tests).
    var kernelWatchCount: Int? { inotifyWatchCount(fd) }

    override func perform(_ readiness: Readiness) {
        for _ in 0..<Self.readsPerTurn {
            let records: [InotifyRecord]
            switch readInotifyRecords(fd, buffer: &buffer) {
            case .success(let read): records = read
            case .failure:
                // Reading an inotify descriptor fails only for a buffer too small for a record,
                // which 64 KiB is not: nothing to do but wait for the next readiness.
                return
            }
            if records.isEmpty { return }
            dispatch(records)
            if isClosed { return }
        }
    }

    /// Hands each watch its share of one read's records, pairing the halves of renames within
    /// a directory (same cookie, same watch) for directory watches.
    private func dispatch(_ records: [InotifyRecord]) {
        var movedTo: [UInt32: Int] = [:]
        for (index, record) in records.enumerated() where record.mask.contains(.movedTo) {
            movedTo[record.cookie] = index
        }
        var paired = Set<Int>()
        for (index, record) in records.enumerated() {
            if record.mask.contains(.overflow) {
                for list in watches.values { for watch in list { watch.overflowed() } }
                continue
            }
            guard let list = watches[record.watch] else { continue }
            var renamedTo: String?
            if record.mask.contains(.movedFrom), let other = movedTo[record.cookie], other > index,
               records[other].watch == record.watch
            {
                renamedTo = records[other].name
                paired.insert(other)
            }
            for watch in list {
                if watch.name == nil {
                    if paired.contains(index) { continue }  // the second half of a rename already told
                    watch.interpretForDirectory(record, renamedTo: renamedTo)
                } else {
                    watch.interpretForFile(record)
                }
            }
        }
    }

    override func didClose() {
        native = nil
        closeDescriptor(fd)
        if loop.fileWatchHub === self { loop.fileWatchHub = nil }
        let all = watches.values.flatMap { $0 }
        watches = [:]
        for watch in all { watch.hubClosed() }
    }
}

/// One watch (`observeFile(at:)`, `fileChanges(at:)`): the path, what it knows of it, the events
/// waiting for its handler (each watch's handler runs as its own callback). Loop thread only.
final class FileWatchSource: Source {
    /// The path as given (without trailing slashes).
    let path: String
    /// The directory whose kernel watch this uses: the path itself, or a file's directory.
    let directory: String
    /// A file watch's name in `directory`; nil for a directory watch.
    let name: String?
    private(set) var watchDescriptor: Int32 = -1
    /// The kernel removed the watch itself (its directory is gone).
    private(set) var kernelRemovedWatch = false
    /// A file watch: whether the name exists now.
    private var exists = true
    private var queued: [FileEvent] = []
    /// The last event delivered is the watch's last (`watchedPathRemoved`).
    private var isEnding = false
    private var handler: ((FileEvent) -> Void)?
    private weak var hub: InotifyHub?
    /// Runs once when the watch closes (cancelled, ended, the loop going away).
    var onClosed: (() -> Void)?

    /// Starts a watch of `path` on `loop`.
    static func start(path given: String, on loop: EventLoop, handler: @escaping (FileEvent) -> Void)
        throws(FileWatchError) -> FileWatchSource
    {
        var path = given
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        let isDirectory: Bool
        switch fileKind(path) {
        case .success(let directory): isDirectory = directory
        case .failure(let error): throw .cannotWatch(path: given, errno: error.code)
        }
        let hub = try InotifyHub.hub(of: loop, for: given)
        let source: FileWatchSource
        if isDirectory {
            source = FileWatchSource(loop: loop, path: path, directory: path, name: nil, handler: handler)
        } else {
            let slash = path.lastIndex(of: "/")
            let directory = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
            let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
            source = FileWatchSource(loop: loop, path: path, directory: directory, name: name, handler: handler)
        }
        do {
            source.watchDescriptor = try hub.add(source, directory: source.directory, path: given)
        } catch {
            source.close()
            if hub.isEmpty { hub.close() }
            throw error
        }
        source.hub = hub
        return source
    }

    private init(loop: EventLoop, path: String, directory: String, name: String?, handler: @escaping (FileEvent) -> Void) {
        self.path = path
        self.directory = directory
        self.name = name
        self.handler = handler
        super.init(loop: loop, priority: .input)
    }

    private func entryPath(_ entry: String) -> String {
        directory == "/" ? "/" + entry : directory + "/" + entry
    }

    // MARK: Interpreting the kernel's records

    /// A record of the watched directory, for a file watch: only its name concerns it, and the
    /// directory's own end.
    func interpretForFile(_ record: InotifyRecord) {
        let mask = record.mask
        if record.name.isEmpty {
            if !mask.isDisjoint(with: [.deleteSelf, .moveSelf, .unmounted, .ignored]) { directoryGone(mask) }
            return
        }
        guard record.name == name else { return }
        if mask.contains(.create) {
            exists = true
            note(FileEvent(.created, path: path))
        } else if mask.contains(.movedTo) {
            note(FileEvent(exists ? .replaced : .created, path: path))
            exists = true
        } else if mask.contains(.delete) {
            exists = false
            note(FileEvent(.deleted, path: path))
        } else if mask.contains(.movedFrom) {
            exists = false
            note(FileEvent(.movedAway, path: path))
        } else if mask.contains(.modify) {
            note(FileEvent(.modified, path: path))
        } else if mask.contains(.attributes) {
            note(FileEvent(.attributesChanged, path: path))
        }
    }

    /// A record for a directory watch; `renamedTo` is the other half of a rename within it.
    func interpretForDirectory(_ record: InotifyRecord, renamedTo: String?) {
        let mask = record.mask
        if record.name.isEmpty {
            if !mask.isDisjoint(with: [.deleteSelf, .moveSelf, .unmounted, .ignored]) {
                directoryGone(mask)
            } else if mask.contains(.attributes) {
                note(FileEvent(.attributesChanged, path: path))
            }
            return
        }
        let entry = entryPath(record.name)
        if mask.contains(.create) {
            note(FileEvent(.created, path: entry))
        } else if mask.contains(.movedFrom) {
            if let renamedTo {
                note(FileEvent(.renamed, path: entryPath(renamedTo), previousPath: entry))
            } else {
                note(FileEvent(.movedAway, path: entry))
            }
        } else if mask.contains(.movedTo) {
            note(FileEvent(.movedIn, path: entry))
        } else if mask.contains(.delete) {
            note(FileEvent(.deleted, path: entry))
        } else if mask.contains(.modify) {
            note(FileEvent(.modified, path: entry))
        } else if mask.contains(.attributes) {
            note(FileEvent(.attributesChanged, path: entry))
        }
    }

    /// The directory was removed, moved or unmounted (or its watch dropped by the kernel): the
    /// last event.
    private func directoryGone(_ mask: InotifyMask) {
        guard !isEnding else { return }
        isEnding = true
        if mask.contains(.ignored) || mask.contains(.deleteSelf) || mask.contains(.unmounted) { kernelRemovedWatch = true }
        note(FileEvent(.watchedPathRemoved, path: directory))
    }

    /// Events were lost: every watch is told; a file watch looks again whether its file exists.
    func overflowed() {
        guard !isEnding else { return }
        if name != nil, case .success(let isDirectory) = fileKind(path) { exists = !isDirectory } else if name != nil {
            exists = false
        }
        note(FileEvent(.overflow, path: path))
    }

    /// The hub closed (the loop is going away): the watch ends without an event.
    func hubClosed() {
        kernelRemovedWatch = true  // the descriptor is closed: nothing to remove
        hub = nil
        close()
    }

    /// Queues `event` for the handler; a modification right after an identical one waiting is
    /// the same news.
    private func note(_ event: FileEvent) {
        guard !isClosed else { return }
        if event.kind == .modified, queued.last == event { return }
        queued.append(event)
        fire(.read)
    }

    override func perform(_ readiness: Readiness) {
        while !queued.isEmpty && !isClosed {
            let events = queued
            queued = []
            for event in events {
                guard !isClosed else { return }
                handler?(event)
                if event.kind == .watchedPathRemoved {
                    close()
                    return
                }
            }
        }
    }

    override func didClose() {
        handler = nil
        queued = []
        hub?.remove(self)
        hub = nil
        let closed = onClosed
        onClosed = nil
        closed?()
    }
}

extension InotifyHub {
    /// Whether no watch uses the hub.
    var isEmpty: Bool { watches.isEmpty }
}
