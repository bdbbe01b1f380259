// Sources/Mainspring/Libevent/ is the only folder that imports CLibevent: it holds what talks to
// libevent (the base, events, sockets, listeners). Everything here is internal; the rest of
// Mainspring sees typed Swift wrappers. (System/ holds the operating system's own calls.)
internal import CLibevent
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Owns one libevent `event_base`: the demultiplexer (epoll, the timer min-heap) of one loop.
///
/// Created with `EVENT_BASE_FLAG_NOLOCK` (a base is only ever touched on its loop's thread) and
/// `EVENT_BASE_FLAG_PRECISE_TIMER` (timerfd-backed microsecond timers instead of the 4 ms coarse
/// clock). Freed in `deinit`; every `NativeEvent` keeps its base alive, so the base outlives them.
final class EventBase {
    let raw: OpaquePointer

    /// Fault injection for tests: this many of the next registrations of a descriptor
    /// (`event_add` of a descriptor's watch, `bufferevent_enable`, `evconnlistener_enable`) fail
    /// with `EBADF`, as they do when a descriptor was closed behind the loop's back. The loop's
    /// own timers and signals never take one. Loop thread only; 0 in normal operation.
    var injectedRegistrationFailures = 0

    /// Set on a simulated loop's base (`MainspringTesting`): every descriptor, socket, listener
    /// and signal event is refused with `EventLoopError.simulatedLoop`, so that nothing real is
    /// mixed into a simulation silently. (The loop's own eventfd is made before it is set.)
    var refusesDescriptors = false

    /// Throws `EventLoopError.simulatedLoop` for `what` on a simulated loop's base.
    @inline(__always)
    func refuseIfSimulated(_ what: @autoclosure () -> String) throws(EventLoopError) {
        if refusesDescriptors { throw .simulatedLoop(refused: what()) }
    }

    /// Consumes one injected failure, if any is left (see `injectedRegistrationFailures`).
    @inline(__always)
    func takeInjectedFailure(_ function: StaticString) throws(EventLoopError) {
        guard injectedRegistrationFailures > 0 else { return }
        injectedRegistrationFailures -= 1
        throw .libevent(function: "\(function)", errno: EBADF)
    }

    /// How many descriptors `event_base_new` takes on Linux: the epoll instance, the timerfd of
    /// `EVENT_BASE_FLAG_PRECISE_TIMER`, and the pipe of libevent's signal handling.
    static let descriptorsPerBase = 4

    init() throws(EventLoopError) {
        _ = silenceLibeventLog
        // libevent ends the process (`exit(1)`) when it cannot make its signal pipe, and quietly
        // drops to coarse timers when the timerfd fails: out of descriptors, a new base must be
        // an error, not either of those. So take the descriptors it needs first and hand them
        // back just before it runs. (Another thread that opens a file in that instant can still
        // take one; then libevent's fatal path runs, and says why: see `reportLibeventFatal`.)
        try Self.checkDescriptorsAvailable(Self.descriptorsPerBase)
        guard let config = event_config_new() else { throw .libevent(function: "event_config_new", errno: errno) }
        defer { event_config_free(config) }
        let flags = EVENT_BASE_FLAG_NOLOCK.rawValue | EVENT_BASE_FLAG_PRECISE_TIMER.rawValue
        try check(event_config_set_flag(config, Int32(flags)), "event_config_set_flag")
        guard let base = event_base_new_with_config(config) else {
            throw .libevent(function: "event_base_new_with_config", errno: errno)
        }
        raw = base
    }

    deinit { event_base_free(raw) }

    /// Throws `EventLoopError.system` (`EMFILE`, `ENFILE`) unless `count` descriptors can be
    /// opened now: opens them (`/dev/null`, then duplicates) and closes them again.
    private static func checkDescriptorsAvailable(_ count: Int) throws(EventLoopError) {
        var probes: [Int32] = []
        probes.reserveCapacity(count)
        defer { for fd in probes { close(fd) } }
        while probes.count < count {
            let fd = probes.isEmpty ? open("/dev/null", O_RDONLY | O_CLOEXEC) : fcntl(probes[0], F_DUPFD_CLOEXEC, 0)
            guard fd >= 0 else {
                throw .system(function: "event_base_new (needs \(count) descriptors)", errno: errno)
            }
            probes.append(fd)
        }
    }

