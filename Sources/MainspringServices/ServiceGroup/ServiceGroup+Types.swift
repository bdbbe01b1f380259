import Foundation
import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

extension ServiceGroup {
    /// One service in a group, with how the group treats it.
    public struct Member: Sendable {
        /// What the group does when the service's `run(_:)` returns before the group asked it
        /// to stop. (Throwing is always a failure that stops the group.)
        public enum ReturnBehavior: Sendable, Equatable {
            /// A failure: the group stops the others and ``ServiceGroup/run()`` throws
            /// ``ServiceGroupError/serviceReturnedEarly(service:report:)``. The default: a
            /// server that stops serving on its own is a bug worth a restart.
            case failGroup
            /// A request to stop: the group stops the others, as after a signal, and
            /// ``ServiceGroup/run()`` returns normally (a batch job whose end is the program's).
            case stopGroup
            /// Nothing: the others keep running (a one-shot task, a migration that runs first).
            case ignore
        }

        /// The service.
        public var service: any Service
        /// Its name in events, the report and errors (default: ``Service/name``).
        public var name: String
        /// How long it has to return once asked to stop before it is cancelled and the group
        /// goes on; nil: the group's ``ServiceGroup/Configuration/stopDeadline``.
        public var stopDeadline: Duration?
        /// How long it has, once started, to call ``ServiceContext/started()``; nil: the
        /// group's ``ServiceGroup/Configuration/startDeadline``. Past it the start counts as a
        /// failure (``ServiceGroup/StartTimedOut``): the group stops, this service included.
        public var startDeadline: Duration?
        /// What its returning on its own means.
        public var whenItReturns: ReturnBehavior

        /// `service`, with its own stop and start deadlines (nil: the group's) and return
        /// behaviour.
        public init(_ service: any Service, name: String? = nil, stopDeadline: Duration? = nil,
                    startDeadline: Duration? = nil, whenItReturns: ReturnBehavior = .failGroup)
        {
            self.service = service
            self.name = name ?? service.name
            self.stopDeadline = stopDeadline
            self.startDeadline = startDeadline
            self.whenItReturns = whenItReturns
        }

        /// A service written as a closure: `body` is its ``Service/run(_:)``.
        ///
        /// ```swift
        /// ServiceGroup.Member(name: "reloader") { context in
        ///     context.started()
        ///     await context.stopRequested()
        /// }
        /// ```
        public init(name: String, stopDeadline: Duration? = nil, startDeadline: Duration? = nil,
                    whenItReturns: ReturnBehavior = .failGroup,
                    run body: @escaping @Sendable (ServiceContext) async throws -> Void)
        {
            self.init(ClosureService(name: name, body: body), name: name, stopDeadline: stopDeadline,
                      startDeadline: startDeadline, whenItReturns: whenItReturns)
        }
    }

    /// How a group runs: which signals stop it, how long each service has to stop, what it
    /// tells the service manager, and who hears about each step.
    public struct Configuration: Sendable {
        /// The signals that stop the group gracefully; the second one received (of any of
        /// them) forces it. Default: `SIGTERM` and `SIGINT`. Empty: the group watches no
        /// signals (stop it with ``ServiceGroup/triggerShutdown()`` or by cancelling its task).
        public var stopSignals: [Int32] = [SIGTERM, SIGINT]
        /// The loop that watches ``stopSignals`` (`EventLoop.signals(_:)`): nil means
        /// ``loop``, or `EventLoop.main` when that is nil too. It must be running while the group runs — a signal is only
        /// handled when its loop polls — and no other loop may watch these signals.
        public var signalLoop: EventLoop?
        /// The loop the group keeps its time on and runs its tasks on. Its clock (`EventLoop.clock`)
        /// times the start and stop deadlines and the stop durations in the ``Report``; each
        /// service's task, and the group's own, prefer it as their executor; and it watches the
        /// signals when ``signalLoop`` is nil. It must be running while the group runs.
        ///
        /// nil (the default): the signals are watched on `EventLoop.main`; in a simulation's body
        /// or program (`MainspringTesting`) the tasks run on the simulation's loop and the
        /// deadlines are on its virtual time (or ``signalLoop``'s clock, if set); elsewhere the
        /// tasks run on the global concurrent executor and the deadlines are on ``signalLoop``'s
        /// clock, else the machine's continuous clock (`Task.sleep`). On a simulated loop (`MainspringTesting`), the whole group runs in
        /// virtual time: a 30 s stop deadline passes at once, exactly, and in the same order every
        /// run.
        public var loop: EventLoop?
        /// How long a service has to return once asked to stop, for members without a deadline
        /// of their own. Default 30 s. Past it, the service's task is cancelled and the group
        /// stops the next one.
        public var stopDeadline: Duration = .seconds(30)
        /// How long a service has to call ``ServiceContext/started()``, for members without a
        /// deadline of their own. Default nil: as long as it takes (a migration, a cache warmed
        /// from disk). Past it the group stops with ``ServiceGroup/StartTimedOut`` as the
        /// service's error — under systemd, before `TimeoutStartSec` kills it unexplained.
        public var startDeadline: Duration?
        /// What the group tells the service manager: nothing by default.
        public var serviceManager: ServiceManager = .none
        /// Called for each step (``ServiceGroup/Event``), in order, from the task running
        /// ``ServiceGroup/run()`` — a logger, a test's recorder. Keep it short: the group
        /// waits for it.
        public var onEvent: (@Sendable (Event) -> Void)?

