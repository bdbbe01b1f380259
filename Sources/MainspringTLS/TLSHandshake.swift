@_spi(Simulation) import MainspringCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Runs one TLS handshake on a loop, a step each time the socket is ready — as `.normal` work
/// of the loop, never inside libevent's callbacks.
///
/// ## Where handshakes run
/// A handshake is CPU work: signing with an RSA-2048 key is about a millisecond, and a storm of
/// new clients is a storm of them. Each step runs as one `.normal` callback of the connection's
/// loop, so the loop's policy applies to it: accepting and established connections are `.input`
/// and go first (their replies are written before the pass turns to handshake steps);
/// handshakes take what is left of each pass; and the loop polls again at least every
/// `pollInterval` — a request on an established connection waits for at most one poll interval
/// plus the one handshake step in progress, however many clients are handshaking.
/// (libevent's OpenSSL bufferevents would run the handshake inside their read callback, in the
/// poll, as many as are ready at once.) Once established, the session moves to a libevent
/// OpenSSL bufferevent, whose record encryption is cheap.
final class TLSHandshake {
    enum Outcome {
        case established(TLSLayer, bufferevent: OpaquePointer)
        case failed(String)
    }

    private let loop: EventLoop
    private let session: SSLSession
    private let timeout: Duration
    private var readiness: DescriptorReadiness?
    private var timer: TimerHandle?
    private var completion: ((Outcome) -> Void)?
    /// The handshake keeps itself alive while it runs (the loop holds only its callbacks).
    private var running: TLSHandshake?

    init(loop: EventLoop, session: SSLSession, timeout: Duration, completion: @escaping (Outcome) -> Void) {
        self.loop = loop
        self.session = session
        self.timeout = timeout
        self.completion = completion
    }

    /// Starts: waits for the peer's first flight (a server) or for room to send its own (a
    /// client), so that even the first step runs as `.normal` work. Loop thread.
    func start() {
        running = self
        timer = loop.schedule(after: timeout) { [weak self] in
            guard let self else { return }
            self.end(.failed("the handshake did not finish within \(self.timeout)"))
        }
        readiness = DescriptorReadiness(loop: loop, fd: session.fd, priority: .normal) { [weak self] in self?.step() }
        wait(for: session.isServer ? .read : .write)
    }

    private func step() {
        switch session.step() {
        case .done:
            let summary = session.summary()
            guard let made = session.makeBufferevent(on: loop) else {
                end(.failed("libevent could not take the session over"))
                return
            }
            end(.established(TLSLayer(bufferevent: made.bufferevent, ssl: made.ssl, session: summary),
                             bufferevent: made.bufferevent), closesSocket: false)
        case .wantRead:
            wait(for: .read)
        case .wantWrite:
            wait(for: .write)
        case .failed(let reason):
            end(.failed(reason))
        }
    }

    private func wait(for events: IOEvents) {
        do {
            try readiness?.wait(for: events)
        } catch {
            end(.failed("the loop cannot watch the socket: \(error)"))
        }
    }

    /// Reports `outcome` once; a failed handshake's socket is closed.
    private func end(_ outcome: Outcome, closesSocket: Bool = true) {
        guard let completion else { return }
        self.completion = nil
        timer?.cancel()
        timer = nil
        readiness?.cancel()
        readiness = nil
        // The outcome is reported (and a failure counted) before the socket closes, so that a
        // peer that sees the close can rely on the statistics.
        completion(outcome)
        if case .failed = outcome, closesSocket {
            // What the peer sent and nobody read would make the close a reset, which can
            // overtake the alert that says why: read it away first, so the peer gets the alert.
            discardPendingInput(session.fd)
            shutdown(session.fd, Int32(SHUT_WR))
            close(session.fd)
        }
        running = nil
    }
}

/// A listener's step between accepting a socket and handing over its connection: the
/// server-side handshake, with the server context's certificates of the moment.
struct TLSAcceptPreparer: AcceptedSocketPreparer {
    let context: TLSServerContext

    func prepare(_ endpoint: StreamEndpoint, peer: String, on loop: EventLoop, options: Connection.Options,
                 done: @escaping (Connection?) -> Void)
    {
        switch endpoint {
        case .descriptor(let fd): prepare(fd: fd, peer: peer, on: loop, options: options, done: done)
        case .simulated(let end): prepare(simulated: end, peer: peer, on: loop, options: options, done: done)
        }
    }

