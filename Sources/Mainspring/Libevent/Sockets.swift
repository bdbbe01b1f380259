internal import CLibevent
#if canImport(Glibc)
import Glibc
#endif

// libevent's bufferevent (buffered socket I/O), wrapped (its listener: SocketListener.swift).
// Like NativeEvent, every C callback argument is the Swift target, passed unretained (see
// `callbackArgument(for:)`). Callbacks run inside `event_base_loop` and only record what
// happened (the targets fire their sources); no user code runs here.

/// What a bufferevent reported (`BEV_EVENT_*`).
struct SocketEvent: OptionSet, Sendable {
    let rawValue: UInt8
    static let reading = SocketEvent(rawValue: 1 << 0)
    static let writing = SocketEvent(rawValue: 1 << 1)
    static let endOfFile = SocketEvent(rawValue: 1 << 2)
    static let error = SocketEvent(rawValue: 1 << 3)
    static let timeout = SocketEvent(rawValue: 1 << 4)
    static let connected = SocketEvent(rawValue: 1 << 5)

    init(rawValue: UInt8) { self.rawValue = rawValue }

    fileprivate init(libevent what: Int16) {
        let w = Int32(what)
        var set: SocketEvent = []
        if w & BEV_EVENT_READING != 0 { set.insert(.reading) }
        if w & BEV_EVENT_WRITING != 0 { set.insert(.writing) }
        if w & BEV_EVENT_EOF != 0 { set.insert(.endOfFile) }
        if w & BEV_EVENT_ERROR != 0 { set.insert(.error) }
        if w & BEV_EVENT_TIMEOUT != 0 { set.insert(.timeout) }
        if w & BEV_EVENT_CONNECTED != 0 { set.insert(.connected) }
        self = set
    }
}

/// A socket with libevent's input and output buffers (`bufferevent_socket_new`). Owns the fd:
/// `deinit` frees the bufferevent and closes it.
final class BufferedSocket {
    private let raw: OpaquePointer
    private let base: EventBase
    /// The network's side of a socket of a simulation (`MainspringTesting`), told of every
    /// change of the buffers and of the reading; nil for a kernel's socket, which the kernel
    /// watches. (The world a loop reaches decides which a socket is: `StreamEndpoint`.)
    private(set) var simulated: SimulatedSocket?

    /// Wraps a connected, non-blocking socket.
    convenience init(base: EventBase, fd: Int32, target: NativeEventTarget) throws(EventLoopError) {
        try self.init(wrapping: fd, on: base, target: target, refusing: "a connection on descriptor \(fd)")
    }

