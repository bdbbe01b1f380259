internal import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// One socket of a simulation's network, as the network sees it (`MainspringTesting`): the
/// buffers of a bufferevent without a descriptor, on a simulated loop. The network puts what
/// arrives into the input and tells the connection, takes what the connection wrote from the
/// output, and reports the end of the input, errors and timeouts — what a socket's bufferevent
/// does after `read(2)` and `write(2)`, here on virtual time.
///
/// The connection's own code is the real one: it sees a `BufferedSocket` like any other. Loop
/// thread only (the thread driving the simulation). Every call is a no-op once the socket is
/// gone (`isOpen` false): its connection closed it.
@_spi(Simulation)
public final class SimulatedSocket {
    private var raw: OpaquePointer?
    private unowned(unsafe) let target: NativeEventTarget
    /// `target` when the socket owns it (a layer's trigger; a connection's socket is owned by
    /// its target instead). Such a socket's output is the layer's — sent, as far as the layer
    /// knows — so a close hands what the network has not taken yet to the network first.
    private let ownedTarget: NativeEventTarget?
    /// The network's side, once attached.
    private(set) var end: (any SimulatedStreamEnd)?

    /// - Parameter owningTarget: whether the socket keeps `target` alive (a `SimulatedLayerSocket`'s
    ///   trigger); a connection's socket does not (the connection owns the socket).
    init(bufferevent: OpaquePointer, target: NativeEventTarget, owningTarget: Bool = false) {
        self.raw = bufferevent
        self.target = target
        self.ownedTarget = owningTarget ? target : nil
        let argument = callbackArgument(for: self)
        evbuffer_add_cb(bufferevent_get_output(bufferevent), simulatedBufferChanged, argument)
        evbuffer_add_cb(bufferevent_get_input(bufferevent), simulatedBufferChanged, argument)
    }

    /// The inactivity timeouts the connection set (kept for an end attached later).
    private var timeouts: (read: UInt64?, write: UInt64?) = (nil, nil)

    func attach(_ end: any SimulatedStreamEnd) {
        guard raw != nil, self.end == nil else { return }
        self.end = end
        end.attach(self)
        if timeouts.read != nil || timeouts.write != nil { end.socketSetTimeouts(read: timeouts.read, write: timeouts.write) }
    }

    func setTimeouts(read: UInt64?, write: UInt64?) {
        timeouts = (read, write)
        end?.socketSetTimeouts(read: read, write: write)
    }

    /// The connection over this layer's socket closes gracefully: what its layer writes now (a
    /// TLS close_notify) goes whole, past ``layerSendBuffer`` — a record cut in two by the
    /// buffer would reach the peer as a truncated alert. A no-op for a connection's own socket.
    func layerWillClose() {
        guard let raw, ownedTarget != nil else { return }
        bufferevent_setwatermark(raw, Int16(EV_WRITE), 0, 0)
    }

    /// The connection half-closes: the network sends what a layer over this socket wrote last
    /// (its close_notify, which the layer has sent as far as it knows), then the end.
    func shutdownWrite() {
        guard let raw, let end else { return }
        let output = bufferevent_get_output(raw)
        let remaining = ownedTarget == nil ? [] : Self.remove(evbuffer_get_length(output), from: output)
        end.socketShutdownWrite(remainingOutput: remaining)
    }

    /// Its `BufferedSocket` is being freed: the network hears of it, and nothing is called on
    /// the bufferevent from now on.
    func socketClosing() {
        guard let raw else { return }
        // Unread input is what the kernel would still hold: what the network has not delivered
        // (it knows), and, under a layer, what the layer has not taken (its receive buffer).
        // A connection's own input buffer is libevent's — read from the socket already — so
        // closing with bytes there is a plain end of the stream, as over TCP.
        let unread = ownedTarget != nil && evbuffer_get_length(bufferevent_get_input(raw)) > 0
        let argument = callbackArgument(for: self)
        evbuffer_remove_cb(bufferevent_get_output(raw), simulatedBufferChanged, argument)
        evbuffer_remove_cb(bufferevent_get_input(raw), simulatedBufferChanged, argument)
        // A layer's output was written by it (TLS records): the network sends it before the
        // end, as a kernel sends a closed socket's buffer. A connection's is dropped.
        let output = bufferevent_get_output(raw)
        let remaining = ownedTarget == nil ? [] : Self.remove(evbuffer_get_length(output), from: output)
        self.raw = nil
        let end = self.end
        self.end = nil
        end?.socketClosed(unreadInput: unread, remainingOutput: remaining)
    }

