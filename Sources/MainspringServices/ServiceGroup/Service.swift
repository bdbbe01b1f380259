import MainspringCore

/// A long-lived part of a program that a ``ServiceGroup`` starts, watches and stops: a
/// listener and its connections, an HTTP side, a supervisor of child processes, a signal
/// handler that reloads the configuration.
///
/// ```swift
/// struct LineServer: Service {
///     let group: EventLoopGroup
///     var name: String { "line server" }
///
///     func run(_ context: ServiceContext) async throws {
///         let server = try await AsyncLineService(group: group)   // start: may throw
///         context.started()                                       // the next service may start
///         await context.stopRequested()                           // serve until asked to stop
///         await server.shutdown(gracePeriod: .seconds(5))         // then drain
///     }
/// }
/// ```
///
/// The contract, which the group relies on:
/// - `run(_:)` does the service's start-up, calls ``ServiceContext/started()`` once it is
///   ready to be depended on (the group starts the next service only then), runs until
///   ``ServiceContext/stopRequested()`` returns, stops gracefully, and returns.
/// - Throwing from `run(_:)` is a failure: the group stops the other services and
///   ``ServiceGroup/run()`` throws ``ServiceGroupError/serviceFailed(service:error:report:)``
///   with the error. Returning before being asked to stop is what the member's
///   ``ServiceGroup/Member/whenItReturns`` says (by default a failure too).
/// - A service that does not return within its stop deadline after being asked is cancelled
///   (its task, so `Task.isCancelled`, cancellation handlers, and every Mainspring wait that
///   honours cancellation) and the group goes on without waiting for it.
///
/// `run(_:)` is called once, in a task of its own (not on any loop unless the service moves
/// there: an `@MainActor` body runs on `EventLoop.main`, `withTaskExecutorPreference(loop)` on
/// another loop). `Sendable`, because the group holds services across tasks.
public protocol Service: Sendable {
    /// The name the group uses for this service in its events, its report and its errors.
    /// Default: the type's name.
    var name: String { get }

    /// Starts the service, calls `context.started()`, runs until `context.stopRequested()`
    /// returns, then stops. See ``Service`` for the contract.
    func run(_ context: ServiceContext) async throws
}

extension Service {
    /// The type's name (`LineServer`).
    public var name: String { String(describing: Self.self) }
}

/// What a ``ServiceGroup`` gives each service's ``Service/run(_:)``: the way to say "started"
/// and to hear "stop".
///
/// Any thread: every member is safe to call from the service's own task, another task, a
/// loop callback. Costs one uncontended lock per call (and one continuation per waiting task).
public final class ServiceContext: Sendable {
    /// The service's name (``Service/name``, or the ``ServiceGroup/Member``'s).
    public let name: String

    private struct State {
        var hasStarted = false
        var isStopRequested = false
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        /// Waits whose task was cancelled before their continuation was stored.
        var cancelledWaits: Set<Int> = []
        var nextWait = 0
    }

    private let state = Protected(State())
    private let onStarted: @Sendable () -> Void

    init(name: String, onStarted: @escaping @Sendable () -> Void) {
        self.name = name
        self.onStarted = onStarted
    }

    /// Tells the group that the service is up (listening, connected, loaded): the group starts
    /// the next service, or, after the last one, tells the service manager `READY=1`. Calls
    /// after the first are ignored. A service that returns without calling it counts as
    /// started when it returns.
    public func started() {
        let first = state.withLock { state in
            defer { state.hasStarted = true }
            return !state.hasStarted
        }
        if first { onStarted() }
    }

    /// Whether the group has asked this service to stop.
    public var isStopRequested: Bool { state.withLock { $0.isStopRequested } }

    /// Returns once the group asks this service to stop (at once if it has already), or once
    /// the calling task is cancelled (a deadline passed, a forced stop) — check
    /// `Task.isCancelled` if the difference matters. Any number of tasks may wait.
    public func stopRequested() async {
        let id: Int? = state.withLock { state in
            if state.isStopRequested { return nil }
            state.nextWait += 1
            return state.nextWait
        }
        guard let id else { return }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.isStopRequested || state.cancelledWaits.remove(id) != nil { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                if let waiter = state.waiters.removeValue(forKey: id) { return waiter }
                if !state.isStopRequested { state.cancelledWaits.insert(id) }
                return nil
            }
            waiter?.resume()
        }
    }

    /// The group asks the service to stop: every waiter returns.
    func requestStop() {
        let waiters = state.withLock { state in
            state.isStopRequested = true
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }
}
