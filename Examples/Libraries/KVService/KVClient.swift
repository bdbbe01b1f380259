import Foundation
import KVCore
import Mainspring
import Synchronization

/// One connection: RESP in, replies out in request order.
///
/// Lives on the connection's loop. `session` and `slicedJob` belong to the keyspace's loop
/// (loop 0): for a client on loop 0 that is the same thread; for a client on another loop they
/// are only touched by the batches it posts there, one at a time.
final class Client {
    let connection: Connection
    let loop: EventLoop
    /// Whether the connection lives on the keyspace's loop (commands run in place).
    let isLocal: Bool
    let store: Store
    let counters: ServerCounters
    /// When it connected, on the loops' clock (virtual on simulated loops), for `CLIENT LIST`.
    let connectedAt: LoopClock.Instant
    // Not checked for exclusivity at run time: a check per command is measurable, and the
    // client belongs to its loop's thread (no overlapping access can happen).
    @exclusivity(unchecked) var parser: RESPParser
    /// The reply buffer of the batch being executed (one `write` per batch).
    @exclusivity(unchecked) private var output: [UInt8] = []
    /// A slow command's reply, or (on another loop) a batch on loop 0, is in progress: input
    /// waits in the parser, in order.
    private var isBusy = false
    private var inputEnded = false
    /// QUIT, a protocol error or the output limit: nothing more is read or run.
    private var isFinishing = false
    private var softLimitSince: UInt64?

    // The keyspace loop's part.
    var session: KVSession
    var hasSession = false
    var slicedJob: FeedJob?

    private init(connection: Connection, store: Store, counters: ServerCounters, limits: RESPParser.Limits) {
        self.connection = connection
        self.loop = connection.loop
        self.connectedAt = connection.loop.clock.now
        self.isLocal = connection.loop === store.loop
        self.store = store
        self.counters = counters
        self.parser = RESPParser(limits: limits)
        self.session = KVSession(id: 0)
    }

    /// Whether the connection is still open (any thread).
    var isOpen: Bool { connection.isOpen }

    /// A new connection, on its loop: refused over `maxclients`, else served.
    static func accept(_ connection: Connection, store: Store, counters: ServerCounters, registry: ClientRegistry) {
        counters.accepted.add(1, ordering: .relaxed)
        let connected = counters.connected.add(1, ordering: .relaxed).newValue
        if connected > counters.maxClients.load(ordering: .relaxed) {
            counters.connected.subtract(1, ordering: .relaxed)
            counters.rejected.add(1, ordering: .relaxed)
            connection.write("-ERR max number of clients reached\r\n")
            connection.close()
            return
        }
        var limits = RESPParser.Limits()
        limits.maxBulkLength = counters.protoMaxBulkLength.load(ordering: .relaxed)
        let client = Client(connection: connection, store: store, counters: counters, limits: limits)
        if client.isLocal { store.register(client) }
        registry.add(client)
        connection.onClose { _ in
            registry.remove(client)
            client.closed()
        }
        connection.readBytes { input in client.receive(input) }
    }

    private func receive(_ input: Connection.Input) {
        switch input {
        case .bytes(let bytes):
            guard !isFinishing else { return }
            parser.append(contentsOf: bytes)
        case .endOfFile:
            inputEnded = true
            if isFinishing {
                connection.close()
                return
            }
        }
        if !isBusy { process() }
    }

    private func closed() {
        counters.connected.subtract(1, ordering: .relaxed)
        isFinishing = true
        output = []
        if isLocal {
            store.unregister(self)
        } else {
            let me = LoopOwned((store, self))
            store.loop.execute(priority: .input) { me.value.0.unregister(me.value.1) }
        }
    }

    /// Runs what the parser holds: in place on loop 0, or as one batch posted there.
    private func process() {
        if isLocal { processInPlace() } else { postBatch() }
    }

    // MARK: On the keyspace's loop

    /// Parses everything buffered and executes it, replies into one buffer, one write; stops at
    /// a slow command (its reply is fed, and the rest waits for it).
    private func processInPlace() {
        let core = store.core
        parser.limits.maxBulkLength = counters.protoMaxBulkLength.load(ordering: .relaxed)
        let hardLimit = counters.outputHardLimit.load(ordering: .relaxed)
        // The most this batch may add before the client is over its hard limit.
        let room = hardLimit > 0 ? max(0, hardLimit - connection.bufferedOutputBytes) : Int.max
        // The session is used from a local copy for the batch: `INFO` and `CLIENT LIST` read
        // every client's, this one's included, while the command runs.
        var session = self.session
        defer { self.session = session }
        while !isBusy, !isFinishing, let event = parser.next() {
            switch event {
            case .command(let arguments):
                switch core.execute(arguments, session: &session, into: &output) {
                case .replied:
                    if output.count > room {
                        disconnectForOutputLimit()
                        return
                    }
                case .close:
                    isFinishing = true
                case .sliced(let reply):
                    isBusy = true
                    self.session = session
                    flush()
                    store.runSliced(reply, for: self) { [self] in
                        isBusy = false
                        guard !isFinishing else { return }
                        process()
                    }
                }
            case .protocolError(let error):
                error.appendReply(to: &output)
                isFinishing = true
            }
        }
        flush()
        store.afterBatch()
        if isFinishing {
            finishConversation()
        } else if inputEnded && !isBusy {
            connection.close()
        }
    }

    /// After `QUIT` or a protocol error: the replies go out, then the end of output; what the
    /// client still sends is read and dropped until it closes its side (at most two seconds),
    /// so that the kernel does not answer unread input with a reset that would destroy the
    /// replies on their way.
    private func finishConversation() {
        guard connection.isOpen else { return }
        connection.shutdownOutput()
        if inputEnded {
            connection.close()
            return
        }
        let connection = self.connection
        _ = loop.schedule(after: .seconds(2)) { connection.close() }
    }

