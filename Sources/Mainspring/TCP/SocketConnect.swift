/// A TCP connect by name or address that yields the socket itself: what `Connection.connect`
/// runs before its socket becomes a bufferevent, and what package modules use to run a protocol
/// on it first (a TLS handshake, `MainspringTLS`).
extension EventLoop {
    /// Connects a new socket to `host:port` and calls `done` on this loop's thread with the
    /// connected, non-blocking descriptor — now the caller's — or the error. Loop thread only.
    ///
    /// `host` is an IPv4 or IPv6 literal (one attempt; its failure is `.system` with the
    /// connect's errno, as before names) or a name, resolved off the loop within
    /// `options.resolveTimeout` and tried with Happy Eyeballs (RFC 8305, `HappyEyeballs`):
    /// `.hostNotFound`, `.resolveTimedOut`, or `.connectFailed` naming every address tried.
    /// Waits run at `.input` priority.
    package func connectSocket(to host: String, port: UInt16, options: Connection.Options = .init(),
                               _ done: @escaping (Result<Int32, EventLoopError>) -> Void)
    {
        preconditionOnLoop("EventLoop.connectSocket(to:port:_:)")
        if let literal = numericAddress(host, port: port) {
            HappyEyeballs(loop: self, host: host, port: port, addresses: [literal],
                          attemptDelay: options.connectionAttemptDelay, named: false, done).start()
            return
        }
        let attemptDelay = options.connectionAttemptDelay
        resolveAddresses(host, port: port, timeout: options.resolveTimeout) { [self] resolved in
            switch resolved {
            case .failure(let error):
                done(.failure(error))
            case .success(let addresses):
                HappyEyeballs(loop: self, host: host, port: port, addresses: addresses,
                              attemptDelay: attemptDelay, named: true, done).start()
            }
        }
    }
}

/// RFC 8305's connection attempts over a host's addresses, on one loop: the addresses in the
/// resolver's order with the families interleaved (the first address's family first); one
/// attempt at a time, the next started when the last one fails or after `attemptDelay` without
/// an answer, attempts running side by side from then on. The first to connect wins; the others
/// are closed at once. Loop thread only; keeps itself alive until it reports.
final class HappyEyeballs {
    private let loop: EventLoop
    private let host: String
    private let port: UInt16
    private let addresses: [SocketAddress]
    private let attemptDelay: Duration
    /// Whether `host` was a name (errors list the attempts) rather than a literal.
    private let named: Bool
    private var done: ((Result<Int32, EventLoopError>) -> Void)?
    private var next = 0
    private var attempts: [Attempt] = []
    private var failures: [EventLoopError.ConnectAttempt] = []
    private var timer: TimerHandle?
    /// Itself, while attempts run (the readiness callbacks and the timer hold it weakly).
    private var keepAlive: HappyEyeballs?

    private final class Attempt {
        let fd: Int32
        let address: SocketAddress
        var readiness: DescriptorReadiness?
        init(fd: Int32, address: SocketAddress) {
            self.fd = fd
            self.address = address
        }
    }

    init(loop: EventLoop, host: String, port: UInt16, addresses: [SocketAddress], attemptDelay: Duration, named: Bool,
         _ done: @escaping (Result<Int32, EventLoopError>) -> Void)
    {
        self.loop = loop
        self.host = host
        self.port = port
        self.addresses = interleavedByFamily(addresses)
        self.attemptDelay = attemptDelay
        self.named = named
        self.done = done
    }

    func start() {
        keepAlive = self
        startNext()
    }

    /// Starts the next address's attempt (and the delay after it), or reports the failure when
    /// none is left and none runs.
    private func startNext() {
        timer?.cancel()
        timer = nil
        while done != nil && next < addresses.count {
            let address = addresses[next]
            next += 1
            switch startConnect(to: address) {
            case .failed(let code):
                failures.append(.init(address: address.description, errno: code))
                continue  // failed at once (no route for the family, say): the next, now
            case .connected(let fd):
                succeed(fd: fd)
                return
            case .inProgress(let fd):
                let attempt = Attempt(fd: fd, address: address)
                attempt.readiness = DescriptorReadiness(loop: loop, fd: fd, priority: .input) { [weak self, weak attempt] in
                    guard let self, let attempt else { return }
                    self.answered(attempt)
                }
                do throws(EventLoopError) {
                    try attempt.readiness?.wait(for: IOEvents.write)
                } catch {
                    attempt.readiness?.cancel()
                    closeDescriptor(fd)
                    failures.append(.init(address: address.description, errno: error.errnoCode))
                    continue
                }
                attempts.append(attempt)
                if next < addresses.count {
                    timer = loop.schedule(after: attemptDelay) { [weak self] in self?.startNext() }
                }
                return
            }
        }
        if attempts.isEmpty { fail() }
    }

    /// An attempt's socket became writable: connected, or failed.
    private func answered(_ attempt: Attempt) {
        // Once per attempt: its socket is closed below, or handed over.
        guard done != nil, attempts.contains(where: { $0 === attempt }) else { return }
        attempt.readiness?.cancel()
        attempt.readiness = nil
        attempts.removeAll { $0 === attempt }
        let code = pendingConnectError(attempt.fd)
        if code == 0 {
            succeed(fd: attempt.fd)
        } else {
            closeDescriptor(attempt.fd)
            failures.append(.init(address: attempt.address.description, errno: code))
            startNext()  // a refusal starts the next attempt at once
        }
    }

    private func succeed(fd: Int32) {
        timer?.cancel()
        timer = nil
        for other in attempts {
            other.readiness?.cancel()
            closeDescriptor(other.fd)
        }
        attempts = []
        report(.success(fd))
    }

    private func fail() {
        if !named, failures.count == 1 {
            report(.failure(.system(function: "connect \(addresses[0])", errno: failures[0].errno)))
        } else {
            report(.failure(.connectFailed(host: host, port: port, attempts: failures)))
        }
    }

    private func report(_ result: Result<Int32, EventLoopError>) {
        guard let done else { return }
        self.done = nil
        keepAlive = nil
        done(result)
    }
}
