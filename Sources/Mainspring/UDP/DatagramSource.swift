#if canImport(Glibc)
import Glibc
#endif

/// The loop side of a `DatagramSocket`: its transport (a kernel's socket, or a port of a
/// simulation's network, as the loop's world made it), the consumer, the bounded send queue.
/// Loop thread only.
final class DatagramSource: Source {
    /// A waiting `send(_:)`: the loop's wait (`.cancelled`, `.loopClosed`) around the send's own
    /// outcome.
    typealias SendWait = ResumeOnce<Result<Result<Void, DatagramError>, EventLoopError>, Never>

    /// Where the datagrams go and come from (`DatagramTransport`).
    let transport: any DatagramTransport
    let family: SocketAddress.Family
    let options: DatagramSocket.Options
    var peer: SocketAddress?
    var statistics = DatagramSocket.Statistics()
    var onClosed: (() -> Void)?
    private(set) var queue: [Datagram] = []
    private var queueStart = 0
    private(set) var handler: ((DatagramEvent) -> Void)?
    private(set) var isReadingPaused = false
    private var writeEvent: NativeEvent?
    private var isWriteArmed = false
    /// `send(_:)` calls waiting for room in the queue, in order. One whose task was cancelled has been
    /// resumed already: its datagram is skipped, never sent.
    private var waitingSenders: [(Datagram, SendWait)] = []
    init(loop: EventLoop, transport: any DatagramTransport, family: SocketAddress.Family, options: DatagramSocket.Options)
        throws(EventLoopError)
    {
        self.transport = transport
        self.family = family
        self.options = options
        super.init(loop: loop, priority: options.priority)
        do {
            writeEvent = try transport.makeWriteEvent(on: loop.base, target: self)
        } catch {
            close()
            throw error
        }
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
        try transport.startReading(for: self)
        self.handler = handler
        transport.readerReady(self)
    }

    func pauseReading() {
        guard !isReadingPaused else { return }
        isReadingPaused = true
        native?.delete()
    }

    func resumeReading() {
        guard isReadingPaused, !isClosed else { return }
        isReadingPaused = false
        transport.resumeReading(for: self)
    }

    override func resumeNative() {
        guard !isReadingPaused else { return }
        super.resumeNative()
    }

    override func perform(_ readiness: Readiness) {
        if readiness.contains(.write) { flushQueue() }
        if readiness.contains(.read) { receive() }
    }

    /// Up to `maximumDatagramsPerWakeup` datagrams, in batches (the transport's); the rest wait
    /// for the next poll (the event is level-triggered) or turn.
    private func receive() {
        transport.receive(for: self, limit: max(1, options.maximumDatagramsPerWakeup))
    }

    /// One event for the consumer (a transport's delivery), counted.
    func deliver(_ event: DatagramEvent) {
        if case .datagram(let datagram) = event {
            statistics.datagramsReceived += 1
            if datagram.isTruncated { statistics.datagramsTruncated += 1 }
        }
        handler?(event)
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
        return transport.send(datagrams, peer: peer)
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
        transport.close()
        let onClosed = self.onClosed
        self.onClosed = nil
        onClosed?()
    }
}
