/// Why a ``DatagramSocket`` call failed. The datagram's own failures have cases of their own;
/// what the loop or the binding reports is ``loop(_:)``, carrying the ``EventLoopError``.
public enum DatagramError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A datagram of `size` bytes is larger than UDP allows: `limit` is the family's payload
    /// limit (65,507 bytes for IPv4, 65,527 for IPv6), or nil when the kernel refused it with
    /// EMSGSIZE (a smaller socket buffer, or a path MTU with fragmentation forbidden). Nothing
    /// was sent.
    case tooLarge(size: Int, limit: Int?)
    /// The socket is closed: by `close()`, by its loop's shutdown, or while a `send(_:)` waited
    /// for room (that datagram was not sent).
    case closed
    /// The task waiting in `send(_:)` was cancelled: its datagram was not sent, and the socket
    /// stays open for other senders (see "Cancellation" in the documentation's "Handles,
    /// Cancellation and Closing").
    case cancelled
    /// The address is not one this call can use: a datagram without a destination on a socket
    /// that is not connected, an IPv6 destination for an IPv4 socket, a group that is not a
    /// multicast address or an interface that does not exist, a host that is neither a literal
    /// nor a well-formed name. The text says what is wrong, whole (it is the description).
    case invalidAddress(String)
    /// A system call failed with `errno`: `function` says which and for what — the `bind`
    /// (`EADDRINUSE`, `EACCES`), the `connect`, a send (`EACCES` for a broadcast address without
    /// ``DatagramSocket/Options/allowsBroadcast``, `ECONNREFUSED` for a connected peer that
    /// answered port-unreachable), a multicast join (`EADDRINUSE`: joined already).
    case system(function: String, errno: Int32)
    /// The loop could not do it: called off its thread (``EventLoopError/wrongThread(function:)``),
    /// shut down (`.loopClosed`), a host name given to bind (`.bindNeedsAddress`), a simulated
    /// loop refusing something real (`.simulatedLoop`), or a registration libevent refused
    /// (`.libevent`).
    case loop(EventLoopError)

    /// The loop's error in the datagram's terms: its `cancelled`, `invalidAddress` and `system`
    /// become this type's; the rest is ``loop(_:)``.
    init(_ error: EventLoopError) {
        switch error {
        case .cancelled: self = .cancelled
        case .invalidAddress: self = .invalidAddress(error.description)
        case .system(let function, let code): self = .system(function: function, errno: code)
        default: self = .loop(error)
        }
    }

    public var description: String {
        switch self {
        case .tooLarge(let size, let limit):
            return limit.map { "a datagram of \(size) bytes is larger than UDP's \($0)-byte limit" }
                ?? "a datagram of \(size) bytes is too large for the socket (EMSGSIZE)"
        case .closed:
            return "the datagram socket is closed"
        case .cancelled:
            return "cancelled: the waiting task was cancelled; the datagram was not sent"
        case .invalidAddress(let text):
            return text
        case .system(let function, let code):
            return EventLoopError.system(function: function, errno: code).description
        case .loop(let error):
            return error.description
        }
    }
}
