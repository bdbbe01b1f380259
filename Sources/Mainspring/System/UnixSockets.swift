// Unix domain stream sockets: addresses, binding with a mode and stale-file rules, connecting,
// peer credentials. Imports Glibc only (not CLibevent), for its socket constants.
#if canImport(Glibc)
import Glibc
#endif

/// `sockaddr_un` bytes for `path`: a file path, or "@name" for Linux's abstract namespace.
/// - Throws: `.invalidAddress` for an empty path or one longer than `sun_path` holds (107
///   bytes and its NUL; 107 after the "@" of an abstract name).
func unixSocketAddress(_ path: String) throws(EventLoopError) -> [UInt8] {
    let abstract = path.hasPrefix("@")
    let name = Array((abstract ? String(path.dropFirst()) : path).utf8)
    let capacity = MemoryLayout.size(ofValue: sockaddr_un().sun_path)  // 108
    guard !path.isEmpty, !name.contains(0) else { throw .invalidAddress(path) }
    guard abstract ? name.count <= capacity - 1 : name.count <= capacity - 1 else {
        throw .invalidAddress("\(path) (\(name.count) bytes; a Unix socket path holds at most \(capacity - 1))")
    }
    var bytes = [UInt8](repeating: 0, count: MemoryLayout<sa_family_t>.size)
    withUnsafeBytes(of: sa_family_t(AF_UNIX)) { bytes.replaceSubrange(0..<$0.count, with: $0) }
    if abstract { bytes.append(0) }
    bytes.append(contentsOf: name)
    if !abstract { bytes.append(0) }
    return bytes
}

/// The file a listener bound (dev, inode), to remove on close only if it is still that file.
package struct UnixSocketFile: Sendable {
    let path: String
    let device: UInt64
    let inode: UInt64

    /// Removes the socket file if it is still the one bound (not a newer server's).
    package func remove() {
        var status = stat()
        guard lstat(path, &status) == 0, UInt64(status.st_dev) == device, UInt64(status.st_ino) == inode else { return }
        unlink(path)
    }
}

/// A new Unix stream socket bound to `path` and listening (non-blocking, close-on-exec). A file
/// path's socket file gets `mode` from the start (bound under a temporary name, `chmod`ed, then
/// linked into place, which fails rather than replace a file that appeared meanwhile). An
/// existing file at `path` is replaced only if it is a socket nobody listens on (a stale one):
/// a live socket or a file of another kind is an error naming it.
package func bindUnixListeningSocket(_ path: String, mode: UInt16?, backlog: Int32)
    throws(EventLoopError) -> (fd: Int32, file: UnixSocketFile?)
{
    let address = try unixSocketAddress(path)
    let fd = socket(AF_UNIX, SocketType.stream | SocketType.nonBlocking | SocketType.closeOnExec, 0)
    guard fd >= 0 else { throw .system(function: "socket(AF_UNIX)", errno: errno) }
    if path.hasPrefix("@") {
        if bindTo(fd, address) != 0 || listen(fd, backlog) != 0 {
            let code = errno
            close(fd)
            throw .system(function: "bind/listen unix socket \(path)", errno: code)
        }
        return (fd, nil)
    }
    do throws(EventLoopError) {
        try removeStaleSocket(path)
        // A temporary name beside it, if it fits sun_path (`unixSocketAddress` fails on it only when
        // it is too long: `path` itself was checked); else bind in place and chmod after.
        let temporary = temporaryName(beside: path)
        if let temporary, let temporaryAddress = try? unixSocketAddress(temporary) {
            unlink(temporary)
            guard bindTo(fd, temporaryAddress) == 0 else { throw .system(function: "bind unix socket \(path)", errno: errno) }
            if let mode, chmod(temporary, mode_t(mode)) != 0 {
                let code = errno
                unlink(temporary)
                throw .system(function: "chmod \(path)", errno: code)
            }
            let linked = link(temporary, path)
            let code = errno
            unlink(temporary)
            guard linked == 0 else {
                throw code == EEXIST ? .unixSocketPathInUse(path: path, reason: "a file appeared there meanwhile")
                    : .system(function: "bind unix socket \(path)", errno: code)
            }
        } else {
            guard bindTo(fd, address) == 0 else { throw .system(function: "bind unix socket \(path)", errno: errno) }
            if let mode { chmod(path, mode_t(mode)) }
        }
        guard listen(fd, backlog) == 0 else {
            let code = errno
            unlink(path)
            throw .system(function: "listen on unix socket \(path)", errno: code)
        }
        var status = stat()
        guard lstat(path, &status) == 0 else { throw .system(function: "stat \(path)", errno: errno) }
        return (fd, UnixSocketFile(path: path, device: UInt64(status.st_dev), inode: UInt64(status.st_ino)))
    } catch {
        close(fd)
        throw error
    }
}