    /// What the other initializers but `adopting` start with: a bufferevent on `fd` (-1: no
    /// socket yet), closing it when freed, its callbacks going to `target`. A simulated loop
    /// refuses it, naming `what`.
    private init(wrapping fd: Int32, on base: EventBase, target: NativeEventTarget, refusing what: @autoclosure () -> String)
        throws(EventLoopError)
    {
        try base.refuseIfSimulated(what())
        guard let bev = bufferevent_socket_new(base.raw, fd, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else {
            throw .libevent(function: "bufferevent_socket_new", errno: errno)
        }
        self.raw = bev
        self.base = base
        let arg = callbackArgument(for: target)
        bufferevent_setcb(bev, socketReadTrampoline, socketWriteTrampoline, socketEventTrampoline, arg)
    }

    /// A socket of the simulation's network (`MainspringTesting`) on a simulated loop's base: a
    /// bufferevent without a descriptor (libevent never polls it: the loop never polls), whose
    /// input the network fills and whose output it takes (see `SimulatedSocket`). `end` is the
    /// network's side, attached now; nil until a connect finishes (`attach(simulated:)`).
    init(simulatedOn base: EventBase, end: (any SimulatedStreamEnd)?, target: NativeEventTarget) throws(EventLoopError) {
        guard let bev = bufferevent_socket_new(base.raw, -1, 0) else {
            throw .libevent(function: "bufferevent_socket_new", errno: errno)
        }
        self.raw = bev
        self.base = base
        let arg = callbackArgument(for: target)
        bufferevent_setcb(bev, socketReadTrampoline, socketWriteTrampoline, socketEventTrampoline, arg)
        let simulated = SimulatedSocket(bufferevent: bev, target: target)
        self.simulated = simulated
        if let end { simulated.attach(end) }
    }

    /// Gives a simulated socket (made without one) the end of the stream its connect made.
    func attach(simulated end: any SimulatedStreamEnd) {
        simulated?.attach(end)
    }

    /// Makes the stream end under a layer (`SimulatedLayerSocket`) this socket's simulated
    /// side: what the connection writes and its timeouts reach the network through it, and the
    /// network hears of the close when this socket goes (before its bufferevent — the layer's
    /// filter, with the layer socket under it — is freed).
    func adopt(simulatedLayer: SimulatedLayerSocket) {
        simulated = simulatedLayer.simulated
    }

    /// Takes over `bufferevent`, made elsewhere in the package on `base` (a TLS bufferevent over
    /// an established session, say): its callbacks go to `target` from now on, and `deinit`
    /// frees it (closing its socket, if it was made with `BEV_OPT_CLOSE_ON_FREE`).
    init(adopting bufferevent: OpaquePointer, base: EventBase, target: NativeEventTarget) {
        self.raw = bufferevent
        self.base = base
        let arg = callbackArgument(for: target)
        bufferevent_setcb(bufferevent, socketReadTrampoline, socketWriteTrampoline, socketEventTrampoline, arg)
    }

    /// The bufferevent itself, for the package code that made it (a TLS layer reads its errors).
    var bufferevent: OpaquePointer { raw }

    /// A bufferevent without a socket yet (a connect by name, still resolving or trying
    /// addresses): writes are buffered in its output until `attach(fd:)` (libevent's own
    /// `bufferevent_socket_connect_hostname` works this way).
    convenience init(unconnectedOn base: EventBase, target: NativeEventTarget) throws(EventLoopError) {
        try self.init(wrapping: -1, on: base, target: target, refusing: "a connection")
    }

    /// Starts a non-blocking connect to `address` (a literal's one address); `socketEvent(.connected)`
    /// or an error follows.
    convenience init(connectingTo address: SocketAddress, base: EventBase, target: NativeEventTarget) throws(EventLoopError) {
        try self.init(wrapping: -1, on: base, target: target, refusing: "a connection to \(address)")
        let bev = raw
        let rc = address.storage.withUnsafeBytes { bytes in
            bufferevent_socket_connect(bev, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), Int32(bytes.count))
        }
        if rc < 0 { throw .system(function: "connect \(address)", errno: errno) }
        disableNagle(bufferevent_getfd(bev))
    }

    /// Gives an unconnected bufferevent its connected socket (now owned by it): the events it
    /// has enabled start polling it, and the output buffered meanwhile is written.
    /// - Throws: `.libevent` when the loop refuses the descriptor (the fd is then the
    ///   bufferevent's all the same, and closed with it).
    func attach(fd: Int32) throws(EventLoopError) {
        try check(bufferevent_setfd(raw, fd), "bufferevent_setfd")
    }

    deinit {
        simulated?.socketClosing()
        bufferevent_free(raw)
    }

    var fd: Int32 { bufferevent_getfd(raw) }

    /// Starts polling for `events` (`bufferevent_enable`, an `event_add` underneath).
    /// - Throws: `.libevent` with the errno when the loop refuses the descriptor.
    func enable(_ events: IOEvents) throws(EventLoopError) {
        try base.takeInjectedFailure("bufferevent_enable")
        try check(bufferevent_enable(raw, events.readiness.libeventFlags), "bufferevent_enable")
        simulated?.changed()
    }

    /// Stops polling for `events`. (`bufferevent_disable` only deletes events, which cannot
    /// fail for a valid bufferevent: its result is 0 by construction.)
    func disable(_ events: IOEvents) {
        bufferevent_disable(raw, events.readiness.libeventFlags)
        simulated?.changed()
    }

    /// From now on `target.socketOutputTaken()` runs whenever output leaves the buffer (the
    /// kernel, the layer under the connection, or a simulation's network took some) — a
    /// response's stall deadline counts from it. One callback per write to the socket. Until the
    /// socket is freed (its buffer's callbacks go with it).
    func reportOutputTaken(to target: NativeEventTarget) {
        evbuffer_add_cb(bufferevent_get_output(raw), outputTakenTrampoline, callbackArgument(for: target))
    }

