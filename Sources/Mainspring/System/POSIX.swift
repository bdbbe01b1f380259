// Sources/Mainspring/System/ holds what talks to the operating system rather than to libevent:
// the lock, thread-locals, the clocks and the POSIX calls. With Libevent/, it is the only folder
// that calls C or handles raw pointers; the rest of Mainspring sees typed Swift wrappers.
internal import CMainspringSystem
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Monotonic time in nanoseconds (`CLOCK_MONOTONIC`, the clock libevent's precise timers use).
/// About 20 ns per call through the vDSO.
/// `package`: `Semaphore` and `Queue` (MainspringPatterns) time their waits with it.
@inline(__always)
package func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

/// The system's calendar time in milliseconds since 1970-01-01 UTC (`CLOCK_REALTIME`, through
/// the vDSO). Read only for a real loop (`EventLoop.calendarMilliseconds()`).
package func realtimeMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000 + Int64(ts.tv_nsec) / 1_000_000
}

/// The calling thread's identity for ownership checks (`pthread_self`).
@inline(__always)
package func currentThreadID() -> UInt { UInt(bitPattern: Int(bitPattern: pthread_self())) }

/// Whether the caller is the process's main thread (its kernel thread id equals the pid).
func isProcessMainThread() -> Bool { ms_gettid() == getpid() }

/// Unblocks `signal` for the calling thread. Threads started by libdispatch block signals, and
/// threads inherit their creator's mask, so a loop thread may start with its signals blocked.
func unblockSignalInCurrentThread(_ signal: Int32) {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, signal)
    pthread_sigmask(SIG_UNBLOCK, &set, nil)
}

/// Blocks `SIGPIPE` for the calling thread: a write to a pipe whose reader left then fails with
/// `EPIPE` instead of killing the process.
func blockBrokenPipeSignalInCurrentThread() {
    var set = sigset_t()
    sigemptyset(&set)
    sigaddset(&set, SIGPIPE)
    pthread_sigmask(SIG_BLOCK, &set, nil)
}

/// Makes writes to a closed socket return EPIPE instead of killing the process with SIGPIPE
/// (libevent writes with writev, which has no MSG_NOSIGNAL). Done once, when the first socket
/// is made.
let ignoreSIGPIPE: Void = { _ = signal(SIGPIPE, SIG_IGN) }()

/// Whether `fd` names an open file description.
func isOpenDescriptor(_ fd: Int32) -> Bool { fd >= 0 && fcntl(fd, F_GETFD) != -1 }

/// Closes an fd Mainspring owns (accepted sockets that could not be handed over, say).
func closeDescriptor(_ fd: Int32) { _ = close(fd) }

/// The text of an errno value ("Connection reset by peer"), for messages.
func errnoName(_ code: Int32) -> String { String(cString: strerror(code)) }

/// An errno value as error messages give it: "Connection reset by peer (errno 104)".
/// `package`: MainspringHTTP's errors say it the same way.
package func errnoDescription(_ code: Int32) -> String { "\(errnoName(code)) (errno \(code))" }

