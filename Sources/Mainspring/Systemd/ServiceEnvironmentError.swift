/// Why what the service manager passed through the environment cannot be used: a variable with
/// a malformed or out-of-range value (`WATCHDOG_USEC=abc`, an over-long `NOTIFY_SOCKET`), or
/// `LISTEN_FDS` naming descriptors that are not open.
///
/// These are problems with the process's configuration, not with a loop, which is why they are
/// not ``EventLoopError``s: a daemon usually reports them and exits (socket activation) or
/// carries on without the feature (readiness notification, the watchdog). Every case names the
/// variable, the value (cut to 64 characters in ``description``) and what was expected.
public enum ServiceEnvironmentError: Error, Equatable, Sendable, CustomStringConvertible {
    /// `variable` has a value that cannot be used; `expected` says what would be accepted.
    case invalidValue(variable: String, value: String, expected: String)
    /// `LISTEN_FDS` says `count` descriptors were passed from 3 on, but `descriptor` is not open.
    case passedDescriptorNotOpen(descriptor: Int32, count: Int)

    public var description: String {
        switch self {
        case .invalidValue(let variable, let value, let expected):
            let shown = value.count > 64 ? "\(value.prefix(64))… (\(value.utf8.count) bytes)" : value
            return "\(variable)='\(shown)' cannot be used: expected \(expected)"
        case .passedDescriptorNotOpen(let descriptor, let count):
            let range = count == 1 ? "descriptor 3 was" : "descriptors 3…\(2 + count) were"
            return "LISTEN_FDS=\(count) says \(range) passed, but descriptor \(descriptor) is not open"
        }
    }
}
