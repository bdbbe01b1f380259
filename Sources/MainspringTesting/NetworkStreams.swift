@_spi(Simulation) import MainspringCore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

// The parts of the simulated network's streams (`NetworkCore`): their ends, directions and
// packets, listeners and connects on their way, and the heap of the network's events.

/// A host address and a port.
struct HostPort: Hashable {
    let host: String
    let port: UInt16
}

/// Two hosts, unordered.
struct HostPair: Hashable {
    let low: String
    let high: String
    init(_ one: String, _ other: String) {
        (low, high) = one <= other ? (one, other) : (other, one)
    }
}

/// What travels on a direction of a stream.
struct Packet {
    enum Kind {
        case data([UInt8])
        /// The sender's end of the stream (a FIN).
        case end
        /// A reset (an RST).
        case reset
    }
    var kind: Kind
    var arrival: UInt64
}

/// One direction of a stream: what is on its way or waits for the reader.
final class Direction {
    var packets: [Packet] = []
    /// Data bytes in `packets` (bounded by the window).
    var bytes = 0
    var isHeadScheduled = false
    var isStalledOnReader = false
    var isStalledByPartition = false
}

/// One end of a simulated stream: the network's side of a connection's socket.
final class NetworkEnd: SimulatedStreamEnd {
    unowned let network: NetworkCore
    let host: String
    let port: UInt16
    /// Orders this end's deliveries against others' at one instant (from the seed).
    let key: UInt64
    /// Whether the stream is a pipe to a simulated program (`makePipe`): no latency, no faults.
    let isPipe: Bool
    /// The other end (cleared once both are closed).
    var peer: NetworkEnd?
    let outgoing = Direction()
    private(set) var socket: SimulatedSocket?
    private(set) var isClosed = false
    var isDirty = false
    var isWriteShut = false
    var finSent = false
    var rstSent = false
    var isReset = false
    var wasReading = false
    var readTimeout: UInt64?
    var writeTimeout: UInt64?
    var lastRead: UInt64 = 0
    var lastWrite: UInt64 = 0
    var readCheckScheduled = false
    var writeCheckScheduled = false

    init(network: NetworkCore, host: String, port: UInt16, key: UInt64, isPipe: Bool = false) {
        self.network = network
        self.host = host
        self.port = port
        self.key = key
        self.isPipe = isPipe
    }

    func attach(_ socket: SimulatedSocket) {
        guard !isClosed else { return }
        self.socket = socket
        network.attached(self)
    }

    func socketChanged() { network.markDirty(self) }

    func socketShutdownWrite(remainingOutput: [UInt8]) {
        if !remainingOutput.isEmpty, !isReset, peer != nil { network.sendRemaining(remainingOutput, from: self) }
        isWriteShut = true
        network.markDirty(self)
    }

    func socketClosed(unreadInput: Bool) {
        guard !isClosed else { return }
        isClosed = true
        socket = nil
        network.closed(self, unreadInput: unreadInput)
    }

    func socketClosed(unreadInput: Bool, remainingOutput: [UInt8]) {
        guard !isClosed else { return }
        if !remainingOutput.isEmpty, !isReset, peer != nil { network.sendRemaining(remainingOutput, from: self) }
        socketClosed(unreadInput: unreadInput)
    }

    func socketSetTimeouts(read: UInt64?, write: UInt64?) {
        readTimeout = read
        writeTimeout = write
        network.timeoutsChanged(self)
    }
}

/// A connect on its way: finished once (connected, refused, timed out).
final class ConnectAttempt {
    let from: String
    let port: UInt16
    let to: String
    let address: SocketAddress
    private var done: ((Result<any SimulatedStreamEnd, EventLoopError>) -> Void)?

    init(from: String, port: UInt16, to: String, address: SocketAddress,
         done: @escaping (Result<any SimulatedStreamEnd, EventLoopError>) -> Void)
    {
        self.from = from
        self.port = port
        self.to = to
        self.address = address
        self.done = done
    }

    var isFinished: Bool { done == nil }

    func finish(_ result: Result<any SimulatedStreamEnd, EventLoopError>, network: NetworkCore) {
        guard let done else { return }
        self.done = nil
        done(result)
    }
}

/// A listening port of the simulated network.
final class NetworkListener: SimulatedListening {
    unowned let network: NetworkCore
    let key: HostPort
    let backlog: Int
    private let accepted: (any SimulatedStreamEnd, String) -> Void
    private var isAccepting = true
    private var waiting: [(NetworkEnd, String)] = []
    private var isClosed = false

    /// A Unix listener's path (nil: a TCP listener).
    let name: String?

    init(network: NetworkCore, key: HostPort, backlog: Int, accepted: @escaping (any SimulatedStreamEnd, String) -> Void,
         name: String? = nil)
    {
        self.network = network
        self.key = key
        self.backlog = backlog
        self.accepted = accepted
        self.name = name
    }

    var port: UInt16 { key.port }
    var localAddress: String { name ?? "\(key.host):\(key.port)" }

    /// Whether a new connection fits (accepting, or room in the backlog).
    var hasRoom: Bool { !isClosed && (isAccepting || waiting.count < backlog) }

    func enqueue(_ end: NetworkEnd, peer: String) {
        if isAccepting {
            accepted(end, peer)
        } else {
            waiting.append((end, peer))
        }
    }

    func setAccepting(_ accepting: Bool) {
        isAccepting = accepting
        while isAccepting, !isClosed, !waiting.isEmpty {
            let (end, peer) = waiting.removeFirst()
            accepted(end, peer)
        }
    }

    func close() {
        guard !isClosed else { return }
        isClosed = true
        network.removeListener(self)
        let left = waiting
        waiting = []
        for (end, _) in left { end.socketClosed(unreadInput: true) }  // the client sees a reset
    }
}

/// A network event: `action` at `time`; at one instant, by `key` (from the seed), then in the
/// order scheduled.
struct NetworkEvent: MinHeapElement {
    let time: UInt64
    let key: UInt64
    let sequence: UInt64
    let action: () -> Void

    func precedes(_ other: NetworkEvent) -> Bool {
        (time, key, sequence) < (other.time, other.key, other.sequence)
    }
}