/// Which file an fd names: its device and inode (nil when `fd` is not open).
/// `package`: `JournalStream` (MainspringServices) and the tests compare descriptors with it.
package struct FileIdentity: Equatable, Sendable, CustomStringConvertible {
    package let device: UInt64
    package let inode: UInt64

    package init?(of fd: Int32) {
        var st = stat()
        guard fd >= 0, fstat(fd, &st) == 0 else { return nil }
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
    }

    package var description: String { "\(device):\(inode)" }
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

// MARK: Non-blocking I/O

/// The result of one non-blocking system call that moves bytes (`read`, `write`).
enum IOResult: Equatable {
    /// It moved this many bytes (0 from `read` is end of file).
    case bytes(Int)
    /// `EAGAIN`/`EWOULDBLOCK`: nothing to move now.
    case wouldBlock
    /// Any other failure, with its `errno`.
    case failure(Int32)
}

/// Runs a byte-moving system call (returning a count, or -1 with `errno`) the way every
/// non-blocking call here must be run: retried on `EINTR`, `EAGAIN` mapped to `.wouldBlock`.
@inline(__always)
func retryingInterrupts(_ call: () -> Int) -> IOResult {
    while true {
        let n = call()
        if n >= 0 { return .bytes(n) }
        let code = errno
        if code == EINTR { continue }
        if code == EAGAIN || code == EWOULDBLOCK { return .wouldBlock }
        return .failure(code)
    }
}

/// One `read(2)` of `fd` into `buffer[offset...]`.
func readOnce(_ fd: Int32, into buffer: inout [UInt8], from offset: Int = 0) -> IOResult {
    buffer.withUnsafeMutableBytes { raw in
        retryingInterrupts { read(fd, raw.baseAddress! + offset, raw.count - offset) }
    }
}

/// One `write(2)` of the bytes of a trivial value (`T`'s memory as is).
func writeOnce<T: BitwiseCopyable>(_ fd: Int32, bytesOf value: T) -> IOResult {
    withUnsafeBytes(of: value) { raw in retryingInterrupts { write(fd, raw.baseAddress, raw.count) } }
}

/// Adds one to an eventfd's counter, making it readable. Never blocks on a non-blocking eventfd
/// (a full counter, after 2^64 - 2 unread writes, cannot happen here).
func incrementEventCounter(_ fd: Int32) { _ = writeOnce(fd, bytesOf: UInt64(1)) }

/// Resets an eventfd's counter (one 8-byte `read`), so that it is no longer readable. Never
/// blocks on a non-blocking eventfd; does nothing when the counter is already zero.
func resetEventCounter(_ fd: Int32) {
    var value: UInt64 = 0
    _ = withUnsafeMutableBytes(of: &value) { raw in retryingInterrupts { read(fd, raw.baseAddress, 8) } }
}

/// A non-blocking, close-on-exec eventfd. Throws `.system` when none can be made.
func makeEventCounter() throws(EventLoopError) -> Int32 {
    let fd = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
    guard fd >= 0 else { throw .system(function: "eventfd", errno: errno) }
    return fd
}

/// An eventfd that wakes a sleeping loop. `signal()` may be called from any thread.
final class WakeupDescriptor: Sendable {
    let fd: Int32

    init() throws(EventLoopError) { fd = try makeEventCounter() }

    deinit { close(fd) }

    /// Makes the fd readable. Never blocks.
    func signal() { incrementEventCounter(fd) }

    /// Resets the counter so the fd is no longer readable.
    func drain() { resetEventCounter(fd) }
}

// MARK: Pipes and waiting

/// A pipe made close-on-exec and non-blocking atomically: (read end, write end).
func makeNonBlockingPipe() throws(EventLoopError) -> (read: Int32, write: Int32) {
    var fds: [Int32] = [-1, -1]
    guard ms_pipe2(&fds, Int32(O_CLOEXEC | O_NONBLOCK)) == 0 else {
        throw .system(function: "pipe2", errno: errno)
    }
    return (fds[0], fds[1])
}

/// Asks for a pipe buffer of `bytes` (`F_SETPIPE_SZ`, Linux; hidden behind `_GNU_SOURCE` in
/// glibc's headers). Best effort: the kernel may refuse or round it.
func setPipeCapacity(_ fd: Int32, bytes: Int32) {
    let setPipeSize: Int32 = 1031
    _ = fcntl(fd, setPipeSize, bytes)
}

/// Sets how late the kernel may wake the calling thread from a timed sleep (default 50 µs).
func setTimerSlack(nanoseconds: UInt) { _ = ms_set_timer_slack(nanoseconds) }

/// Sleeps until `deadline` on the `CLOCK_MONOTONIC` scale (`monotonicNanoseconds()`), to the
/// timer slack's precision. A signal may end it early.
func sleepUntil(monotonicNanoseconds deadline: UInt64) {
    var ts = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
    _ = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil)
}

/// Waits until one of `descriptors` is ready for its events (`POLLIN`, `POLLOUT`), or
/// `timeoutMilliseconds` passed (-1: no limit). Returns the ready ones' indexes.
@discardableResult
func waitForReadiness(_ descriptors: [(fd: Int32, events: Int16)], timeoutMilliseconds: Int32) -> [Int] {
    var fds = descriptors.map { pollfd(fd: $0.fd, events: $0.events, revents: 0) }
    guard poll(&fds, nfds_t(fds.count), timeoutMilliseconds) > 0 else { return [] }
    return fds.indices.filter { fds[$0].revents != 0 }
}

/// `POLLIN` and `POLLOUT` as `waitForReadiness` takes them.
let pollReadable = Int16(POLLIN)
let pollWritable = Int16(POLLOUT)

/// The little-endian `UInt64` at `offset` in `bytes` (unaligned reads allowed).
func loadUInt64(from bytes: [UInt8], at offset: Int) -> UInt64 {
    bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: offset, as: UInt64.self) }
}

/// A connected pair of Unix stream sockets, non-blocking and close-on-exec (`socketpair`).
func makeStreamSocketPair() throws(EventLoopError) -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
    guard socketpair(AF_UNIX, type, 0, &fds) == 0 else { throw .system(function: "socketpair", errno: errno) }
    return (fds[0], fds[1])
}