    var inputLength: Int { evbuffer_get_length(bufferevent_get_input(raw)) }
    var outputLength: Int { evbuffer_get_length(bufferevent_get_output(raw)) }

    /// Splits up to `limit` input bytes into lines, reading them where libevent keeps them (no
    /// copy, no buffer of our own), then removes them from the input. Returns how many bytes it
    /// took. `emit` must not run user code: the input may not change while it is being read.
    func splitInput(upTo limit: Int, into splitter: inout LineSplitter, _ emit: (LineEvent) -> Void) -> Int {
        let input = bufferevent_get_input(raw)
        let wanted = min(limit, evbuffer_get_length(input))
        guard wanted > 0 else { return 0 }
        return withUnsafeTemporaryAllocation(of: iovec.self, capacity: Self.maxExtents) { extents in
            let count = min(Int(evbuffer_peek(input, wanted, nil, extents.baseAddress, Int32(Self.maxExtents))),
                            Self.maxExtents)
            var taken = 0
            for extent in extents.prefix(count) where taken < wanted {
                let length = min(extent.iov_len, wanted - taken)
                guard let base = extent.iov_base, length > 0 else { continue }
                splitter.feed(UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: length), emit)
                taken += length
            }
            evbuffer_drain(input, taken)
            return taken
        }
    }

    /// Extents looked at per `splitInput` (libevent chains are 4 KiB and more, so a 64 KiB read
    /// rarely spans more than a few).
    fileprivate static let maxExtents = 16

    /// Removes up to `limit` input bytes and returns them in an array of their exact size
    /// (empty when there is no input).
    func readInput(upTo limit: Int) -> [UInt8] {
        let input = bufferevent_get_input(raw)
        let count = min(limit, evbuffer_get_length(input))
        guard count > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            initialized = max(0, Int(evbuffer_remove(input, buffer.baseAddress, count)))
        }
    }

    /// Removes up to `limit` input bytes and appends them to `array` (the pieces of a long
    /// `read(exactly:)`); returns how many.
    func readInput(appendingTo array: inout [UInt8], upTo limit: Int) -> Int {
        let input = bufferevent_get_input(raw)
        let count = min(limit, evbuffer_get_length(input))
        guard count > 0 else { return 0 }
        let start = array.count
        array.append(contentsOf: repeatElement(0, count: count))
        let removed = array.withUnsafeMutableBufferPointer { buffer in
            max(0, Int(evbuffer_remove(input, buffer.baseAddress! + start, count)))
        }
        if removed < count { array.removeLast(count - removed) }
        return removed
    }

    /// Puts `bytes` back at the front of the input (what a `read(exactly:)` had gathered when
    /// the input ended, for the next reader).
    func unreadInput(_ bytes: [UInt8]) throws(EventLoopError) {
        let rc = bytes.withUnsafeBytes { evbuffer_prepend(bufferevent_get_input(raw), $0.baseAddress, $0.count) }
        try check(rc, "evbuffer_prepend")
    }

    /// The offset of the first occurrence of `pattern` in the input at or after `start`, ending
    /// before `end` (the pattern's last byte included), or nil.
    /// - Complexity: O(`end - start`), plus O(chains) to reach `start`.
    func firstInputOffset(of pattern: [UInt8], from start: Int, before end: Int) -> Int? {
        let input = bufferevent_get_input(raw)
        let length = evbuffer_get_length(input)
        let end = min(end, length)
        guard !pattern.isEmpty, start + pattern.count <= end else { return nil }
        var from = evbuffer_ptr()
        var to = evbuffer_ptr()
        guard evbuffer_ptr_set(input, &from, start, EVBUFFER_PTR_SET) == 0 else { return nil }
        if end < length {
            guard evbuffer_ptr_set(input, &to, end, EVBUFFER_PTR_SET) == 0 else { return nil }
        }
        let bounded = end < length
        let found = pattern.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { chars in
                withUnsafeMutablePointer(to: &to) { stop in
                    evbuffer_search_range(input, chars.baseAddress, chars.count, &from, bounded ? stop : nil)
                }
            }
        }
        return found.pos < 0 ? nil : found.pos
    }

    /// Appends bytes to the output buffer (libevent writes them as the socket allows), from
    /// `offset` on.
    func write(_ bytes: [UInt8], from offset: Int = 0) throws(EventLoopError) {
        guard offset < bytes.count else { return }
        let rc = bytes.withUnsafeBytes { bufferevent_write(raw, $0.baseAddress! + offset, $0.count - offset) }
        try check(rc, "bufferevent_write")
    }

    /// Writes what the kernel takes at once of `bytes` straight to the socket, past the output
    /// buffer — only while that buffer is empty, so that the order of the bytes is kept. A small
    /// reply then costs one `send(2)`: no buffer chain allocated, no write event added, polled
    /// and deleted. Returns the bytes written; the caller buffers the rest (all of them when the
    /// socket would block, or failed: libevent's own write then reports the failure). For a
    /// plain socket only (a TLS bufferevent writes records, a pipe has no `send`).
    func writeNow(_ bytes: [UInt8]) -> Int {
        guard evbuffer_get_length(bufferevent_get_output(raw)) == 0 else { return 0 }
        let fd = bufferevent_getfd(raw)
        guard fd >= 0 else { return 0 }  // a simulated socket (MainspringTesting): buffered
        return bytes.withUnsafeBytes { sendWithoutBlocking(fd, $0) }
    }

    /// The drain callback fires when the output buffer falls to `bytes` or below.
    func setWriteLowWatermark(_ bytes: Int) { bufferevent_setwatermark(raw, Int16(EV_WRITE), bytes, 0) }

    /// libevent stops reading the socket while this many bytes of input are buffered.
    func setReadHighWatermark(_ bytes: Int) {
        bufferevent_setwatermark(raw, Int16(EV_READ), 0, bytes)
        simulated?.changed()
    }

    /// Read and write inactivity timeouts (nil: none).
    func setTimeouts(readNanoseconds: UInt64?, writeNanoseconds: UInt64?) {
        if let simulated {
            simulated.setTimeouts(read: readNanoseconds, write: writeNanoseconds)
            return
        }
        var read = timeval(nanoseconds: readNanoseconds ?? 0)
        var write = timeval(nanoseconds: writeNanoseconds ?? 0)
        switch (readNanoseconds, writeNanoseconds) {
        case (nil, nil): bufferevent_set_timeouts(raw, nil, nil)
        case (_?, nil): bufferevent_set_timeouts(raw, &read, nil)
        case (nil, _?): bufferevent_set_timeouts(raw, nil, &write)
        case (_?, _?): bufferevent_set_timeouts(raw, &read, &write)
        }
    }

    /// Half-closes the socket: the peer reads end of file once our output is sent.
    func shutdownWrite() {
        if let simulated {
            simulated.shutdownWrite()
            return
        }
        shutdown(fd, Int32(SHUT_WR))
    }
}

