import MainspringCore

/// Why ``ServiceGroup/run()`` did not end with a clean stop. Each case that ran services
/// carries the group's ``ServiceGroup/Report``: how every service ended.
public enum ServiceGroupError: Error, Sendable, CustomStringConvertible {
    /// `service` threw `error` while running (not asked to stop): the group stopped the others
    /// in reverse order. `error` is the service's own error, as thrown.
    case serviceFailed(service: String, error: any Error, report: ServiceGroup.Report)
    /// `service` returned before it was asked to stop, and its member's
    /// ``ServiceGroup/Member/whenItReturns`` is ``ServiceGroup/Member/ReturnBehavior/failGroup``:
    /// the group stopped the others in reverse order.
    case serviceReturnedEarly(service: String, report: ServiceGroup.Report)
    /// The group was asked to stop (a signal, ``ServiceGroup/triggerShutdown()``, a service
    /// that ended with ``ServiceGroup/Member/ReturnBehavior/stopGroup``) but the stop was not
    /// clean: a service was cancelled past its deadline, threw while stopping, or a forced stop
    /// (a second signal, the group's task cancelled) cut it short. The report says which.
    case stopIncomplete(ServiceGroup.Report)
    /// ``ServiceGroup/run()`` was called a second time: a group runs once.
    case alreadyRun
    /// The stop signals could not be watched (another loop watches one of them, the loop is
    /// gone): nothing was started.
    case cannotWatchSignals(EventLoopError)

    /// The group's report, when services ran.
    public var report: ServiceGroup.Report? {
        switch self {
        case .serviceFailed(_, _, let report), .serviceReturnedEarly(_, let report), .stopIncomplete(let report):
            return report
        case .alreadyRun, .cannotWatchSignals:
            return nil
        }
    }

    public var description: String {
        switch self {
        case .serviceFailed(let service, let error, let report):
            return "\(service) failed: \(error) (\(report))"
        case .serviceReturnedEarly(let service, let report):
            return "\(service) returned before it was asked to stop (\(report))"
        case .stopIncomplete(let report):
            return "the stop was not clean: \(report)"
        case .alreadyRun:
            return "a service group runs once"
        case .cannotWatchSignals(let error):
            return "cannot watch the stop signals: \(error)"
        }
    }
}

extension ServiceGroup {
    /// The error of a service that did not call ``ServiceContext/started()`` within its start
    /// deadline (``ServiceGroup/Member/startDeadline``): ``ServiceGroup/run()`` throws
    /// ``ServiceGroupError/serviceFailed(service:error:report:)`` with it, after stopping the
    /// group (that service is asked to stop too, within its stop deadline).
    public struct StartTimedOut: Error, Sendable, Equatable, CustomStringConvertible {
        /// The service.
        public let service: String
        /// The deadline it missed.
        public let deadline: Duration

        public var description: String { "\(service) did not start within \(deadline)" }
    }
}
