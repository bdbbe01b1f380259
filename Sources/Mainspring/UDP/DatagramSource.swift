#if canImport(Glibc)
import Glibc
#endif

/// The loop side of a `DatagramSocket`: the descriptor, its read and write events, the
/// receive buffers and the bounded send queue. Loop thread only.
///
/// On a simulated loop there is no descriptor (`fd` is -1): a port of the simulation's network
/// (`simulatedPort`) takes what is sent, and what arrives waits in `inbox` — the kernel's
/// receive buffer — until the consumer takes it.
final class DatagramSource: Source {
    /// A waiting `send(_:)`: the loop's wait (`.cancelled`, `.loopClosed`) around the send's own
    /// outcome.
    typealias SendWait = ResumeOnce<Result<Result<Void, DatagramError>, EventLoopError>, Never>

    let fd: Int32
    let family: SocketAddress.Family
    let options: DatagramSocket.Options
    var peer: SocketAddress?
    var statistics = DatagramSocket.Statistics()
    var onClosed: (() -> Void)?
    private(set) var queue: [Datagram] = []
    private var queueStart = 0
    private var handler: ((DatagramEvent) -> Void)?
    private var receiveBuffers: DatagramReceiveBuffers?
    private var isReadingPaused = false
    private var writeEvent: NativeEvent?
    private var isWriteArmed = false
    /// `send(_:)` calls waiting for room in the queue, in order. One whose task was cancelled has been
    /// resumed already: its datagram is skipped, never sent.
    private var waitingSenders: [(Datagram, SendWait)] = []
    /// The simulated network's port (a simulated loop only).
    var simulatedPort: (any SimulatedDatagramPort)?
    /// What the simulated network delivered and the consumer has not taken, from `inboxStart`.
    private var inbox: [DatagramEvent] = []
    private var inboxStart = 0
    private var inboxBytes = 0

    init(loop: EventLoop, fd: Int32, family: SocketAddress.Family, options: DatagramSocket.Options) throws(EventLoopError) {
        self.fd = fd
        self.family = family
        self.options = options
        super.init(loop: loop, priority: options.priority)
        do {
            writeEvent = try NativeEvent(base: loop.base, fd: fd, readiness: .write, persistent: true, target: self)
        } catch {
            close()
            throw error
        }
    }

    /// A socket of the simulated network on `loop` (bound by the caller: `simulatedPort`).
    init(simulatedOn loop: EventLoop, family: SocketAddress.Family, options: DatagramSocket.Options) {
        fd = -1
        self.family = family
        self.options = options
        super.init(loop: loop, priority: options.priority)
    }

    override var keepsFiring: Bool { true }

    var pendingCount: Int { queue.count - queueStart }

    /// The last `DatagramSocket` handle is gone: with no consumer (a handler or a sequence) the
    /// socket can do nothing any more, so it closes, as `close()` closes it. With one, it lives
    /// on: the consumer's end (or the loop's) closes it.
    func handleReleased() {
        guard !isClosed, handler == nil else { return }
        close()
    }

    func startReading(_ handler: @escaping (DatagramEvent) -> Void) throws(EventLoopError) {
        requireUsage(self.handler == nil, "Mainspring: DatagramSocket: the socket already has a consumer (onReceive or datagrams)")
        if simulatedPort != nil {
            self.handler = handler
            if inboxStart < inbox.count { fire(.read) }
            return
        }
        try addNativeEvent(fd: fd, readiness: .read, persistent: true)
        self.handler = handler
        receiveBuffers = DatagramReceiveBuffers(size: options.maximumDatagramSize, batch: options.receiveBatchSize)
    }

    func pauseReading() {
        guard !isReadingPaused else { return }
        isReadingPaused = true
        native?.delete()
    }

    func resumeReading() {
        guard isReadingPaused, !isClosed else { return }
        isReadingPaused = false
        if simulatedPort != nil {
            if inboxStart < inbox.count { fire(.read) }
            return
        }
        resumeNative()
    }

    override func resumeNative() {
        guard !isReadingPaused else { return }
        super.resumeNative()
    }

    override func perform(_ readiness: Readiness) {
        if readiness.contains(.write) { flushQueue() }
        if readiness.contains(.read) { receive() }
    }

    /// Up to `maximumDatagramsPerWakeup` datagrams, in batches; the rest wait for the next
    /// poll (the event is level-triggered).
    private func receive() {
        if simulatedPort != nil { return receiveSimulated() }
        guard let buffers = receiveBuffers else { return }
        var handled = 0
        let limit = max(1, options.maximumDatagramsPerWakeup)
        while handled < limit, !isClosed, !isReadingPaused {
            let wanted = min(buffers.batch, limit - handled)
            switch buffers.receive(fd, limit: wanted) {
            case .done(let count):
                statistics.receiveBatches += 1
                statistics.datagramsReceived += count
                for index in 0..<count {
                    let (bytes, isTruncated, length, sender) = buffers.datagram(at: index)
                    if isTruncated { statistics.datagramsTruncated += 1 }
                    handler?(.datagram(Datagram(received: bytes, from: sender, isTruncated: isTruncated, length: length)))
                    if isClosed { return }
                }
                handled += count
                if count < wanted { return }
            case .wouldBlock:
                return
            case .failed(let code):
                handler?(.error(errno: code))
                handled += 1
            }
        }
    }