/// The input buffer, read in place by the line splitter (`InPlaceLineSplitter`).
extension BufferedSocket: SplittableInput {
    var count: Int { inputLength }

    func forEachExtent(upTo limit: Int, _ body: (UnsafeBufferPointer<UInt8>) -> Bool) {
        let input = bufferevent_get_input(raw)
        let wanted = min(limit, evbuffer_get_length(input))
        guard wanted > 0 else { return }
        withUnsafeTemporaryAllocation(of: iovec.self, capacity: Self.maxExtents) { extents in
            var done = 0
            var from = evbuffer_ptr()
            var usePosition = false
            while done < wanted {
                // Up to `maxExtents` pieces per peek; a longer span (rare) is peeked again from
                // where the last one stopped.
                let positioned = usePosition
                let found = withUnsafeMutablePointer(to: &from) { start in
                    Int(evbuffer_peek(input, wanted - done, positioned ? start : nil, extents.baseAddress,
                                      Int32(Self.maxExtents)))
                }
                let count = min(found, Self.maxExtents)
                guard count > 0 else { return }
                for extent in extents.prefix(count) where done < wanted {
                    let length = min(extent.iov_len, wanted - done)
                    guard let base = extent.iov_base, length > 0 else { continue }
                    done += length
                    if !body(UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: length)) {
                        return
                    }
                }
                guard done < wanted, evbuffer_ptr_set(input, &from, done, EVBUFFER_PTR_SET) == 0 else { return }
                usePosition = true
            }
        }
    }

    func copyBytes(from offset: Int, count: Int) -> [UInt8] {
        let input = bufferevent_get_input(raw)
        var position = evbuffer_ptr()
        guard count > 0, evbuffer_ptr_set(input, &position, offset, EVBUFFER_PTR_SET) == 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            initialized = max(0, Int(evbuffer_copyout_from(input, &position, buffer.baseAddress, count)))
        }
    }

    func drain(_ count: Int) {
        evbuffer_drain(bufferevent_get_input(raw), count)
    }
}