        /// The defaults: stop on `SIGTERM`/`SIGINT` watched on `EventLoop.main`, 30 s per
        /// service, no service manager.
        public init() {}
    }

    /// What a group tells systemd (or another manager that speaks its notification protocol,
    /// ``ServiceNotifier``): `READY=1` once every service has started, `STOPPING=1` when
    /// stopping begins, and `WATCHDOG=1` from a ``Watchdog`` in between, while the given loops
    /// are healthy.
    public struct ServiceManager: Sendable {
        /// Where notifications go; disabled: nowhere.
        public var notifier: ServiceNotifier
        /// The manager's watchdog timeout (``Watchdog/requestedInterval(environment:)``), or
        /// nil for no watchdog. The watchdog starts with `READY=1` and stops just before
        /// `STOPPING=1` (a drain stops loops, which must not read as stuck ones).
        public var watchdogInterval: Duration?
        /// The loops the watchdog's pings vouch for (``Watchdog/init(watching:notifier:interval:stallThreshold:onHealthChange:)``).
        public var watchdogLoops: [EventLoop]
        /// How long a loop may go without polling before the pings stop (nil: half the interval).
        public var watchdogStallThreshold: Duration?
        /// Called on the watchdog's thread when the loops become unhealthy or healthy again.
        public var onWatchdogHealthChange: (@Sendable (Watchdog.Health) -> Void)?
        /// The `STATUS=` line sent with `READY=1` (nil: none). Called on the group's task.
        public var readyStatus: (@Sendable () -> String?)?
        /// The `STATUS=` line sent with `STOPPING=1`, given why (nil: none).
        public var stoppingStatus: (@Sendable (StopReason) -> String?)?

        /// Tells no one anything.
        public static let none = ServiceManager(notifier: .disabled)

        /// Notifications through `notifier`, and a watchdog over `watchdogLoops` when
        /// `watchdogInterval` is given.
        public init(notifier: ServiceNotifier, watchdogInterval: Duration? = nil, watchdogLoops: [EventLoop] = []) {
            self.notifier = notifier
            self.watchdogInterval = watchdogInterval
            self.watchdogLoops = watchdogLoops
        }

        /// What the environment asks for: `$NOTIFY_SOCKET` (none: a disabled notifier) and,
        /// when notifying, `$WATCHDOG_USEC`/`$WATCHDOG_PID`.
        ///
        /// - Throws: `ServiceEnvironmentError` when one of them is malformed (a daemon
        ///   usually warns and carries on with ``none``, or with the notifier alone).
        public static func fromEnvironment(
            _ environment: [String: String] = ProcessInfo.processInfo.environment, watchdogLoops: [EventLoop] = []
        ) throws(ServiceEnvironmentError) -> ServiceManager {
            let notifier = try ServiceNotifier(environment: environment)
            let interval = notifier.isEnabled ? try Watchdog.requestedInterval(environment: environment) : nil
            return ServiceManager(notifier: notifier, watchdogInterval: interval, watchdogLoops: watchdogLoops)
        }
    }

    /// Why a group stopped.
    public enum StopReason: Sendable, Equatable, CustomStringConvertible {
        /// One of ``Configuration/stopSignals`` arrived.
        case signal(Int32)
        /// ``ServiceGroup/triggerShutdown()`` was called.
        case triggered
        /// The named service threw while running.
        case serviceFailed(String)
        /// The named service returned while running (``Member/ReturnBehavior/failGroup`` or
        /// ``Member/ReturnBehavior/stopGroup``).
        case serviceReturned(String)
        /// The task running ``ServiceGroup/run()`` was cancelled: a forced stop.
        case cancelled
        /// Every service returned on its own (all ``Member/ReturnBehavior/ignore``).
        case allServicesEnded