    // MARK: The simulated network

    /// A datagram (or a port-unreachable) the simulated network delivered: into the inbox — or
    /// dropped, as the kernel drops, when it is from another peer than the connected one, or the
    /// inbox holds ``DatagramSocket/Options/receiveBufferSize`` bytes (default 212,992, Linux's
    /// `rmem_default`) or 4,096 events (empty datagrams take room in a kernel's buffer too) —
    /// and the consumer is told.
    func simulatedArrival(_ arrival: SimulatedDatagramArrival) {
        guard !isClosed, inbox.count - inboxStart < 4_096 else { return }
        switch arrival {
        case .datagram(let bytes, let sender):
            if let peer, sender != peer { return }
            guard inboxBytes + bytes.count <= options.receiveBufferSize ?? 212_992 else { return }
            let size = max(0, options.maximumDatagramSize)
            let datagram = bytes.count > size
                ? Datagram(received: Array(bytes.prefix(size)), from: sender, isTruncated: true, length: bytes.count)
                : Datagram(received: bytes, from: sender, isTruncated: false, length: bytes.count)
            inbox.append(.datagram(datagram))
            inboxBytes += bytes.count
        case .unreachable(let address):
            // Linux reports a port-unreachable only to a socket connected to that address.
            guard address == peer else { return }
            inbox.append(.error(errno: ECONNREFUSED))
        }
        if handler != nil, !isReadingPaused { fire(.read) }
    }

    /// Up to `maximumDatagramsPerWakeup` events from the inbox (one batch); the rest on the
    /// loop's next turn.
    private func receiveSimulated() {
        let limit = max(1, options.maximumDatagramsPerWakeup)
        var handled = 0
        if inboxStart < inbox.count { statistics.receiveBatches += 1 }
        while handled < limit, inboxStart < inbox.count, !isClosed, !isReadingPaused {
            let event = inbox[inboxStart]
            inboxStart += 1
            handled += 1
            if case .datagram(let datagram) = event {
                inboxBytes -= datagram.length
                statistics.datagramsReceived += 1
                if datagram.isTruncated { statistics.datagramsTruncated += 1 }
            }
            handler?(event)
        }
        if inboxStart == inbox.count {
            inbox.removeAll(keepingCapacity: inbox.capacity <= 1_024)
            inboxStart = 0
        } else if inboxStart > 256, inboxStart * 2 > inbox.count {
            // A steady flow that never lets the inbox empty: drop what was taken, so the array
            // stays as bounded as the bytes it holds.
            inbox.removeFirst(inboxStart)
            inboxStart = 0
        }
        if inboxStart < inbox.count, !isClosed, !isReadingPaused {
            fire(.read)  // the rest next turn, as a level-triggered descriptor would
        }
    }

    func trySend(_ datagram: Datagram) throws(DatagramError) -> DatagramSocket.SendOutcome {
        try check(datagram)
        if pendingCount > 0 {
            guard pendingCount < max(1, options.sendQueueLimit) else { return .queueFull }
            enqueue(datagram)
            return .queued
        }
        switch sendBatch([datagram][...]) {
        case .done:
            statistics.datagramsSent += 1
            statistics.sendBatches += 1
            return .sent
        case .wouldBlock:
            enqueue(datagram)
            return .queued
        case .failed(let code):
            throw sendError(code, datagram)
        }
    }

    func trySend(contentsOf datagrams: ArraySlice<Datagram>) throws(DatagramError) -> Int {
        var rest = datagrams
        while let first = rest.first, pendingCount == 0 {
            // Straight to the kernel, a batch at a time, while it takes them.
            var batch = rest.prefix(64)
            for (offset, datagram) in batch.enumerated() {
                do throws(DatagramError) {
                    try check(datagram)
                } catch {
                    if offset == 0 { throw error }
                    batch = batch.prefix(offset)
                    break
                }
            }
            switch sendBatch(batch) {
            case .done(let count):
                statistics.datagramsSent += count
                statistics.sendBatches += 1
                rest = rest.dropFirst(count)
            case .wouldBlock:
                enqueue(first)
                rest = rest.dropFirst()
            case .failed(let code):
                if rest.startIndex > datagrams.startIndex { return rest.startIndex - datagrams.startIndex }
                throw sendError(code, first)
            }
        }
        var taken = rest.startIndex - datagrams.startIndex
        for datagram in rest {
            let outcome: DatagramSocket.SendOutcome
            do throws(DatagramError) {
                outcome = try trySend(datagram)
            } catch {
                if taken == 0 { throw error }
                return taken
            }
            if outcome == .queueFull { break }
            taken += 1
        }
        return taken
    }