    /// Takes `count` bytes from the front of `output`, which a socket bufferevent keeps frozen
    /// but while it writes itself.
    private static func remove(_ count: Int, from output: OpaquePointer?) -> [UInt8] {
        guard count > 0, let output else { return [] }
        evbuffer_unfreeze(output, 1)
        defer { evbuffer_freeze(output, 1) }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            initialized = max(0, Int(evbuffer_remove(output, buffer.baseAddress, count)))
        }
    }

    /// Its buffers, reading or watermarks changed: the network may move bytes.
    func changed() { end?.socketChanged() }

    /// Whether its connection still has it.
    public var isOpen: Bool { raw != nil }

    /// Bytes written by the connection and not yet taken by the network.
    public var outputCount: Int {
        guard let raw else { return 0 }
        return evbuffer_get_length(bufferevent_get_output(raw))
    }

    /// Takes up to `limit` bytes of the output (the network sends them); when the output falls
    /// to the connection's low watermark, its write callback runs, as after a `write(2)`.
    public func takeOutput(upTo limit: Int) -> [UInt8] {
        guard let raw, limit > 0 else { return [] }
        let output = bufferevent_get_output(raw)
        let count = min(limit, evbuffer_get_length(output))
        guard count > 0 else { return [] }
        let bytes = Self.remove(count, from: output)
        target.socketOutputTaken()
        var low = 0
        bufferevent_getwatermark(raw, Int16(EV_WRITE), &low, nil)
        if bufferevent_get_enabled(raw) & Int16(EV_WRITE) != 0, evbuffer_get_length(output) <= low {
            target.socketDrained()
        }
        return bytes
    }

    /// Bytes in the input the connection has not taken.
    public var inputCount: Int {
        guard let raw else { return 0 }
        return evbuffer_get_length(bufferevent_get_input(raw))
    }

    /// Whether the connection reads now (reading enabled, and its input under the high
    /// watermark): the network delivers only then, as a socket's bufferevent reads only then.
    public var isReading: Bool { inputRoom > 0 }

    /// How many more bytes the connection reads now: 0 while its reading is off, else what
    /// its high watermark leaves (`Int.max` without one). A layer's socket (under TLS) has no
    /// watermark of its own — the layer takes its input as its reader wants it — so it takes
    /// at most ``layerReceiveBuffer`` bytes that the layer has not taken, as a kernel's receive
    /// buffer holds what a process does not read: a layer whose reader stopped pushes back on
    /// its writer.
    public var inputRoom: Int {
        guard let raw, bufferevent_get_enabled(raw) & Int16(EV_READ) != 0 else { return 0 }
        var high = 0
        bufferevent_getwatermark(raw, Int16(EV_READ), nil, &high)
        if high == 0, ownedTarget != nil { high = Self.layerReceiveBuffer }
        guard high > 0 else { return .max }
        return max(0, high - evbuffer_get_length(bufferevent_get_input(raw)))
    }

    /// What a layer's socket holds that its layer has not taken (64 KiB): its receive buffer.
    public static let layerReceiveBuffer = 65_536

    /// What a layer's socket holds of the layer's output that the network has not taken
    /// (64 KiB): its send buffer.
    public static let layerSendBuffer = 65_536

    /// Appends `bytes` to the input and tells the connection (its read callback), as after a
    /// `read(2)`.
    public func deliver(_ bytes: [UInt8]) {
        guard let raw, !bytes.isEmpty else { return }
        // … and the end of its input frozen but while it reads.
        let input = bufferevent_get_input(raw)
        evbuffer_unfreeze(input, 0)
        _ = bytes.withUnsafeBytes { evbuffer_add(input, $0.baseAddress, $0.count) }
        evbuffer_freeze(input, 0)
        target.socketReadable()
    }

    /// The peer's end of the stream (`read(2)` returned 0).
    public func deliverEndOfFile() {
        guard raw != nil else { return }
        target.socketEvent([.reading, .endOfFile], errno: 0)
    }

    /// The stream failed with `code` (`ECONNRESET`, `ETIMEDOUT`).
    public func deliverError(_ code: Int32) {
        guard raw != nil else { return }
        target.socketEvent([.reading, .error], errno: code)
    }

    /// An inactivity timeout passed: reading (`reading`) or writing.
    public func deliverTimeout(reading: Bool) {
        guard let raw else { return }
        bufferevent_disable(raw, Int16(reading ? EV_READ : EV_WRITE))
        target.socketEvent([reading ? .reading : .writing, .timeout], errno: 0)
    }

    /// Whether output is pending and writing is enabled (a write timeout runs only then).
    public var isWritePending: Bool {
        guard let raw else { return false }
        return bufferevent_get_enabled(raw) & Int16(EV_WRITE) != 0 && evbuffer_get_length(bufferevent_get_output(raw)) > 0
    }
}

/// An evbuffer callback of a simulated socket's buffers: records that they changed.
private let simulatedBufferChanged: evbuffer_cb_func = { _, _, argument in
    callbackTarget(argument, as: SimulatedSocket.self).changed()
}

