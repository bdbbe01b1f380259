internal import CLibevent
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Monotonic time in nanoseconds (`CLOCK_MONOTONIC`, the clock libevent's precise timers use).
/// About 20 ns per call through the vDSO.
@inline(__always)
func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

/// The calling thread's identity for ownership checks (`pthread_self`).
@inline(__always)
func currentThreadID() -> UInt { UInt(bitPattern: Int(bitPattern: pthread_self())) }

/// Whether the caller is the process's main thread (its kernel thread id equals the pid).
func isProcessMainThread() -> Bool { ms_gettid() == getpid() }

var currentErrno: Int32 { errno }

/// Unblocks `signal` for the calling thread. Threads started by libdispatch block signals, and
/// threads inherit their creator's mask, so a loop thread may start with its signals blocked.
func unblockSignalInCurrentThread(_ signal: Int32) {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, signal)
    pthread_sigmask(SIG_UNBLOCK, &set, nil)
}

/// Whether `fd` names an open file description.
func isOpenDescriptor(_ fd: Int32) -> Bool { fd >= 0 && fcntl(fd, F_GETFD) != -1 }

/// Which file an fd names: its device and inode (nil when `fd` is not open).
struct FileIdentity: Equatable {
    let device: UInt64
    let inode: UInt64

    init?(of fd: Int32) {
        var st = stat()
        guard fd >= 0, fstat(fd, &st) == 0 else { return nil }
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
    }
}

/// Whether `fd` is a regular file (epoll refuses those: they are always ready).
func isRegularFile(_ fd: Int32) -> Bool {
    var st = stat()
    return fstat(fd, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG
}

/// Whether epoll can watch `fd`. It refuses regular files and devices without a poll method
/// (`EPERM`), which are always ready instead. Costs a few syscalls: call it once per watcher.
func epollAccepts(_ fd: Int32) -> Bool {
    if isRegularFile(fd) { return false }
    let probe = epoll_create1(Int32(EPOLL_CLOEXEC))
    guard probe >= 0 else { return true }
    defer { close(probe) }
    var event = epoll_event()
    event.events = EPOLLIN.rawValue
    if epoll_ctl(probe, EPOLL_CTL_ADD, fd, &event) == 0 { return true }
    return errno != EPERM
}

/// Resets an eventfd's counter (one 8-byte `read`), so that it is no longer readable. Never
/// blocks on a non-blocking eventfd; does nothing when the counter is already zero.
func resetEventCounter(_ fd: Int32) {
    var value: UInt64 = 0
    while read(fd, &value, 8) < 0 && errno == EINTR {}
}

/// The result of one `read(2)`.
enum ReadResult {
    case bytes(Int)
    case endOfFile
    case wouldBlock
    case failure(Int32)
}

/// One `read(2)` into the front of `buffer` (at most `buffer.count` bytes). Retries `EINTR`;
/// `EAGAIN` becomes `.wouldBlock`.
func readOnce(_ fd: Int32, into buffer: inout [UInt8]) -> ReadResult {
    while true {
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n > 0 { return .bytes(n) }
        if n == 0 { return .endOfFile }
        let e = errno
        if e == EINTR { continue }
        if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
        return .failure(e)
    }
}

/// Bytes the process has allocated with malloc and not freed (glibc's `mallinfo2`), for the
/// leak tests.
func heapBytesInUse() -> Int { Int(mallinfo2().uordblks) }

/// An eventfd that wakes a sleeping loop. `signal()` may be called from any thread.
final class WakeupDescriptor: Sendable {
    let fd: Int32

    init() throws(EventLoopError) {
        let fd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
        guard fd >= 0 else { throw .system(function: "eventfd", errno: errno) }
        self.fd = fd
    }

    deinit { close(fd) }

    /// Makes the fd readable (adds one to its counter). Never blocks.
    func signal() {
        var one: UInt64 = 1
        while write(fd, &one, 8) < 0 && errno == EINTR {}
    }

    /// Resets the counter so the fd is no longer readable.
    func drain() { resetEventCounter(fd) }
}
