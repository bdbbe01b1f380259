/// A TCP connect that yields the socket itself, for package modules that run a protocol on it
/// before it becomes a `Connection` (a TLS handshake, `MainspringTLS`).
extension EventLoop {
    /// Connects a new socket to `host:port` (an IPv4 or IPv6 literal, or "localhost") and calls
    /// `done` on this loop's thread with the connected, non-blocking descriptor — now the
    /// caller's — or the error (`.system` with the connect's errno, `.invalidAddress`). The wait
    /// runs at `.input` priority. Loop thread only.
    package func connectSocket(to host: String, port: UInt16, _ done: @escaping (Result<Int32, EventLoopError>) -> Void) {
        preconditionOnLoop("EventLoop.connectSocket(to:port:_:)")
        let started: (fd: Int32, connected: Bool)
        do {
            started = try startConnect(to: host, port: port)
        } catch {
            done(.failure(error))
            return
        }
        if started.connected {
            done(.success(started.fd))
            return
        }
        // One wait for writability; the readiness keeps itself until it fires.
        final class Pending {
            var readiness: DescriptorReadiness?
        }
        let pending = Pending()
        let fd = started.fd
        pending.readiness = DescriptorReadiness(loop: self, fd: fd, priority: .input) {
            pending.readiness?.cancel()
            pending.readiness = nil
            let code = pendingConnectError(fd)
            if code == 0 {
                done(.success(fd))
            } else {
                closeDescriptor(fd)
                done(.failure(.system(function: "connect \(host):\(port)", errno: code)))
            }
        }
        do {
            try pending.readiness?.wait(for: .write)
        } catch {
            pending.readiness?.cancel()
            pending.readiness = nil
            closeDescriptor(fd)
            done(.failure(error))
        }
    }
}
