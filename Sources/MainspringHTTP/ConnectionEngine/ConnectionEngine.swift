// The connection engine: HTTP/1.1 in Swift over Mainspring's own `Connection`s — the one engine
// of an `HTTPServer`, for HTTP and HTTPS, on real loops and on simulated loops
// (`MainspringTesting`) alike, so that what passes in a simulation is what serves in
// production. It reads requests, hands each one over whole, writes the answers and keeps the
// deadlines; the routes, handlers, limits, statistics, load shedding and closing above it are
// the server's own (LoopEndpoint.swift, through the seam in ServerEngine.swift).
//
// Accepting (`ConnectionAcceptor`, below). On real loops the listening socket is bound once
// (`SharedListeningSocket`) and every loop's engine accepts from a `Listener` of its own over a
// duplicate of it: a loop stuck in a long callback stops taking connections and the others take
// them, and a connection stays on the loop that accepted it. On simulated loops one listener of
// the simulation's network accepts and makes each connection on the loop the group picks. Over
// HTTPS every accepted socket first goes through the TLS listener's handshake step
// (`AcceptedSocketPreparer`: a step at a time as loop work, within the context's handshake
// timeout), so an engine only ever sees established connections. At the server's
// `maxConnections` an engine's listener stops accepting (on a real loop new clients wait in
// the kernel's listen backlog); those handed over meanwhile (the simulation's listener, which
// serves every loop, or a burst already accepted) are held unread until one closes.
//
// What it refuses, before anything is routed:
// - a request head is checked as its bytes arrive (RequestHeadScan.swift): over `maxHeaderBytes`
//   431 as soon as it passes the limit; a missing or repeated `Host` in HTTP/1.1, framing that
//   could be read two ways, a control character, a bare CR, a folded line 400; a transfer coding
//   other than `chunked` 501;
// - the request line (RequestHead.swift) is split at its first and last spaces (method, target,
//   version): a version other than HTTP/1.x 400, an unknown method 501, a header line without a
//   name and colon 400;
// - a declared body over `maxBodyBytes` is read and dropped, then answered 413 (a client that
//   stops sending it meets the body timeout, unanswered); a chunked one gets 413 once its chunks
//   pass the limit, and 400 when it is malformed: its chunks are read strictly (RFC 9112 §7.1,
//   `ChunkedBodyDecoder`), so that no front end can read the same bytes as another body;
// - an expectation other than `100-continue` 417 (`100-continue` gets its `100 Continue` while
//   none of the body has come; both only for a request with a body, in HTTP/1.1); while load
//   shedding sheds, a head that announces a body 503 with `Retry-After`, its body never read.
// Every refusal is dated, `Content-Type: text/plain; charset=utf-8` and `Connection: close`, with
// a body that says why in a sentence (`EngineConnection.refuse`); then the write side shuts, and
// what the client still sends is read and dropped for up to two seconds, so that it reads the
// answer rather than a reset.
//
// Responses (ConnectionExchange.swift): the handler's header fields as given, with the server's
// `Content-Length` and `Date` (LoopEndpoint.swift) and no `Content-Type` the handler did not
// name. HTTP/1.1 keeps the connection unless the request says `Connection: close`, HTTP/1.0 only
// when it says `keep-alive` (either is echoed); a streamed response is chunked only where a body
// may be and no `Content-Length` frames it (for an HTTP/1.0 client, unframed, it ends with the
// connection).
//
// Pipelining: requests are answered one at a time, in order; the next is taken once the
// previous response has left, which is also when a request counts as finished. The connection
// is read on meanwhile: up to 64 KiB of what follows waits (`maxPipelinedBytes`), and beyond that
// reading pauses until the response has left.
//
// Deadlines (EngineConnection.swift), each kept exactly on the loop's timers: a head that has not
// arrived `headerTimeout` after its first byte, a body `bodyTimeout` after its head and a
// connection idle for `idleTimeout` (before its first request, or between two) close their
// connection; so does a response that has not moved for `idleTimeout` while some of it waits (a
// client that does not read it), counted from the later of the engine's last write and the last
// time output left — the kernel took some (`Connection.tracksOutputMovement()`), or the
// simulated network did — so a large response read slowly but steadily is not cut. A request
// with the server has no deadline of the engine's while nothing of its response waits (a slow
// handler is not cut). A connection keeps one timer for all of these, re-armed lazily: a
// deadline that moves later leaves it as it is, and when it fires early it is set again for what
// is left.
//
// A WebSocket upgrade takes the connection over as it is (its TLS session, and the bytes that
// came after the request) and applies the route's `outputLimit` and `closeTimeout` to it
// (`Connection.adopt(outputLimit:closeTimeout:)`).
@_spi(MainspringHTTP) import MainspringCore

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
    /// A pthread mutex (`Protected`), which ThreadSanitizer sees, not `Mutex` (a futex it does
    /// not): the real loops register and stop from their own threads.
    private let state = Protected(State())
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
        /// Each loop's engine, touched on its loop's thread only (weak: the engine is its loop's).
        var engines: [ObjectIdentifier: LoopBound<WeakReference<ConnectionEngine>>] = [:]
        var waiting: [ObjectIdentifier: [Connection]] = [:]
        var running = 0
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

    /// Connections accepted so far, over every listener (for tests and diagnostics). Any
    /// thread.
    var acceptedCount: Int {
        state.withLock { state in
            state.perLoop.values.reduce(state.shared?.acceptedCount ?? 0) { $0 + $1.acceptedCount }
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
                let target = LoopBound(WeakReference(engine))
                listener = try Self.listen(.adopted(descriptor: copy), on: engine.loop, group: nil, preparer: preparer) {
                    connection in
                    if let engine = target.value.object { engine.accept(connection) } else { connection.abort() }
                }
            } catch {
                SharedListeningSocket.closeDuplicate(copy)  // not adopted: still ours
                throw error
            }
            state.withLock { $0.perLoop[key] = listener }
            return
        }
        let waiting = state.withLock { state -> [Connection] in
            state.engines[key] = LoopBound(WeakReference(engine))
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
            state.engines[key] = LoopBound(WeakReference(nil))
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

    /// `engine`'s loop stops accepting (`false`: the server is at `maxConnections`; new clients
    /// wait in the kernel's listen backlog) or accepts again. Real loops only: the simulation's
    /// one listener keeps handing connections over, and the engine holds them unread. Its
    /// loop's thread.
    func setAccepting(_ accepting: Bool, for engine: ConnectionEngine) {
        let listener = state.withLock { $0.perLoop[ObjectIdentifier(engine.loop)] }
        listener?.setAccepting(accepting)
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
        let entry = state.withLock { state -> LoopBound<WeakReference<ConnectionEngine>>? in
            guard let entry = state.engines[key] else {
                state.waiting[key, default: []].append(connection)
                return nil
            }
            return entry
        }
        guard let entry else { return }
        if let engine = entry.value.object {
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
    /// The connections that speak HTTP/2 (HTTP2ServerConnection.swift).
    private var http2Connections: [ObjectIdentifier: HTTP2ServerConnection] = [:]
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

    var connectionCount: Int { connections.count + http2Connections.count }

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
        if delegate?.acceptedConnection() == false {
            isPausedForLimit = true
            acceptor.setAccepting(false, for: self)
        }
        served.begin()
    }

    func stopAccepting() {
        guard isAccepting else { return }
        isAccepting = false
        acceptor.stopped(self)
        let waiting = held
        held = []
        for connection in waiting { connection.abort() }
        for served in http2Connections.values { served.drain() }
    }

    func resumeAfterLimit() {
        isPausedForLimit = false
        if isAccepting { acceptor.setAccepting(true, for: self) }
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
        let open2 = http2Connections.values
        http2Connections = [:]
        for served in open2 {
            for request in served.detach() { delegate?.finished(request, written: false) }
            served.connection.close()
            delegate?.closedConnection(timedOut: false)
        }
    }

    // MARK: What the connections report

    func received(_ request: any ServerExchange) { delegate?.received(request) }

    func completed(_ request: ConnectionExchange) { delegate?.finished(request, written: true) }

    /// A request handed over by an HTTP/2 connection is over.
    func finished(_ request: HTTP2Exchange, written: Bool) { delegate?.finished(request, written: written) }

    func answeredByGuard(status: Int) { delegate?.answeredByGuard(status: status) }

    func shedsBeforeBody(path: [UInt8]) -> Int? { delegate?.shedsBeforeBody(path: path) }

    /// `served` closed, or was taken over (a WebSocket): it is no longer the engine's. Its
    /// request in flight, if any, finished unwritten.
    func removed(_ served: EngineConnection, lost request: ConnectionExchange?, timedOut: Bool) {
        guard connections.removeValue(forKey: ObjectIdentifier(served)) != nil else { return }
        if let request { delegate?.finished(request, written: false) }
        delegate?.closedConnection(timedOut: timedOut)
    }

    /// `served` speaks HTTP/2 from now on (its client sent the preface, or agreed on `h2` by
    /// ALPN), with `input` what it has read so far: it leaves the HTTP/1.1 reader for an
    /// HTTP/2 connection, and stays one connection of the engine's.
    func switchToHTTP2(_ served: EngineConnection, input: [UInt8]) {
        guard let options = limits.http2, connections.removeValue(forKey: ObjectIdentifier(served)) != nil else { return }
        _ = served.detach()
        let http2 = HTTP2ServerConnection(engine: self, connection: served.connection, options: options)
        http2Connections[ObjectIdentifier(http2)] = http2
        http2.begin(with: input)
        if !isAccepting { http2.drain() }
    }

    /// An HTTP/2 connection closed: its requests still with the server finished unwritten.
    func removed(_ served: HTTP2ServerConnection, lost: [HTTP2Exchange], timedOut: Bool) {
        guard http2Connections.removeValue(forKey: ObjectIdentifier(served)) != nil else { return }
        for request in lost { delegate?.finished(request, written: false) }
        delegate?.closedConnection(timedOut: timedOut)
    }
}