    /// Tests: the next this many send calls find the kernel's buffer full (loopback UDP never
    /// fills it: a datagram leaves the sender's buffer as soon as it is delivered or dropped).
    var injectedFullBuffers = 0

    private func sendBatch(_ datagrams: ArraySlice<Datagram>) -> DatagramCallResult {
        if injectedFullBuffers > 0 {
            injectedFullBuffers -= 1
            return .wouldBlock
        }
        if let port = simulatedPort {
            // `check` made sure each has a destination (its own, or the connected peer).
            for datagram in datagrams {
                if let address = datagram.address ?? peer { port.send(datagram.bytes, to: address) }
            }
            return .done(datagrams.count)
        }
        return sendDatagramBatch(fd, datagrams)
    }

    func send(_ datagram: Datagram, resuming once: SendWait) {
        guard !isClosed else { return once.resume(with: .success(.success(.failure(.closed)))) }
        if waitingSenders.isEmpty && hasRoom {
            send(datagram, taking: once)
        } else {
            waitingSenders.append((datagram, once))
        }
    }

    /// Whether `trySend` would take a datagram now (send it, or queue it).
    private var hasRoom: Bool { pendingCount == 0 || pendingCount < max(1, options.sendQueueLimit) }

    /// Sends for a waiting `send(_:)`, if it still waits: its continuation is taken first, so
    /// a sender cancelled from another thread meanwhile is either told `.cancelled` (and its
    /// datagram is not sent) or sent (and told so) — never both.
    private func send(_ datagram: Datagram, taking once: SendWait) {
        guard let continuation = once.take() else { return }  // cancelled: not sent
        do throws(DatagramError) {
            _ = try trySend(datagram)  // there is room: sent or queued
            withLoop { $0.resumingInput { continuation.resume(returning: .success(.success(()))) } }
        } catch {
            continuation.resume(returning: .success(.failure(error)))
        }
    }

    private func check(_ datagram: Datagram) throws(DatagramError) {
        if datagram.bytes.count > maximumUDPPayload(family) {
            throw .tooLarge(size: datagram.bytes.count, limit: maximumUDPPayload(family))
        }
        if let address = datagram.address {
            if family == .ipv4 && address.family == .ipv6 {
                throw .invalidAddress("\(address) is an IPv6 destination, and the socket is IPv4")
            }
        } else if peer == nil {
            throw .invalidAddress("the datagram has no destination, and the socket is not connected")
        }
    }

    private func sendError(_ code: Int32, _ datagram: Datagram) -> DatagramError {
        if isMessageTooLarge(code) { return .tooLarge(size: datagram.bytes.count, limit: nil) }
        return .system(function: "sendmmsg to \(datagram.address.map(\.description) ?? peer.map(\.description) ?? "peer")",
                       errno: code)
    }

    private func enqueue(_ datagram: Datagram) {
        statistics.sendsQueued += 1
        queue.append(datagram)
        armWrite()
    }

    private func armWrite() {
        guard !isWriteArmed, let writeEvent else { return }
        do {
            try writeEvent.add()
            isWriteArmed = true
        } catch {
            registrationFailed(error)
        }
    }

    /// Sends queued datagrams, a batch per `sendmmsg`, while the kernel takes them; then lets
    /// waiting senders in.
    private func flushQueue() {
        while pendingCount > 0, !isClosed {
            switch sendBatch(queue[queueStart...]) {
            case .done(let count):
                statistics.datagramsSent += count
                statistics.sendBatches += 1
                queueStart += count
            case .wouldBlock:
                admitWaitingSenders()
                return
            case .failed(let code):
                queueStart += 1  // dropped, and reported
                handler?(.error(errno: code))
            }
        }
        queue.removeAll(keepingCapacity: queue.capacity <= 1_024)
        queueStart = 0
        if isWriteArmed {
            writeEvent?.delete()
            isWriteArmed = false
        }
        admitWaitingSenders()
    }

    private func admitWaitingSenders() {
        if queueStart > 256, queueStart * 2 > queue.count {
            queue.removeFirst(queueStart)
            queueStart = 0
        }
        while !waitingSenders.isEmpty, !isClosed, hasRoom {
            let (datagram, once) = waitingSenders.removeFirst()
            send(datagram, taking: once)  // skipped if its task was cancelled
        }
    }

    override func didClose() {
        writeEvent?.delete()
        writeEvent = nil
        handler = nil
        queue = []
        queueStart = 0
        let senders = waitingSenders
        waitingSenders = []
        for (_, once) in senders { once.resume(with: .success(.success(.failure(.closed)))) }
        inbox = []
        inboxStart = 0
        inboxBytes = 0
        if let port = simulatedPort {
            simulatedPort = nil
            port.close()
        } else {
            closeDescriptor(fd)
        }
        let onClosed = self.onClosed
        self.onClosed = nil
        onClosed?()
    }
}
