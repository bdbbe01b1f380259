import Foundation
import Mainspring
import MainspringTestSupport
@testable import MainspringCore
@testable import MainspringHTTP
import MainspringTLS
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A TCP server on 127.0.0.1 that runs `script` for each connection it accepts, each on a
/// thread of its own: for the answers no real server gives (malformed, endless, stalled).
final class ScriptedServer: @unchecked Sendable {
    let port: UInt16
    /// The listening socket while it is open (nil once closed). Whoever closes it does so
    /// under this lock, and `stop()` shuts it down only while it is open: a number closed
    /// twice, or accepted on after its close, may by then be another test's descriptor.
    private let listening: Locked<Int32?>
    private let accepting: Bool
    let accepted = Locked(0)

    init(backlog: Int32 = 64, accepting: Bool = true, _ script: @escaping @Sendable (_ fd: Int32, _ index: Int) -> Void) throws {
        let (fd, boundPort) = try bindLoopbackTCPSocket()
        guard listen(fd, backlog) == 0 else {
            let code = errno
            close(fd)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EADDRINUSE)
        }
        listening = Locked(fd)
        self.accepting = accepting
        port = boundPort
        guard accepting else { return }
        let accepted = self.accepted
        let listening = self.listening
        // The accept thread owns the socket's close: `stop()` only shuts it down, which makes
        // accept(2) fail, and the thread closes it as it leaves. Closed by `stop()` instead,
        // the thread's next accept(2) could take a connection meant for another listener.
        let thread = Thread {
            while true {
                let client = accept(fd, nil, nil)
                if client < 0 {
                    if errno == EINTR { continue }
                    listening.withLock { open in
                        if open != nil { close(fd) }
                        open = nil
                    }
                    return
                }
                let index = accepted.withLock { count -> Int in
                    count += 1
                    return count
                }
                let worker = Thread {
                    script(client, index)
                    close(client)
                }
                worker.start()
            }
        }
        thread.start()
    }

    /// Stops accepting: the accept thread ends and closes the socket (a server made with
    /// `accepting: false` closes it here). Idempotent.
    func stop() {
        let accepting = accepting
        listening.withLock { open in
            guard let fd = open else { return }
            if accepting {
                shutdown(fd, Int32(SHUT_RDWR))
            } else {
                close(fd)
                open = nil
            }
        }
    }

    deinit { stop() }
}

/// Reads a request's head (to the blank line) from `fd`; nil when the client closed first.
func readRequestHead(_ fd: Int32) -> String? {
    var head: [UInt8] = []
    var byte: UInt8 = 0
    while !(head.count >= 4 && head.suffix(4) == [13, 10, 13, 10]) {
        guard recv(fd, &byte, 1, 0) == 1 else { return nil }
        head.append(byte)
    }
    return String(decoding: head, as: UTF8.self)
}

/// Writes all of `text` (false when the peer has gone).
@discardableResult
func writeAll(_ fd: Int32, _ text: String) -> Bool {
    var bytes = Array(text.utf8)
    var sent = 0
    while sent < bytes.count {
        let n = bytes[sent...].withUnsafeMutableBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if n <= 0 { return false }
        sent += n
    }
    _ = bytes
    return true
}

/// Fills the accept queue of a server that does not accept (`accepting: false`, backlog 0) with
/// four non-blocking connects, so that the kernel drops the next SYNs: a connect to it is never
/// answered. Returns the fillers' descriptors, to close.
func fillQueue(of server: ScriptedServer) -> [Int32] {
    (0..<4).map { _ in
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        address.sin_port = server.port.bigEndian
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return fd
    }
}

/// A server that reads each request's head, signals `arrived`, and never answers: it waits for
/// the client to close.
func stallingServer(signalling arrived: DispatchSemaphore) throws -> ScriptedServer {
    try ScriptedServer { fd, _ in
        _ = readRequestHead(fd)
        arrived.signal()
        var byte: UInt8 = 0
        _ = recv(fd, &byte, 1, 0)  // until the client closes
    }
}

/// The error `body` throws (nil if none).
func clientError(_ body: () async throws -> Void) async -> HTTPClientError? {
    do {
        try await body()
        return nil
    } catch let error as HTTPClientError {
        return error
    } catch {
        Issue.record("not an HTTPClientError: \(error)")
        return nil
    }
}