        public var description: String {
            switch self {
            case .signal(let number): return signalName(number)
            case .triggered: return "shutdown triggered"
            case .serviceFailed(let name): return "\(name) failed"
            case .serviceReturned(let name): return "\(name) returned"
            case .cancelled: return "cancelled"
            case .allServicesEnded: return "every service ended"
            }
        }
    }

    /// How one service ended.
    public enum Outcome: Sendable, CustomStringConvertible {
        /// The group stopped before starting it.
        case notStarted
        /// It returned after being asked to stop.
        case stopped
        /// It returned on its own, before being asked to stop.
        case returned
        /// Its `run(_:)` threw (while running, or while stopping).
        case failed(any Error)
        /// It had not returned when its stop deadline passed: its task was cancelled and the
        /// group went on without waiting for it.
        case cancelledAfterDeadline(Duration)
        /// A forced stop (a second signal, the group's task cancelled) cancelled its task
        /// before it returned; the group did not wait for it.
        case cancelledByForce

        /// Whether this is how a service ends in a clean stop: stopped, returned, not started.
        public var isClean: Bool {
            switch self {
            case .notStarted, .stopped, .returned: return true
            case .failed, .cancelledAfterDeadline, .cancelledByForce: return false
            }
        }

        public var description: String {
            switch self {
            case .notStarted: return "not started"
            case .stopped: return "stopped"
            case .returned: return "returned"
            case .failed(let error): return "failed: \(error)"
            case .cancelledAfterDeadline(let deadline): return "cancelled after its \(deadline) deadline"
            case .cancelledByForce: return "cancelled by a forced stop"
            }
        }
    }

    /// A step of the group's life, for ``Configuration/onEvent``.
    public enum Event: Sendable, CustomStringConvertible {
        /// The named service's `run(_:)` is being called.
        case starting(service: String)
        /// The named service called ``ServiceContext/started()`` (or returned first).
        case started(service: String)
        /// Every service has started (and `READY=1` went out, if the manager is told).
        case ready
        /// Stopping begins, for this reason (and `STOPPING=1` went out).
        case stopRequested(StopReason)
        /// The named service is asked to stop, and has `deadline` to return.
        case stopping(service: String, deadline: Duration)
        /// The named service ended, or the group gave up on it.
        case ended(service: String, Outcome)
        /// A forced stop: every service still running is cancelled at once.
        case forced(StopReason)
        /// A notification to the service manager could not be sent (the group carries on).
        case notificationFailed(EventLoopError)

        public var description: String {
            switch self {
            case .starting(let name): return "starting \(name)"
            case .started(let name): return "started \(name)"
            case .ready: return "ready"
            case .stopRequested(let reason): return "stopping: \(reason)"
            case .stopping(let name, let deadline): return "stopping \(name) (deadline \(deadline))"
            case .ended(let name, let outcome): return "\(name): \(outcome)"
            case .forced(let reason): return "forced: \(reason)"
            case .notificationFailed(let error): return "cannot notify the service manager: \(error)"
            }
        }
    }

    /// How a group's run ended: why it stopped and how each service ended.
    public struct Report: Sendable, CustomStringConvertible {
        /// One service's end.
        public struct ServiceEnd: Sendable {
            /// The member's name.
            public let name: String
            /// How it ended.
            public let outcome: Outcome
            /// From being asked to stop to returning (or being given up on); nil when it was
            /// never asked (it ended on its own, or never started).
            public let stopDuration: Duration?
        }

        /// Why the group stopped.
        public let reason: StopReason
        /// Every member, in the group's order.
        public let services: [ServiceEnd]
        /// Whether a forced stop cut the graceful one short.
        public let forced: Bool

        /// Whether every service ended cleanly and nothing was forced.
        public var isClean: Bool { !forced && services.allSatisfy(\.outcome.isClean) }

        public var description: String {
            let ends = services.map { end in
                end.stopDuration.map { "\(end.name): \(end.outcome) in \(Int(($0 / .milliseconds(1)).rounded())) ms" }
                    ?? "\(end.name): \(end.outcome)"
            }
            return "\(reason)\(forced ? " (forced)" : ""); " + ends.joined(separator: ", ")
        }
    }
}

/// `Member(name:run:)`'s service.
struct ClosureService: Service {
    let name: String
    let body: @Sendable (ServiceContext) async throws -> Void
    func run(_ context: ServiceContext) async throws { try await body(context) }
}