private let socketReadTrampoline: bufferevent_data_cb = { _, arg in
    callbackTarget(arg, as: NativeEventTarget.self).socketReadable()
}

private let socketWriteTrampoline: bufferevent_data_cb = { _, arg in
    callbackTarget(arg, as: NativeEventTarget.self).socketDrained()
}

private let socketEventTrampoline: bufferevent_event_cb = { _, what, arg in
    let code = errno
    callbackTarget(arg, as: NativeEventTarget.self)
        .socketEvent(SocketEvent(libevent: what), errno: code)
}

private extension timeval {
    init(nanoseconds: UInt64) {
        self.init(tv_sec: Int(nanoseconds / 1_000_000_000), tv_usec: Int((nanoseconds % 1_000_000_000 + 999) / 1_000))
    }
}

/// The outcome of a non-blocking connect once its socket is writable: 0, or the errno.
func pendingConnectError(_ fd: Int32) -> Int32 {
    var code: Int32 = 0
    var length = socklen_t(MemoryLayout<Int32>.size)
    guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &code, &length) == 0 else { return errno }
    return code
}

/// The port and the printable address a listening socket is bound to.
func boundPortAndName(of fd: Int32) -> (port: UInt16, address: String) {
    var bound = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    let address = withUnsafeMutablePointer(to: &bound) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress -> String in
            getsockname(fd, socketAddress, &length) == 0 ? describe(socketAddress, Int32(length)) : "unknown"
        }
    }
    return (portOf(bound), address)
}

private func portOf(_ storage: sockaddr_storage) -> UInt16 {
    var copy = storage
    return withUnsafePointer(to: &copy) { pointer -> UInt16 in
        switch Int32(storage.ss_family) {
        case AF_INET: return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        case AF_INET6: return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
        default: return 0
        }
    }
}

/// "address:port" of a peer, for messages.
func describe(_ address: UnsafeMutablePointer<sockaddr>?, _ length: Int32) -> String {
    guard let address else { return "unknown" }
    var host = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
    switch Int32(address.pointee.sa_family) {
    case AF_INET:
        return address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
            var addr = sin.pointee.sin_addr
            evutil_inet_ntop(AF_INET, &addr, &host, host.count)
            return "\(text(of: host)):\(UInt16(bigEndian: sin.pointee.sin_port))"
        }
    case AF_INET6:
        return address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
            var addr = sin6.pointee.sin6_addr
            evutil_inet_ntop(AF_INET6, &addr, &host, host.count)
            return "[\(text(of: host))]:\(UInt16(bigEndian: sin6.pointee.sin6_port))"
        }
    case AF_UNIX:
        // A path (NUL-terminated), an abstract name (a leading NUL, shown as "@"), or unnamed.
        let pathOffset = MemoryLayout<sa_family_t>.size
        let pathLength = Int(length) - pathOffset
        guard pathLength > 0 else { return "unix socket (unnamed)" }
        let bytes = UnsafeRawBufferPointer(start: UnsafeRawPointer(address) + pathOffset, count: pathLength)
        if bytes[0] == 0 { return "@" + String(decoding: bytes.dropFirst(), as: UTF8.self) }
        return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
    default:
        return "unknown"
    }
}

private func text(of cString: [CChar]) -> String {
    String(decoding: cString.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// An output buffer lost bytes (`reportOutputTaken(to:)`): tells its target.
private let outputTakenTrampoline: evbuffer_cb_func = { _, info, argument in
    guard let info, info.pointee.n_deleted > 0 else { return }
    callbackTarget(argument, as: NativeEventTarget.self).socketOutputTaken()
}
