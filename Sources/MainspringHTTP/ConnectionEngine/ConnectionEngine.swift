// The connection engine: HTTP/1.1 in Swift over Mainspring's own `Connection`s — the engine an
// `HTTPServer` runs on simulated loops (`MainspringTesting`), where there are no descriptors for
// evhttp and every connection is the simulation's network's. The routes, handlers, limits,
// statistics, load shedding and closing above it are the server's own (LoopEndpoint.swift);
// what it reads and answers is what evhttp answers — HTTPEngineParityTests sends the same raw
// requests to both and compares:
//
// - a request head is checked as it arrives by the same scan as evhttp's head guard
//   (RequestHeadScan.swift): over `maxHeaderBytes` 431, a missing or repeated `Host` in HTTP/1.1
//   and framing that could be read two ways 400, a transfer coding other than `chunked` 501 —
//   each with the same text, then the connection closes (its write side first, the rest of the
//   client's input read and dropped for up to two seconds, so that the client reads the answer
//   rather than a reset);
// - the request line is split as evhttp splits it (method to the first space, version from the
//   last): an unknown method 501, a version other than HTTP/1.x 400;
// - a declared body over `maxBodyBytes` is read and dropped, then answered 413 (a client that
//   stops sending it meets the body timeout, unanswered); a chunked one gets 413 once its chunks
//   pass the limit, and so does one evhttp cannot read (a size that is not hex, `4;ext`);
//   chunks are read as evhttp reads them (blank lines between them skipped, `4 ;ext` taken);
// - `Expect: 100-continue` gets its `100 Continue` while none of the body has come, any other
//   expectation 417 (both only for a request with a body, in HTTP/1.1);
// - HTTP/1.1 keeps the connection unless the request says `Connection: close`, HTTP/1.0 only
//   when it says `keep-alive`; pipelined requests are read one at a time, each once the
//   previous response has left (reading stops meanwhile, as evhttp's does) — which is also
//   when the request counts as finished;
// - a streamed response is chunked only where a body may be and no `Content-Length` frames it;
// - a head that has not arrived `headerTimeout` after its first byte, a body `bodyTimeout` after
//   its head, a connection idle for `idleTimeout`, a response that has not moved for
//   `idleTimeout` while some of it waits (evhttp's write timeout) are closed exactly then, on
//   the loop's timers.
//
// Differences from evhttp, on purpose or not yet: the connections are not
// accepted in bursts (the simulated listener hands them over one at a time); a WebSocket
// upgrade keeps the connection's options (the route's `outputLimit` and `closeTimeout` are
// evhttp's only). HTTPS over it is real OpenSSL over the simulated bytes (`MainspringTLS`,
// through the listener's handshake). The header fields are evhttp's too: `Date`, the default
// `Content-Type` (`text/html; charset=ISO-8859-1`), `Connection: close` echoed.
@_spi(MainspringHTTP) import MainspringCore
import Synchronization

/// Where a loop's engine takes its connections from: evhttp's listening socket, or the
/// simulation's listener shared by the loops of a server on simulated loops.
enum ServerSocket: Sendable {
    case listening(ListeningSocket)
    case simulated(ConnectionAcceptor)

    /// The server could not be made: let go of what listens. (A listening socket closes when
    /// its last holder releases it; the simulated listener is closed here.) Any thread.
    func abandon() {
        if case .simulated(let acceptor) = self { acceptor.abandon() }
    }
}

/// The listener of an `HTTPServer` on simulated loops, shared by its loops' engines: it accepts
/// on one loop and makes each connection on the loop the group picks (or the one loop), and
/// hands it to that loop's engine — or holds it until the engine exists (the server is being
/// made), or closes it when the engine has stopped accepting. It closes once every engine has
/// stopped. Any thread.
final class ConnectionAcceptor: Sendable {
    private let state = Mutex(State())

    private struct State {
        var listener: Listener?
        var port: UInt16 = 0
        var engines: [ObjectIdentifier: UncheckedEngine] = [:]
        var waiting: [ObjectIdentifier: [Connection]] = [:]
        var running = 0
    }

    /// A loop's engine, touched on its loop's thread only.
    private struct UncheckedEngine: @unchecked Sendable {
        weak var engine: ConnectionEngine?
    }

    /// The bound port (0 on a Unix socket).
    var port: UInt16 { state.withLock { $0.port } }

    /// Listens on `endpoint` on the first of `loops` (over `group`'s loops when given) — on the
    /// simulation's network. On the simulation's thread.
    init(listeningOn endpoint: Listener.Endpoint, loops: [EventLoop], group: EventLoopGroup?,
         preparer: (any AcceptedSocketPreparer)?) throws(HTTPServerError)
    {
        // The listener keeps this alive through its handler until it closes (`stopped`).
        let accept: @Sendable (Connection) -> Void = { [self] connection in accepted(connection) }
        let listener: Listener
        do throws(EventLoopError) {
            // Connections wait for their engine without a limit of their own: the engine has one.
            let options = Connection.Options(idleTimeout: nil)
            if let preparer {
                listener = try Listener(endpoint, on: loops[0], group: group, options: options, preparer: preparer,
                                        accept: accept)
            } else {
                listener = try Listener(endpoint, on: loops[0], group: group, options: options, accept: accept)
            }
        } catch {
            throw HTTPServerError(listening: error)
        }
        state.withLock {
            $0.listener = listener
            $0.port = listener.port
            $0.running = loops.count
        }
    }

