/// The order in which a loop runs ready work: `.input` before `.normal` before `.background`.
///
/// `.input` is for fd readiness and signals (the default for watchers), `.normal` for posted
/// closures, timers and the Dispatch main queue, `.background` for long work fed in slices
/// (`Feeder`). Strict priority is tempered by the loop's fairness rules (see
/// `EventLoop.Configuration`): `.background` keeps a guaranteed share under an input flood.
public enum Priority: Sendable, Hashable, Comparable, CaseIterable, CustomStringConvertible {
    /// File descriptor readiness and signals: served first.
    case input
    /// Posted closures, timers, the Dispatch main queue and actor jobs.
    case normal
    /// Long work fed in slices: served last, but with a guaranteed share of a saturated loop.
    case background

    /// Index of the ready queue: 0 is served first.
    @inline(__always)
    var queueIndex: Int {
        switch self {
        case .input: return 0
        case .normal: return 1
        case .background: return 2
        }
    }

    /// `.background < .normal < .input`: a greater priority runs first.
    public static func < (lhs: Priority, rhs: Priority) -> Bool { lhs.queueIndex > rhs.queueIndex }

    public var description: String {
        switch self {
        case .input: return "input"
        case .normal: return "normal"
        case .background: return "background"
        }
    }
}