    /// Whether libevent has callbacks of its own waiting to run — a deferred callback, an event
    /// activated by hand, a bufferevent's finalizer — on a simulated loop's base, which never
    /// polls (`runActiveCallbacks`).
    var hasActiveCallbacks: Bool { event_base_get_num_events(raw, EVENT_BASE_COUNT_ACTIVE) > 0 }

    /// Runs the callbacks of `hasActiveCallbacks` (a simulated loop, at each iteration that has
    /// any: a freed bufferevent's finalizer, a layer's deferred work, as a poll would). The
    /// base holds no descriptors but the loop's eventfd, which the pass may drain.
    func runActiveCallbacks() {
        _ = event_base_loop(raw, EVLOOP_NONBLOCK | EVLOOP_ONCE)
    }

    /// One `event_base_loop(EVLOOP_ONCE)` pass: waits (unless `blocking` is false) until at least
    /// one event is ready, runs the trampolines of everything ready, and returns.
    ///
    /// The trampolines only record readiness; no user code runs in here, which is what lets a
    /// handler spin the loop again (libevent refuses a nested `event_base_loop` on one base).
    func poll(blocking: Bool) throws(EventLoopError) {
        let flags = EVLOOP_ONCE | (blocking ? 0 : EVLOOP_NONBLOCK)
        // libevent fails a loop when the kernel's poll does (epoll_wait or epoll_ctl: EBADF when
        // a descriptor of the loop's was closed behind its back); the errno says which.
        if event_base_loop(raw, flags) < 0 { throw .system(function: "event_base_loop", errno: errno) }
    }
}

/// libevent prints its warnings to stderr by default. Mainspring reports every failure as an
/// `EventLoopError` instead, so it installs a log callback that drops them (once per process) —
/// but keeps the last error-level message, and a fatal-error callback that prints it: libevent
/// ends the process on a few conditions it cannot recover from, and that end must say why.
private let silenceLibeventLog: Void = {
    event_set_log_callback { severity, message in
        guard severity == EVENT_LOG_ERR, let message else { return }
        lastLibeventError.withLock { $0 = String(cString: message) }
    }
    event_set_fatal_callback { code in reportLibeventFatal(code) }
}()

private let lastLibeventError = Protected<String?>(nil)

/// libevent's fatal-error callback: prints the reason on standard error. libevent then calls
/// `exit` with `code`.
private func reportLibeventFatal(_ code: Int32) {
    let reason = lastLibeventError.withLock { $0 } ?? "no message"
    let text = "Mainspring: libevent cannot go on and ends the process (status \(code)): \(reason)\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
}

/// Maps a libevent return code (negative on failure) to `EventLoopError.libevent`, with the
/// `errno` the failed call left (read at once, before anything else can change it).
@inline(__always)
func check(_ rc: Int32, _ function: StaticString) throws(EventLoopError) {
    if rc < 0 { throw .libevent(function: "\(function)", errno: errno) }
}

// MARK: Callback arguments

// Every libevent callback here gets its Swift target as the `void *` argument, passed
// *unretained*: the target owns the C object's wrapper (directly or through its source), and the
// wrapper frees the C object in `deinit`, so libevent can never call back into a freed target.
// These two functions are the only places that cross that boundary.

/// The callback argument for `target` (not retained; see above).
func callbackArgument(for target: AnyObject) -> UnsafeMutableRawPointer {
    Unmanaged.passUnretained(target).toOpaque()
}

/// The target behind a callback argument made by `callbackArgument(for:)`.
@inline(__always)
func callbackTarget<Target: AnyObject>(_ argument: UnsafeMutableRawPointer?, as type: Target.Type) -> Target {
    Unmanaged<Target>.fromOpaque(argument!).takeUnretainedValue()
}