/// One end of a simulated stream under a layer of the package's own — MainspringTLS's OpenSSL
/// filter — on a simulated loop (`MainspringTesting`): a bufferevent without a descriptor whose
/// callbacks are the layer's. The network fills its input and takes its output as it does a
/// connection's socket's, and tells the layer through libevent's own callbacks
/// (`bufferevent_trigger`), as a socket's bufferevent does after `read(2)` and `write(2)`; so
/// the layer's code is the real one, over simulated bytes.
///
/// The layer's filter frees the bufferevent (made over it with `BEV_OPT_CLOSE_ON_FREE`); the
/// network hears of the close first — from the connection that adopts the filter
/// (`Connection.adopting(bufferevent:…simulatedLayer:)`), or from `closing()` when there is
/// none. Loop thread only.
package final class SimulatedLayerSocket {
    /// The bufferevent the layer puts its filter over.
    package let bufferevent: OpaquePointer
    let simulated: SimulatedSocket
    private let trigger: LayerTrigger
    /// The stream's end until `attach()`.
    private var pendingEnd: (any SimulatedStreamEnd)?

    /// A bufferevent for `end`, on `loop`'s base; the network feeds it from `attach()` on (once
    /// the layer's callbacks are set: what arrives first — a reset, say — then reaches them).
    /// On a throw the end is closed.
    package init(on loop: EventLoop, end: any SimulatedStreamEnd) throws(EventLoopError) {
        guard let bev = bufferevent_socket_new(loop.base.raw, -1, 0) else {
            end.socketClosed(unreadInput: false)
            throw .libevent(function: "bufferevent_socket_new", errno: errno)
        }
        // A kernel's send buffer: the layer stops moving its records here past it (they stay
        // in the layer's own output, the connection's) and goes on once the network took them.
        bufferevent_setwatermark(bev, Int16(EV_WRITE), 0, SimulatedSocket.layerSendBuffer)
        bufferevent = bev
        trigger = LayerTrigger(bufferevent: bev)
        simulated = SimulatedSocket(bufferevent: bev, target: trigger, owningTarget: true)
        pendingEnd = end
    }

    /// Gives the stream's end to the network: it delivers from now on.
    package func attach() {
        guard let end = pendingEnd else { return }
        pendingEnd = nil
        simulated.attach(end)
    }

    /// How the stream's input ended, as the network reported it to the layer: the end of the
    /// stream (`endOfFile`), or a failure with its errno; nil while it has not. A layer whose
    /// own account is only "an error" (libevent's OpenSSL filter turns the end of its input into
    /// one) reads what really happened here.
    package var reportedEnd: (endOfFile: Bool, errno: Int32)? { trigger.reportedEnd }

    /// The layer changed what it reads or writes (it enabled reading, say): the network looks
    /// again at what it can deliver.
    package func changed() { simulated.changed() }

    /// Runs the layer's write callback, as a socket with room does: a client's filter sends
    /// its first flight then.
    package func startWriting() {
        bufferevent_trigger(bufferevent, Int16(EV_WRITE), Int32(BEV_TRIG_IGNORE_WATERMARKS.rawValue))
    }

    /// The layer is about to free the bufferevent (a failed handshake, an HTTP connection that
    /// ends): the network hears the socket close — after the output the layer wrote, which it
    /// still sends — and nothing reaches the layer from now on. Idempotent.
    package func closing() {
        if let end = pendingEnd {
            pendingEnd = nil
            end.socketClosed(unreadInput: false)
        }
        simulated.socketClosing()
    }

    /// Closes the stream and frees the bufferevent, when no filter was put over it (a session
    /// that could not be made).
    package func discard() {
        closing()
        bufferevent_free(bufferevent)
    }
}

/// A layer socket's side of the network's calls: each one runs the bufferevent's own callback
/// (the layer's), as libevent does for a socket that became readable, drained or failed.
private final class LayerTrigger: NativeEventTarget {
    private let bufferevent: OpaquePointer
    /// The end of the input or the failure last reported (see `SimulatedLayerSocket.reportedEnd`).
    private(set) var reportedEnd: (endOfFile: Bool, errno: Int32)?

    init(bufferevent: OpaquePointer) { self.bufferevent = bufferevent }

    override func socketReadable() { bufferevent_trigger(bufferevent, Int16(EV_READ), 0) }

    override func socketDrained() { bufferevent_trigger(bufferevent, Int16(EV_WRITE), 0) }

    override func socketEvent(_ event: SocketEvent, errno code: Int32) {
        var what: Int32 = 0
        if event.contains(.reading) { what |= BEV_EVENT_READING }
        if event.contains(.writing) { what |= BEV_EVENT_WRITING }
        if event.contains(.endOfFile) { what |= BEV_EVENT_EOF }
        if event.contains(.error) { what |= BEV_EVENT_ERROR }
        if event.contains(.timeout) { what |= BEV_EVENT_TIMEOUT }
        if event.contains(.connected) { what |= BEV_EVENT_CONNECTED }
        if event.contains(.endOfFile) || event.contains(.error) {
            reportedEnd = (event.contains(.endOfFile), event.contains(.error) ? code : 0)
        }
        // The layer reads the failure's errno, as after a failed read(2).
        errno = code
        bufferevent_trigger_event(bufferevent, Int16(what), 0)
    }
}
