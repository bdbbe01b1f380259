// The listening side of an HTTP server: one TCP (or Unix stream) socket bound once, shared by every loop of the
// server. Each loop's evhttp accepts from a duplicate of it (see `EvhttpServer.accept(on:)`).
// CLibevent as well as Glibc for the socket constants: see NoDelay.swift.
internal import CLibevent
#if canImport(Glibc)
import Glibc
#endif
import MainspringCore

/// A listening socket (TCP, or Unix stream) shared by every loop of a server: each loop's evhttp
/// accepts from its own duplicate of it, so a loop that is stuck in a long callback simply stops
/// taking new connections and the others take them. This object goes once every loop has its
/// duplicate; the duplicates listen on.
final class ListeningSocket: @unchecked Sendable {
    let fd: Int32
    let port: UInt16
    /// A Unix socket's file (nil for TCP and abstract names). Not removed here: this object
    /// goes right after the server starts, while the loops' duplicates still listen; the server
    /// removes the file when it closes (`ServerShared.removeSocketFile`).
    let unixFile: UnixSocketFile?

    /// A Unix domain stream socket at `path` (a file with `mode`, or "@name"), listening — bound
    /// by the core's `bindUnixListeningSocket`, with its rules: a stale socket file is replaced,
    /// a live socket or another kind of file is an error.
    init(unixPath path: String, mode: UInt16?, backlog: Int32) throws(HTTPServerError) {
        do throws(EventLoopError) {
            let (fd, file) = try bindUnixListeningSocket(path, mode: mode, backlog: backlog)
            self.fd = fd
            self.port = 0
            self.unixFile = file
        } catch {
            throw HTTPServerError(listening: error)
        }
    }

    init(host: String, port: UInt16, backlog: Int32) throws(HTTPServerError) {
        var hints = addrinfo()
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let info = list else {
            throw .invalidAddress("\(host): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(list) }
        let fd = socket(info.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system(function: "socket", errno: errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        if bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) != 0 {
            let code = errno
            close(fd)
            throw .system(function: "bind \(host):\(port)", errno: code)
        }
        if listen(fd, backlog) != 0 {
            let code = errno
            close(fd)
            throw .system(function: "listen", errno: code)
        }
        var bound = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &bound) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        var boundPort: UInt16 = 0
        if Int32(bound.ss_family) == AF_INET {
            boundPort = withUnsafePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) } }
        } else {
            boundPort = withUnsafePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) } }
        }
        self.fd = fd
        self.port = boundPort
        self.unixFile = nil
    }

    /// A close-on-exec duplicate of the socket, for one loop's evhttp (which closes it).
    func duplicate() throws(HTTPServerError) -> Int32 {
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw .system(function: "dup", errno: errno) }
        return copy
    }

    deinit { close(fd) }
}
