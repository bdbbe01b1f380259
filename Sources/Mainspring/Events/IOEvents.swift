/// Which readiness an fd watcher asks for, and which it got.
public struct IOEvents: OptionSet, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The fd has data to read, or its peer closed (a read then returns 0).
    public static let read = IOEvents(rawValue: 1 << 0)
    /// The fd can take more data.
    public static let write = IOEvents(rawValue: 1 << 1)

    public var description: String {
        switch self {
        case [.read, .write]: return "[read, write]"
        case .read: return "[read]"
        case .write: return "[write]"
        default: return "[]"
        }
    }

    var readiness: Readiness {
        var set: Readiness = []
        if contains(.read) { set.insert(.read) }
        if contains(.write) { set.insert(.write) }
        return set
    }

    init(_ readiness: Readiness) {
        var set: IOEvents = []
        if readiness.contains(.read) { set.insert(.read) }
        if readiness.contains(.write) { set.insert(.write) }
        self = set
    }
}
