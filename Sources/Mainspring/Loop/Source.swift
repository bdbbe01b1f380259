#if canImport(Glibc)
import Glibc
#endif

/// Something registered on a loop that becomes ready and is then dispatched by the loop's
/// scheduler: a timer, an fd watcher, a line reader, a signal watcher.
///
/// Lifecycle: created open and registered with its loop (which keeps it alive); `fire` marks it
/// ready (at most one ready record per source is queued); the scheduler calls `perform` with the
/// accumulated readiness; `close` unregisters it for good. Every call happens on the loop's
/// thread.
///
/// A source is never re-entered: while `perform` runs (say it spins the loop), new readiness is
/// only accumulated, and a level-triggered native event that keeps firing is *held back*
/// (deleted from libevent) until `perform` returns — the GLib rule, without a syscall in the
/// common case.
class Source: NativeEventTarget {
    /// Valid while the source is open: the loop closes every source it holds before it goes.
    /// Held unmanaged: the loop-thread hot paths reach it through `withLoop` without a retain
    /// (an `EventLoop` has a side table, for the weak references of its thread's binding, so each
    /// of its retains and releases takes the slow path).
    private let unmanagedLoop: Unmanaged<EventLoop>

    /// The source's loop, as a strong reference (one retain and release for the caller).
    final var loop: EventLoop { unmanagedLoop.takeUnretainedValue() }

    /// Calls `body` with the source's loop, without retaining it: valid while the source is
    /// open, which it is on every loop-thread path that has the source.
    @inline(__always)
    final func withLoop<R>(_ body: (EventLoop) throws -> R) rethrows -> R {
        try unmanagedLoop._withUnsafeGuaranteedRef(body)
    }
    let priority: Priority
    /// The libevent event behind the source, if it has one.
    var native: NativeEvent?

    private(set) var pending: Readiness = []
    private(set) var isQueued = false
    private(set) var isRunning = false
    private(set) var isClosed = false
    private var isHeldBack = false

    /// Whether the source is in-flight work that a graceful shutdown waits for (a connection, a
    /// one-shot timer), rather than a standing watch (a repeating timer, an fd watcher).
    let keepsLoopBusy: Bool

    init(loop: EventLoop, priority: Priority, keepsLoopBusy: Bool = false) {
        self.unmanagedLoop = Unmanaged.passUnretained(loop)
        self.priority = priority
        self.keepsLoopBusy = keepsLoopBusy
        super.init()
        loop.register(self)
    }

    // MARK: Called by the loop

    /// Records readiness and queues the source once. Cheap: called from libevent trampolines.
    final func fire(_ readiness: Readiness) {
        guard !isClosed else { return }
        pending.formUnion(readiness)
        if isRunning {
            // Fired again during a nested poll while its handler runs: hold it back.
            if !isHeldBack, let native, keepsFiring {
                native.delete()
                isHeldBack = true
            }
            return
        }
        if !isQueued {
            isQueued = true
            withLoop { $0.enqueue(source: self) }
        }
    }

    override final func nativeEventFired(_ readiness: Readiness) { fire(readiness) }

    /// Runs the handler with the readiness accumulated since the last run.
    final func run() {
        isQueued = false
        guard !isClosed else { return }
        let readiness = pending
        pending = []
        isRunning = true
        perform(readiness)
        isRunning = false
        guard !isClosed else { return }
        if isHeldBack {
            isHeldBack = false
            resumeNative()
        }
        if !pending.isEmpty && !isQueued {
            isQueued = true
            withLoop { $0.enqueue(source: self) }
        }
        didRun()
    }

    /// Unregisters the source: no handler runs after this returns. Idempotent.
    final func close() {
        guard !isClosed else { return }
        isClosed = true
        native?.delete()
        native = nil
        didClose()
        loop.unregister(self)
    }

    // MARK: For subclasses

    /// Makes the source's native event — `fd` watched for `readiness`, persistent or one-shot —
    /// adds it to the loop and keeps it in `native`. On a throw (the loop refused it) `native`
    /// is left as it was; the caller decides whether the source then closes.
    @inline(__always)
    final func addNativeEvent(fd: Int32, readiness: Readiness, persistent: Bool) throws(EventLoopError) {
        let event = try NativeEvent(base: loop.base, fd: fd, readiness: readiness, persistent: persistent, target: self)
        try event.add()
        native = event
    }

    /// The source's kind in a simulation's trace and deadlock report: its type's name.
    var traceLabel: String { String(describing: type(of: self)) }

    /// What an always-ready source (queued each turn with `enqueueNextTurn`) reports.
    var turnReadiness: Readiness = .read

    /// Whether the native event is persistent and level-triggered (fd events): only those can
    /// fire repeatedly while the handler runs and need holding back.
    var keepsFiring: Bool { false }

    /// The handler call. Must be overridden.
    func perform(_ readiness: Readiness) {}

    /// Called after `perform` when the source is still open.
    func didRun() {}

    /// Called once by `close()`: drop handler closures here (they may capture the loop).
    func didClose() {}

    /// Re-adds a held-back native event; if the loop refuses it, the source fails.
    func resumeNative() {
        guard let native else { return }
        do {
            try native.add()
        } catch {
            registrationFailed(error)
        }
    }

    /// The loop could not register the source's event again (`event_add` or
    /// `bufferevent_enable` failed: a descriptor closed behind the loop's back, out of memory).
    /// A source that cannot be polled would never fire again, silently; so it is counted in
    /// `LoopMetrics.sourceFailures` and ended with the error (`failed(_:)`).
    final func registrationFailed(_ error: EventLoopError) {
        guard !isClosed else { return }
        withLoop { $0.scheduler.counters.sourceFailures += 1 }
        failed(error)
    }

    /// How the source ends after a registration failure: tell its user if it has a way (a line
    /// reader delivers `.error(errno)`, a connection closes with `.error(errno)`), then close.
    /// The default closes (a plain watcher is then cancelled: `isCancelled` reads true).
    func failed(_ error: EventLoopError) { close() }
}

extension EventLoopError {
    /// The errno behind the error, if any (`ENOMEM` when none was recorded: the one failure
    /// libevent reports without an errno is an allocation).
    var errnoCode: Int32 {
        switch self {
        case .system(_, let code): return code
        case .libevent(_, let code): return code == 0 ? ENOMEM : code
        case .badDescriptor: return EBADF
        default: return EINVAL
        }
    }
}
