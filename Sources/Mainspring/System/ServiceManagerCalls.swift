// The operating-system calls behind Systemd/: the notification datagram (an AF_UNIX SOCK_DGRAM
// socket), the checks made on descriptors passed by socket activation, and the process
// environment. Everything here is internal; Systemd/ holds the typed public API.
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// MARK: The notification socket

/// The longest `sun_path` a unix socket address may use: 108 bytes, one of which is the
/// terminating NUL for a path (an abstract name uses all 108, its first byte being NUL).
/// `package`: `ServiceNotifier` (MainspringServices) checks `NOTIFY_SOCKET` against it.
package let unixSocketPathCapacity = MemoryLayout.size(ofValue: sockaddr_un().sun_path)

/// An AF_UNIX datagram socket that sends to one address: the service manager's notification
/// socket. `send` may be called from any thread.
///
/// The socket is made in `init` (so that a process that later runs out of descriptors can still
/// notify); if that fails, `send` tries again and reports the failure.
/// `package`: the notify socket of `ServiceNotifier` (MainspringServices); its system calls stay here.
package final class DatagramSender: Sendable {
    /// The address's `sun_path` bytes: a path (NUL-terminated here) or an abstract name
    /// (starting with NUL, not terminated).
    private let pathBytes: [UInt8]
    private let descriptor = Protected<Int32>(-1)

    /// `pathBytes` must fit `unixSocketPathCapacity` (checked by the caller).
    package init(pathBytes: [UInt8]) {
        precondition(pathBytes.count <= unixSocketPathCapacity, "Mainspring: unix socket address too long")
        self.pathBytes = pathBytes
        descriptor.withLock { fd in fd = makeDatagramSocket() }
    }

    deinit {
        let fd = descriptor.withLock { $0 }
        if fd >= 0 { close(fd) }
    }

    /// Sends `message` as one datagram, without blocking (`MSG_DONTWAIT`), retried on `EINTR`.
    /// - Throws: `.system(function:errno:)` naming `function`; `EAGAIN` when the receiver's queue
    ///   is full.
    package func send(_ message: [UInt8], function: @autoclosure () -> String) throws(EventLoopError) {
        let fd = descriptor.withLock { fd -> Int32 in
            if fd < 0 { fd = makeDatagramSocket() }
            return fd
        }
        guard fd >= 0 else { throw .system(function: "socket(AF_UNIX, SOCK_DGRAM) for \(function())", errno: errno) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { path in
            path.copyBytes(from: pathBytes)
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + pathBytes.count)
        let result = message.withUnsafeBytes { bytes in
            withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                    retryingInterrupts {
                        sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT),
                               socketAddress, length)
                    }
                }
            }
        }
        switch result {
        case .bytes: return
        case .wouldBlock: throw .system(function: function(), errno: EAGAIN)
        case .failure(let code): throw .system(function: function(), errno: code)
        }
    }
}

/// A close-on-exec AF_UNIX datagram socket, or -1 with `errno`.
private func makeDatagramSocket() -> Int32 {
    socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
}

// MARK: Passed descriptors

/// What a descriptor is, for messages about descriptors that should have been listening
/// sockets: nil when `fd` is a listening stream socket, otherwise what it is instead ("a
/// regular file", "a datagram socket", "a stream socket that is not listening", …).
func listeningStreamSocketProblem(_ fd: Int32) -> String? { streamSocketProblem(fd, listening: true) }

/// What a descriptor is, for messages about descriptors that should have been connected
/// stream sockets (`Connection.adopting(descriptor:on:options:)`): nil when it is one.
func connectedStreamSocketProblem(_ fd: Int32) -> String? {
    if let problem = streamSocketProblem(fd, listening: false) { return problem }
    var storage = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    let connected = withUnsafeMutablePointer(to: &storage) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) == 0 }
    }
    return connected ? nil : "a stream socket that is not connected (\(errnoName(errno)))"
}

/// nil when `fd` is a stream socket that is listening (or, `listening` false, is not),
/// otherwise what it is instead.
private func streamSocketProblem(_ fd: Int32, listening wanted: Bool) -> String? {
    var st = stat()
    guard fstat(fd, &st) == 0 else { return "not an open descriptor (\(errnoName(errno)))" }
    switch st.st_mode & S_IFMT {
    case S_IFSOCK: break
    case S_IFREG: return "a regular file, not a socket"
    case S_IFIFO: return "a pipe, not a socket"
    case S_IFCHR: return "a character device, not a socket"
    case S_IFDIR: return "a directory, not a socket"
    case S_IFBLK: return "a block device, not a socket"
    default: return "not a socket"
    }
    var type: Int32 = 0
    var length = socklen_t(MemoryLayout<Int32>.size)
    guard getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) == 0 else {
        return "a socket whose type cannot be read (\(errnoName(errno)))"
    }
    switch type {
    case Int32(SOCK_STREAM.rawValue): break
    case Int32(SOCK_DGRAM.rawValue): return "a datagram socket, not a stream socket"
    case Int32(SOCK_SEQPACKET.rawValue): return "a sequential-packet socket, not a stream socket"
    default: return "a socket of type \(type), not a stream socket"
    }
    var listening: Int32 = 0
    length = socklen_t(MemoryLayout<Int32>.size)
    guard getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 else {
        return "a stream socket whose state cannot be read (\(errnoName(errno)))"
    }
    if wanted { return listening == 0 ? "a stream socket that is not listening" : nil }
    return listening != 0 ? "a listening socket (adopt it with Listener(.adopted(descriptor:), on:))" : nil
}

/// Marks `fd` close-on-exec (a passed descriptor is inherited without the flag). Returns the
/// `errno` on failure (`EBADF`: not open), nil on success.
func setCloseOnExec(_ fd: Int32) -> Int32? {
    let flags = fcntl(fd, F_GETFD)
    guard flags >= 0 else { return errno }
    if flags & FD_CLOEXEC != 0 { return nil }
    return fcntl(fd, F_SETFD, flags | FD_CLOEXEC) == 0 ? nil : errno
}

/// Makes `fd` non-blocking. Returns the `errno` on failure, nil on success.
func setNonBlocking(_ fd: Int32) -> Int32? {
    let flags = fcntl(fd, F_GETFL)
    guard flags >= 0 else { return errno }
    if flags & O_NONBLOCK != 0 { return nil }
    return fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 ? nil : errno
}

/// The process's soft limit on open descriptors (`RLIMIT_NOFILE`), or nil when unlimited.
func descriptorLimit() -> Int? {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { return nil }
    return Int(clamping: limit.rlim_cur)
}

// MARK: The process

/// This process's id.
/// `package`: `Watchdog` (MainspringServices) checks `WATCHDOG_PID` against it.
package func currentProcessID() -> Int32 { getpid() }

/// Removes `name` from the process environment, so that child processes do not inherit it.
/// Not thread-safe against other threads reading the environment (no POSIX call is): done once,
/// at start-up.
func removeEnvironmentVariable(_ name: String) { unsetenv(name) }

/// The process environment as the C library holds it now (`environ`), including changes made
/// with `setenv`/`unsetenv` since the process started.
func currentEnvironment() -> [String: String] {
    var result: [String: String] = [:]
    var entry = environ
    while let pointer = entry.pointee {
        let text = String(cString: pointer)
        if let equals = text.firstIndex(of: "=") {
            result[String(text[..<equals])] = String(text[text.index(after: equals)...])
        }
        entry += 1
    }
    return result
}