/// Removes `path` if it is a socket that nobody listens on; throws if it is a live socket or
/// not a socket. A missing file is fine.
private func removeStaleSocket(_ path: String) throws(EventLoopError) {
    var status = stat()
    guard lstat(path, &status) == 0 else { return }
    guard status.st_mode & S_IFMT == S_IFSOCK else {
        let kind = status.st_mode & S_IFMT == S_IFDIR ? "a directory" : status.st_mode & S_IFMT == S_IFREG ? "a regular file"
            : "not a socket"
        throw .unixSocketPathInUse(path: path, reason: "\(kind); only a stale socket is replaced")
    }
    let probe = socket(AF_UNIX, SocketType.stream | SocketType.closeOnExec, 0)
    guard probe >= 0 else { throw .system(function: "socket(AF_UNIX)", errno: errno) }
    defer { close(probe) }
    let address = try unixSocketAddress(path)
    if bindTo(probe, address, connecting: true) == 0 {
        throw .unixSocketPathInUse(path: path, reason: "a server is listening on it")
    }
    let code = errno
    guard code == ECONNREFUSED else {
        throw .unixSocketPathInUse(path: path, reason: "connecting to it failed with \(errnoName(code)), so it is left alone")
    }
    unlink(path)  // stale: nobody listens
}

private func temporaryName(beside path: String) -> String? {
    let slash = path.lastIndex(of: "/")
    let directory = slash.map { String(path[...$0]) } ?? ""
    let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
    return "\(directory).\(name).\(getpid()).\(UInt32.random(in: 0...UInt32.max))"
}

/// `bind(2)` (or `connect(2)`) `fd` to the `sockaddr_un` bytes.
private func bindTo(_ fd: Int32, _ address: [UInt8], connecting: Bool = false) -> Int32 {
    address.withUnsafeBytes { bytes in
        let pointer = bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self)
        return connecting ? connect(fd, pointer, socklen_t(bytes.count)) : bind(fd, pointer, socklen_t(bytes.count))
    }
}

/// Starts a non-blocking connect to the Unix socket at `path` (a Unix connect finishes or fails
/// at once, or waits with `EAGAIN`... reported as a failure: the server's backlog is full).
func startUnixConnect(to path: String) throws(EventLoopError) -> Int32 {
    let address = try unixSocketAddress(path)
    let fd = socket(AF_UNIX, SocketType.stream | SocketType.nonBlocking | SocketType.closeOnExec, 0)
    guard fd >= 0 else { throw .system(function: "socket(AF_UNIX)", errno: errno) }
    if bindTo(fd, address, connecting: true) == 0 { return fd }
    let code = errno
    close(fd)
    throw .system(function: "connect unix socket \(path)", errno: code)
}

/// The peer's process, user and group on a Unix socket (`SO_PEERCRED`), or nil for another
/// kind of socket.
func socketPeerCredentials(of fd: Int32) -> (pid: Int32, uid: UInt32, gid: UInt32)? {
    var local = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    let named = withUnsafeMutablePointer(to: &local) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    guard named == 0, Int32(local.ss_family) == AF_UNIX else { return nil }
    var credentials = (Int32(0), UInt32(0), UInt32(0))  // struct ucred: pid, uid, gid
    var size = socklen_t(MemoryLayout.size(ofValue: credentials))
    guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) == 0 else { return nil }
    return credentials
}
