internal import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

// The inotify calls behind file watching (Files/): the descriptor, adding and removing watches,
// and reading the kernel's variable-length `struct inotify_event` records into Swift values.

/// One inotify record, as the kernel wrote it.
struct InotifyRecord: Equatable {
    /// The watch it belongs to (-1 for a queue overflow).
    let watch: Int32
    let mask: InotifyMask
    /// Pairs the two halves of a rename (`movedFrom`, `movedTo`).
    let cookie: UInt32
    /// The entry of a watched directory it is about; empty for the directory itself.
    let name: String
}

/// inotify's event bits.
struct InotifyMask: OptionSet, Equatable {
    let rawValue: UInt32
    static let modify = InotifyMask(rawValue: UInt32(IN_MODIFY))
    static let attributes = InotifyMask(rawValue: UInt32(IN_ATTRIB))
    static let movedFrom = InotifyMask(rawValue: UInt32(IN_MOVED_FROM))
    static let movedTo = InotifyMask(rawValue: UInt32(IN_MOVED_TO))
    static let create = InotifyMask(rawValue: UInt32(IN_CREATE))
    static let delete = InotifyMask(rawValue: UInt32(IN_DELETE))
    static let deleteSelf = InotifyMask(rawValue: UInt32(IN_DELETE_SELF))
    static let moveSelf = InotifyMask(rawValue: UInt32(IN_MOVE_SELF))
    static let unmounted = InotifyMask(rawValue: UInt32(IN_UNMOUNT))
    static let overflow = InotifyMask(rawValue: UInt32(IN_Q_OVERFLOW))
    static let ignored = InotifyMask(rawValue: UInt32(IN_IGNORED))
    static let isDirectory = InotifyMask(rawValue: UInt32(IN_ISDIR))
    /// Options of `inotify_add_watch` (not events).
    static let onlyDirectory = InotifyMask(rawValue: UInt32(IN_ONLYDIR))
    static let excludeUnlinked = InotifyMask(rawValue: UInt32(IN_EXCL_UNLINK))
}

/// A non-blocking, close-on-exec inotify descriptor, or the errno (EMFILE: the user's limit of
/// inotify instances, `/proc/sys/fs/inotify/max_user_instances`).
func makeInotifyDescriptor() -> Result<Int32, Errno> {
    let fd = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
    return fd >= 0 ? .success(fd) : .failure(Errno(errno))
}

/// Watches `path` for `mask`; returns the watch descriptor (the same one for a path watched
/// already: the kernel has one watch per inode and descriptor), or the errno (ENOENT, EACCES,
/// ENOTDIR with `.onlyDirectory`, ENOSPC: `/proc/sys/fs/inotify/max_user_watches`).
func addInotifyWatch(_ fd: Int32, path: String, mask: InotifyMask) -> Result<Int32, Errno> {
    let watch = inotify_add_watch(fd, path, mask.rawValue)
    return watch >= 0 ? .success(watch) : .failure(Errno(errno))
}

/// Removes a watch (the kernel then queues `.ignored` for it). A watch the kernel removed
/// already (its directory is gone) gives EINVAL, which changes nothing.
func removeInotifyWatch(_ fd: Int32, watch: Int32) { _ = inotify_rm_watch(fd, watch) }

/// Reads what is queued on `fd` into `buffer` (at least 64 KiB: a record holds a name of up to
/// 255 bytes) and parses it. Empty when nothing is queued; the errno when the read fails.
func readInotifyRecords(_ fd: Int32, buffer: inout [UInt8]) -> Result<[InotifyRecord], Errno> {
    let count: Int
    switch readOnce(fd, into: &buffer) {
    case .bytes(let n): count = n
    case .wouldBlock: return .success([])
    case .failure(let code): return .failure(Errno(code))
    }
    let header = MemoryLayout<inotify_event>.size
    var records: [InotifyRecord] = []
    buffer.withUnsafeBytes { raw in
        var offset = 0
        while offset + header <= count {
            let watch = raw.loadUnaligned(fromByteOffset: offset, as: Int32.self)
            let mask = raw.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
            let cookie = raw.loadUnaligned(fromByteOffset: offset + 8, as: UInt32.self)
            let length = Int(raw.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
            let nameStart = offset + header
            guard nameStart + length <= count else { break }
            // The name is NUL-padded to an alignment boundary.
            let nameBytes = UnsafeRawBufferPointer(rebasing: raw[nameStart..<(nameStart + length)])
            let name = String(decoding: nameBytes.prefix { $0 != 0 }, as: UTF8.self)
            records.append(InotifyRecord(watch: watch, mask: InotifyMask(rawValue: mask), cookie: cookie, name: name))
            offset = nameStart + length
        }
    }
    return .success(records)
}

/// How many watches the inotify descriptor `fd` holds now, from `/proc/self/fdinfo` (one
/// `inotify wd:` line each); nil when it cannot be read. For tests and diagnostics.
func inotifyWatchCount(_ fd: Int32) -> Int? {
    guard let file = fopen("/proc/self/fdinfo/\(fd)", "r") else { return nil }
    defer { fclose(file) }
    var count = 0
    var line: UnsafeMutablePointer<CChar>?
    var capacity = 0
    defer { free(line) }
    while getline(&line, &capacity, file) > 0 {
        if let line, strncmp(line, "inotify wd:", 11) == 0 { count += 1 }
    }
    return count
}

/// Whether `path` is a directory (true) or another kind of file (false), following symbolic
/// links; the errno when it cannot be looked at (ENOENT, EACCES, ENOTDIR).
func fileKind(_ path: String) -> Result<Bool, Errno> {
    var st = stat()
    guard stat(path, &st) == 0 else { return .failure(Errno(errno)) }
    return .success((st.st_mode & S_IFMT) == S_IFDIR)
}