    /// The handshake over a socket: OpenSSL's bufferevent on the descriptor.
    private func prepare(fd: Int32, peer: String, on loop: EventLoop, options: Connection.Options,
                         done: @escaping (Connection?) -> Void)
    {
        let contexts = context.contexts
        guard let session = SSLSession(server: contexts, fd: fd) else {
            close(fd)
            context.counters.record(failure: "OpenSSL could not make a session")
            done(nil)
            return
        }
        let counters = context.counters
        let handshake = TLSHandshake(loop: loop, session: session, timeout: contexts.configuration.handshakeTimeout) { outcome in
            done(counters.record(establishedConnection(for: outcome, peer: peer, on: loop, options: options)))
        }
        handshake.start()
    }

    /// The handshake over a simulated stream: OpenSSL's filter over the simulated socket (see
    /// SimulatedTLS.swift).
    private func prepare(simulated end: any SimulatedStreamEnd, peer: String, on loop: EventLoop,
                         options: Connection.Options, done: @escaping (Connection?) -> Void)
    {
        let contexts = context.contexts
        let counters = context.counters
        let layerSocket: SimulatedLayerSocket
        do throws(EventLoopError) {
            layerSocket = try SimulatedLayerSocket(on: loop, end: end)
        } catch {
            counters.record(failure: "\(error)")
            return done(nil)
        }
        guard let session = SSLSession(server: contexts, fd: -1) else {
            layerSocket.discard()
            counters.record(failure: "OpenSSL could not make a session")
            return done(nil)
        }
        SimulatedTLSHandshake(loop: loop, session: session, layerSocket: layerSocket,
                              timeout: contexts.configuration.handshakeTimeout) { outcome in
            let made = counters.record(establishedConnection(for: outcome, peer: peer, on: loop, options: options,
                                                             simulatedLayer: layerSocket))
            // The listener (and its accept handler) hears as a dispatch of the loop, not inside
            // the network's delivery.
            loop.executeNextTurn(priority: .input) { done(made) }
        }.start()
    }
}

/// The connection a handshake's `outcome` makes — the established layer's bufferevent adopted
/// on `loop` (over `simulatedLayer` on a simulated loop) — or why there is none
/// (`.handshakeFailed` with the handshake's reason). On `loop`'s thread.
func establishedConnection(for outcome: TLSHandshake.Outcome, peer: String, on loop: EventLoop, options: Connection.Options,
                           simulatedLayer: SimulatedLayerSocket? = nil) -> Result<Connection, TLSError>
{
    switch outcome {
    case .established(let layer, let bufferevent):
        do throws(EventLoopError) {
            return .success(try Connection.adopting(bufferevent: bufferevent, peer: peer, on: loop, options: options,
                                                    transport: layer, simulatedLayer: simulatedLayer))
        } catch {
            // Only a wrong thread can fail here, and this runs on `loop`: should it happen, the
            // session is lost with its connection — a handshake that did not end in one.
            simulatedLayer?.closing()
            freeBufferevent(bufferevent)
            return .failure(.handshakeFailed(reason: "\(error)"))
        }
    case .failed(let reason):
        return .failure(.handshakeFailed(reason: reason))
    }
}

/// A server context's handshake counters.
final class HandshakeCounters: Sendable {
    private let state = Protected(TLSServerContext.Statistics(completedHandshakes: 0, failedHandshakes: 0, lastFailure: nil))

    func record(established: Bool) { state.withLock { $0.completedHandshakes += 1 } }

    /// Counts a listener's handshake by what it made: the connection, or nil (counted with the
    /// handshake's reason).
    func record(_ made: Result<Connection, TLSError>) -> Connection? {
        switch made {
        case .success(let connection):
            record(established: true)
            return connection
        case .failure(.handshakeFailed(let reason)):
            record(failure: reason)
        case .failure(let error):
            record(failure: "\(error)")
        }
        return nil
    }

    func record(failure reason: String) {
        state.withLock {
            $0.failedHandshakes += 1
            $0.lastFailure = reason
        }
    }

    var snapshot: TLSServerContext.Statistics { state.withLock { $0 } }
}

extension TLSServerContext {
    /// Handshakes finished and failed on the listeners that use this context.
    public struct Statistics: Sendable, Equatable {
        public var completedHandshakes: Int
        /// Handshakes that failed: refused certificates, plaintext or garbage sent to the TLS
        /// port, clients that stopped mid-handshake (timed out).
        public var failedHandshakes: Int
        /// Why the last failed handshake failed.
        public var lastFailure: String?
    }

    /// Counts so far. Any thread.
    public var statistics: Statistics { counters.snapshot }
}

/// Closes a socket the handshake never took.
func closeSocket(_ fd: Int32) { close(fd) }

/// Reads and drops what a non-blocking socket has received so far.
private func discardPendingInput(_ fd: Int32) {
    var scratch = [UInt8](repeating: 0, count: 16_384)
    for _ in 0..<16 {
        let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if n <= 0 { return }
    }
}