    /// `engine` serves its loop from now on: the connections that waited for it are its.
    /// Its loop's thread.
    func register(_ engine: ConnectionEngine) {
        let key = ObjectIdentifier(engine.loop)
        let waiting = state.withLock { state -> [Connection] in
            state.engines[key] = UncheckedEngine(engine: engine)
            return state.waiting.removeValue(forKey: key) ?? []
        }
        for connection in waiting { engine.accept(connection) }
    }

    /// `engine` accepts no more; the listener closes when the last has stopped. Its loop's thread.
    func stopped(_ engine: ConnectionEngine) {
        let listener = state.withLock { state -> Listener? in
            state.engines[ObjectIdentifier(engine.loop)] = UncheckedEngine(engine: nil)
            state.running -= 1
            guard state.running == 0 else { return nil }
            defer { state.listener = nil }
            return state.listener
        }
        listener?.close()
    }

    /// The server could not be made: closes the listener and the connections that waited for
    /// an engine. Any thread (the closing is posted to the listener's loop).
    func abandon() {
        let (listener, waiting) = state.withLock { state -> (Listener?, [Connection]) in
            defer {
                state.listener = nil
                state.waiting = [:]
                state.running = 0
            }
            return (state.listener, state.waiting.values.flatMap { $0 })
        }
        guard let listener else { return }
        let loop = listener.loop
        loop.execute(priority: .input) {
            listener.close()
            for connection in waiting { connection.abort() }
        }
    }

    /// A connection the listener made, on its loop's thread.
    private func accepted(_ connection: Connection) {
        let key = ObjectIdentifier(connection.loop)
        // nil: no engine on that loop yet (it waits); an entry without an engine: it stopped.
        let entry = state.withLock { state -> UncheckedEngine? in
            guard let entry = state.engines[key] else {
                state.waiting[key, default: []].append(connection)
                return nil
            }
            return entry
        }
        guard let entry else { return }
        if let engine = entry.engine {
            engine.accept(connection)
        } else {
            connection.abort()  // that loop's engine has stopped accepting
        }
    }
}

/// One loop's connection engine: its connections, and accepting paused at the server's
/// connection limit (the connections accepted meanwhile wait unread, as in a listen backlog).
/// Loop thread only.
final class ConnectionEngine: ServerEngine {
    let loop: EventLoop
    let limits: ServerLimits
    private(set) weak var delegate: (any ServerEngineDelegate)?
    private let acceptor: ConnectionAcceptor
    private var connections: [ObjectIdentifier: EngineConnection] = [:]
    private var isAccepting = true
    private var isPausedForLimit = false
    private var held: [Connection] = []

    init(loop: EventLoop, limits: ServerLimits, acceptor: ConnectionAcceptor, delegate: any ServerEngineDelegate) {
        self.loop = loop
        self.limits = limits
        self.acceptor = acceptor
        self.delegate = delegate
        acceptor.register(self)
    }

    /// Every deadline is a timer of its connection's.
    var needsSweep: Bool { false }
    func sweep(now: UInt64) -> Bool { false }

    var connectionCount: Int { connections.count }

    func accept(_ connection: Connection) {
        guard isAccepting else {
            connection.abort()
            return
        }
        if isPausedForLimit {
            held.append(connection)
        } else {
            start(connection)
        }
    }

    private func start(_ connection: Connection) {
        let served = EngineConnection(engine: self, connection: connection)
        connections[ObjectIdentifier(served)] = served
        if delegate?.acceptedConnection() == false { isPausedForLimit = true }
        served.begin()
    }

    func stopAccepting() {
        guard isAccepting else { return }
        isAccepting = false
        acceptor.stopped(self)
        let waiting = held
        held = []
        for connection in waiting { connection.abort() }
    }

    func resumeAfterLimit() {
        isPausedForLimit = false
        while !isPausedForLimit, !held.isEmpty { start(held.removeFirst()) }
    }

    func free() {
        stopAccepting()
        let open = connections.values
        connections = [:]
        for served in open {
            if let request = served.detach() {
                request.markDead()
                delegate?.finished(request, written: false)
            }
            served.connection.close()
            delegate?.closedConnection(timedOut: false)
        }
    }

    // MARK: What the connections report

    func received(_ request: ConnectionExchange) { delegate?.received(request) }

    func completed(_ request: ConnectionExchange) { delegate?.finished(request, written: true) }

    func answeredByGuard(status: Int) { delegate?.answeredByGuard(status: status) }

    func shedsBeforeBody(path: [UInt8]) -> Int? { delegate?.shedsBeforeBody(path: path) }

    /// `served` closed, or was taken over (a WebSocket): it is no longer the engine's. Its
    /// request in flight, if any, finished unwritten.
    func removed(_ served: EngineConnection, lost request: ConnectionExchange?, timedOut: Bool) {
        guard connections.removeValue(forKey: ObjectIdentifier(served)) != nil else { return }
        if let request { delegate?.finished(request, written: false) }
        delegate?.closedConnection(timedOut: timedOut)
    }
}
