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

/// The listener of an `HTTPServer`, shared by its loops' engines. Two ways of listening, one
/// contract (each engine registers on its loop, is handed connections on its loop, and stops):
/// - on real loops, one socket bound once (`SharedListeningSocket`) and a `Listener` per loop over a
///   duplicate of it, made when that loop's engine registers: every loop accepts for itself, so
///   a loop stuck in a long callback stops taking connections and the others take them, and a
///   connection never changes thread;
/// - on simulated loops, where there are no descriptors, one `Listener` of the simulation's
///   network on the first loop that makes each connection on the loop the group picks (or the
///   one loop) — held until that loop's engine exists (the server is being made), or closed
///   when the engine has stopped accepting.
///
/// It closes once every engine has stopped. Any thread.
final class ConnectionAcceptor: Sendable {
    private let state = Mutex(State())
    private let preparer: (any AcceptedSocketPreparer)?

    private struct State {
        /// The socket every real loop's listener duplicates; let go (closed, once the loops'
        /// duplicates are) when the last engine stops.
        var socket: SharedListeningSocket?
        /// The simulation's one listener (nil on real loops, and once closed).
        var shared: Listener?
        /// Each real loop's own listener, by loop.
        var perLoop: [ObjectIdentifier: Listener] = [:]
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

    /// What every accepted connection starts with: no limit of its own while it waits for its
    /// engine (the engine has its deadlines).
    private static let options = Connection.Options(idleTimeout: nil)

    /// Accepts from `socket` (bound already) on each of `loops`: a loop's listener is made
    /// when its engine registers. Any thread.
    init(socket: SharedListeningSocket, loops: Int, preparer: (any AcceptedSocketPreparer)?) {
        self.preparer = preparer
        state.withLock {
            $0.socket = socket
            $0.port = socket.port
            $0.running = loops
        }
    }

    /// Listens on `endpoint` on the first of `loops` (over `group`'s loops when given) — on the
    /// simulation's network. On the simulation's thread.
    init(listeningOn endpoint: Listener.Endpoint, loops: [EventLoop], group: EventLoopGroup?,
         preparer: (any AcceptedSocketPreparer)?) throws(HTTPServerError)
    {
        self.preparer = preparer
        let listener = try Self.listen(endpoint, on: loops[0], group: group, preparer: preparer) {
            [self] connection in accepted(connection)
        }
        state.withLock {
            $0.shared = listener
            $0.port = listener.port
            $0.running = loops.count
        }
    }

    /// A listener that hands its connections to `accept`. The listener keeps `accept` (and so
    /// this acceptor) alive until it closes. `loop`'s thread.
    private static func listen(_ endpoint: Listener.Endpoint, on loop: EventLoop, group: EventLoopGroup?,
                               preparer: (any AcceptedSocketPreparer)?,
                               accept: @escaping @Sendable (Connection) -> Void) throws(HTTPServerError) -> Listener
    {
        do throws(EventLoopError) {
            if let preparer {
                return try Listener(endpoint, on: loop, group: group, options: options, preparer: preparer, accept: accept)
            }
            return try Listener(endpoint, on: loop, group: group, options: options, accept: accept)
        } catch {
            throw HTTPServerError(listening: error)
        }
    }

    /// `engine` serves its loop from now on: on a real loop its listener starts accepting; on a
    /// simulated one the connections that waited for it are its. Its loop's thread.
    func register(_ engine: ConnectionEngine) throws(HTTPServerError) {
        let key = ObjectIdentifier(engine.loop)
        if let socket = state.withLock({ $0.socket }) {
            let copy: Int32
            do throws(EventLoopError) { copy = try socket.duplicate() } catch { throw HTTPServerError(listening: error) }
            let listener: Listener
            do {
                let target = UncheckedEngine(engine: engine)
                listener = try Self.listen(.adopted(descriptor: copy), on: engine.loop, group: nil, preparer: preparer) {
                    connection in
                    if let engine = target.engine { engine.accept(connection) } else { connection.abort() }
                }
            } catch {
                SharedListeningSocket.closeDuplicate(copy)  // not adopted: still ours
                throw error
            }
            state.withLock { $0.perLoop[key] = listener }
            return
        }
        let waiting = state.withLock { state -> [Connection] in
            state.engines[key] = UncheckedEngine(engine: engine)
            return state.waiting.removeValue(forKey: key) ?? []
        }
        for connection in waiting { engine.accept(connection) }
    }

    /// `engine` accepts no more: its loop's listener closes (on real loops), or the shared one
    /// once the last engine has stopped. Its loop's thread.
    func stopped(_ engine: ConnectionEngine) {
        let key = ObjectIdentifier(engine.loop)
        let listeners = state.withLock { state -> [Listener] in
            var closing: [Listener] = []
            if let own = state.perLoop.removeValue(forKey: key) { closing.append(own) }
            state.engines[key] = UncheckedEngine(engine: nil)
            state.running -= 1
            if state.running == 0 {
                state.socket = nil
                if let shared = state.shared { closing.append(shared) }
                state.shared = nil
            }
            return closing
        }
        for listener in listeners { listener.close() }
    }

    /// The server could not be made: closes the listeners and the connections that waited for
    /// an engine. Any thread (each closing is posted to its listener's loop).
    func abandon() {
        let (shared, own, waiting) = state.withLock { state -> (Listener?, [Listener], [Connection]) in
            defer {
                state.socket = nil
                state.shared = nil
                state.perLoop = [:]
                state.waiting = [:]
                state.running = 0
            }
            return (state.shared, Array(state.perLoop.values), state.waiting.values.flatMap { $0 })
        }
        for listener in own { listener.loop.execute(priority: .input) { listener.close() } }
        guard let shared else { return }
        shared.loop.execute(priority: .input) {
            shared.close()
            for connection in waiting { connection.abort() }
        }
    }

    /// A connection the simulation's listener made, on its loop's thread.
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

    /// Starts accepting from `acceptor` on `loop`. `loop`'s thread.
    /// - Throws: `HTTPServerError` when the loop's listener cannot be made.
    init(loop: EventLoop, limits: ServerLimits, acceptor: ConnectionAcceptor, delegate: any ServerEngineDelegate)
        throws(HTTPServerError)
    {
        self.loop = loop
        self.limits = limits
        self.acceptor = acceptor
        self.delegate = delegate
        try acceptor.register(self)
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
        connection.tracksOutputMovement()  // a response's stall deadline counts from it
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
