internal import CLibevent
#if canImport(Glibc)
import Glibc
#endif

/// What libevent reported for an event: the `EV_*` bits that Mainspring uses, as a typed set.
struct Readiness: OptionSet, Sendable {
    let rawValue: UInt8
    static let timeout = Readiness(rawValue: 1 << 0)
    static let read = Readiness(rawValue: 1 << 1)
    static let write = Readiness(rawValue: 1 << 2)
    static let signal = Readiness(rawValue: 1 << 3)

    init(rawValue: UInt8) { self.rawValue = rawValue }

    fileprivate init(libevent what: Int16) {
        var set: Readiness = []
        if Int32(what) & EV_TIMEOUT != 0 { set.insert(.timeout) }
        if Int32(what) & EV_READ != 0 { set.insert(.read) }
        if Int32(what) & EV_WRITE != 0 { set.insert(.write) }
        if Int32(what) & EV_SIGNAL != 0 { set.insert(.signal) }
        self = set
    }

    /// The `EV_*` flags for these events (what `event_new` and `bufferevent_enable` take).
    var libeventFlags: Int16 {
        var flags: Int32 = 0
        if contains(.read) { flags |= EV_READ }
        if contains(.write) { flags |= EV_WRITE }
        if contains(.signal) { flags |= EV_SIGNAL }
        return Int16(flags)
    }
}

/// Receives the readiness of a `NativeEvent`. Called from inside `event_base_loop`, so an
/// implementation must only record the readiness (append a ready record) and never run user code.
///
/// A `BufferedSocket` calls its target too (the `socket…` methods): one base class for both, so
/// that a connection's source is its socket's target itself, with no object in between.
class NativeEventTarget {
    func nativeEventFired(_ readiness: Readiness) {}
    /// A bufferevent's new input is buffered.
    func socketReadable() {}
    /// A bufferevent's output buffer drained to the low watermark.
    func socketDrained() {}
    /// A simulated socket's network took some of its output (it left, as after a `write(2)`).
    func socketOutputTaken() {}
    /// A bufferevent's EOF, error (with `errno`), timeout, or finished connect.
    func socketEvent(_ event: SocketEvent, errno: Int32) {}
}

/// One libevent `struct event`, owned by a Swift object (its target's source).
///
/// Lifecycle (libevent's): created non-pending; `add` makes it pending; when it fires it is
/// *active* for the duration of the trampoline; a persistent event stays pending, others do not.
/// `deinit` calls `event_free`, which also deletes it.
///
/// Ownership across the C boundary: the callback argument is the target, passed **unretained**
/// (`callbackArgument(for:)` in `init`). That is sound because the target owns this object
/// (strongly, directly or through its source), and `deinit` frees the C event before the target
/// can go: libevent can never call back into a freed target. The trampoline turns the pointer
/// back into the object with `callbackTarget(_:as:)`.
final class NativeEvent {
    private let raw: OpaquePointer
    private let base: EventBase  // keeps the base alive until the event is freed
    /// Whether the event watches a descriptor (not a timer or a signal): only such registrations
    /// take the base's injected failures, which stand for a descriptor closed behind the loop.
    private let watchesDescriptor: Bool

    /// An I/O event on `fd` (persistent) or, with `fd == -1` and no flags, a timer (one-shot).
    init(base: EventBase, fd: Int32, readiness: Readiness, persistent: Bool, target: NativeEventTarget)
        throws(EventLoopError)
    {
        if fd >= 0 {
            try base.refuseIfSimulated(readiness.contains(.signal) ? "signal \(fd)" : "file descriptor \(fd)")
        }
        var flags = readiness.libeventFlags
        if persistent { flags |= Int16(EV_PERSIST) }
        guard let event = event_new(base.raw, fd, flags, nativeEventTrampoline, callbackArgument(for: target)) else {
            throw .libevent(function: "event_new", errno: errno)
        }
        self.raw = event
        self.base = base
        watchesDescriptor = fd >= 0 && !readiness.contains(.signal)
    }

    /// A one-shot timer event.
    convenience init(timerOn base: EventBase, target: NativeEventTarget) throws(EventLoopError) {
        try self.init(base: base, fd: -1, readiness: [], persistent: false, target: target)
    }

    /// A persistent signal event (`evsignal_new` is a macro; this is what it expands to).
    convenience init(signal: Int32, base: EventBase, target: NativeEventTarget) throws(EventLoopError) {
        try self.init(base: base, fd: signal, readiness: .signal, persistent: true, target: target)
    }

    deinit { event_free(raw) }

    /// Makes the event pending; with a timeout it fires after `nanoseconds` at the latest
    /// (I/O events) or exactly then (timers). Re-adding a pending event reschedules it.
    func add(timeoutNanoseconds: UInt64? = nil) throws(EventLoopError) {
        if watchesDescriptor { try base.takeInjectedFailure("event_add") }
        if let ns = timeoutNanoseconds {
            var tv = timeval(tv_sec: Int(ns / 1_000_000_000), tv_usec: Int((ns % 1_000_000_000) / 1_000))
            // libevent rounds down to microseconds; round up so a timer never fires early.
            if ns % 1_000 != 0 { tv.tv_usec += 1 }
            if tv.tv_usec >= 1_000_000 { tv.tv_sec += 1; tv.tv_usec -= 1_000_000 }
            try check(event_add(raw, &tv), "event_add")
        } else {
            try check(event_add(raw, nil), "event_add")
        }
    }

    /// Makes the event non-pending (and non-active). Cheap and safe when it is not pending.
    func delete() { event_del(raw) }
}

private let nativeEventTrampoline: event_callback_fn = { _, what, arg in
    callbackTarget(arg, as: NativeEventTarget.self).nativeEventFired(Readiness(libevent: what))
}