    /// Writes the batch's replies (and checks the output limits).
    private func flush() {
        guard !output.isEmpty else { return }
        writeLocal(output)
        if output.capacity > 1 << 16 { output = [] } else { output.removeAll(keepingCapacity: true) }
    }

    /// Writes `bytes` to the connection (its loop only) and enforces the output limits: over
    /// the hard limit, or over the soft one for longer than its seconds, closes the client.
    func writeLocal(_ bytes: [UInt8]) {
        guard connection.isOpen, !bytes.isEmpty else { return }
        connection.write(bytes)
        let buffered = connection.bufferedOutputBytes
        let hard = counters.outputHardLimit.load(ordering: .relaxed)
        if hard > 0 && buffered > hard && !isBusy {
            disconnectForOutputLimit()
            return
        }
        let soft = counters.outputSoftLimit.load(ordering: .relaxed)
        guard soft > 0 else { return }
        if buffered <= soft {
            softLimitSince = nil
            return
        }
        let now = loop.clock.now.nanoseconds  // the loop's clock: virtual on a simulated loop
        if let since = softLimitSince {
            let seconds = UInt64(counters.outputSoftSeconds.load(ordering: .relaxed))
            if now - since >= seconds * 1_000_000_000 && !isBusy { disconnectForOutputLimit() }
        } else {
            softLimitSince = now
        }
    }

    /// Redis's `client-output-buffer-limit`: the client is closed, its pending output dropped
    /// (what libevent holds goes out for at most the close timeout), and counted.
    private func disconnectForOutputLimit() {
        counters.outputLimitDisconnections.add(1, ordering: .relaxed)
        isFinishing = true
        output = []
        connection.close()
    }

    // MARK: From another loop

    /// Parses what is buffered into one batch (at most 4,096 commands) and posts it to loop 0;
    /// the replies come back in one post (plus one per slice of a slow command).
    private func postBatch() {
        guard !isBusy, !isFinishing else { return }
        parser.limits.maxBulkLength = counters.protoMaxBulkLength.load(ordering: .relaxed)
        var commands: [[[UInt8]]] = []
        var failure: RESPParser.ProtocolError?
        while commands.count < 4_096, let event = parser.next() {
            if case .command(let arguments) = event {
                commands.append(arguments)
            } else if case .protocolError(let error) = event {
                failure = error
                break
            }
        }
        if commands.isEmpty && failure == nil {
            if inputEnded { connection.close() }
            return
        }
        isBusy = true
        let batch = LoopOwned((store, self, commands, failure))
        store.loop.execute(priority: .input) {
            let (store, client, commands, failure) = batch.value
            store.runBatch(commands, failure: failure, for: client, from: 0)
        }
    }

    /// How a posted batch's replies end.
    enum BatchEnd {
        /// More replies of this batch follow (a slow command's slices).
        case more
        /// The batch is done: run the next one.
        case done
        /// Close once the replies are written (QUIT, a protocol error).
        case close
    }

    /// Replies of a posted batch arrive (on the client's loop).
    func deliver(_ bytes: [UInt8], end: BatchEnd) {
        guard connection.isOpen else { return }
        switch end {
        case .more:
            writeLocal(bytes)
        case .done:
            isBusy = false
            writeLocal(bytes)
            if isFinishing { return }
            if parser.bufferedByteCount > 0 { postBatch() } else if inputEnded { connection.close() }
        case .close:
            isFinishing = true
            writeLocal(bytes)
            finishConversation()
        }
    }
}

extension Store {
    /// Registers a client on loop 0 (for `CLIENT LIST`) and gives it a session.
    func register(_ client: Client) {
        client.session = core.makeSession()
        client.hasSession = true
        clients[client.session.id] = client
    }

    /// A client closed: forget it, and let its slow command's job (paused for output, say) end.
    func unregister(_ client: Client) {
        if client.hasSession { clients[client.session.id] = nil }
        client.slicedJob?.resume()
    }

    /// Executes a batch posted by a client on another loop, from command `index` on; posts the
    /// replies back. A slow command's reply is fed first, then the batch goes on after it.
    func runBatch(_ commands: [[[UInt8]]], failure: RESPParser.ProtocolError?, for client: Client, from index: Int) {
        if !client.hasSession { register(client) }
        guard client.isOpen else {
            unregister(client)
            return
        }
        var output: [UInt8] = []
        var index = index
        var session = client.session  // see `Client.processInPlace`
        defer { client.session = session }
        while index < commands.count {
            let arguments = commands[index]
            index += 1
            switch core.execute(arguments, session: &session, into: &output) {
            case .replied:
                continue
            case .close:
                post(output, to: client, end: .close)
                afterBatch()
                return
            case .sliced(let reply):
                if !output.isEmpty { post(output, to: client, end: .more) }
                client.session = session
                let next = index
                runSliced(reply, for: client) { [unowned self] in
                    self.runBatch(commands, failure: failure, for: client, from: next)
                }
                return
            }
        }
        if let failure {
            failure.appendReply(to: &output)
            post(output, to: client, end: .close)
        } else {
            post(output, to: client, end: .done)
        }
        afterBatch()
    }

    private func post(_ bytes: [UInt8], to client: Client, end: Client.BatchEnd) {
        let reply = LoopOwned((client, bytes))
        client.loop.execute(priority: .input) { reply.value.0.deliver(reply.value.1, end: end) }
    }
}
