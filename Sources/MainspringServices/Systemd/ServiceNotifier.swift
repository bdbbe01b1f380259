import Foundation
import MainspringCore

/// One state change a service reports to its service manager (systemd's notification
/// protocol, `sd_notify(3)`).
public enum ServiceNotification: Sendable, Equatable {
    /// `READY=1`: start-up is finished, the service accepts requests. A `Type=notify` unit
    /// counts as started only once it arrives.
    case ready
    /// `RELOADING=1` with `MONOTONIC_USEC=` (the moment it was sent, on `CLOCK_MONOTONIC`): the
    /// service is reloading its configuration. Send ``ready`` when the reload is done.
    case reloading
    /// `STOPPING=1`: the service is shutting down.
    case stopping
    /// `STATUS=…`: a one-line status for humans (`systemctl status`). Line breaks become spaces,
    /// and a text so long that the message would exceed the manager's 4,096-byte limit is cut.
    case status(String)
    /// `WATCHDOG=1`: the service is alive. A unit with `WatchdogSec=` is restarted when these
    /// stop coming for that long; ``Watchdog`` sends them while the loops are healthy.
    case watchdog
}

/// Tells the service manager — systemd, or a container runtime that speaks its notification
/// protocol — what the service is doing: ready, reloading, stopping, a status line, watchdog
/// pings. No libsystemd: each ``notify(_:)-(ServiceNotification...)`` sends one datagram to the
/// unix socket named by `$NOTIFY_SOCKET` (a filesystem path, or an abstract name written with a
/// leading `@`).
///
/// ```swift
/// let notifier = try ServiceNotifier()       // $NOTIFY_SOCKET, or a disabled notifier
/// try notifier.notify(.ready, .status("accepting on port 7000"))
/// ```
///
/// Without `$NOTIFY_SOCKET` (the program was not started by a service manager that wants to
/// hear from it) the notifier is disabled and every call returns at once, without allocating.
///
/// Any thread. A notification costs one `sendto(2)` that never blocks (a full receive queue is
/// reported as an error instead). The socket is made when the notifier is created, so a
/// process that later runs out of file descriptors can still notify.
public final class ServiceNotifier: Sendable {
    /// `$NOTIFY_SOCKET` as given (`/run/systemd/notify`, `@name`), or nil when disabled.
    public let address: String?
    private let sender: DatagramSender?

    /// The manager's datagrams are read into a buffer of this size; longer ones are dropped.
    static let messageLimit = 4_096

    /// A notifier that sends nothing: what `init(environment:)` returns without `$NOTIFY_SOCKET`.
    public static let disabled = ServiceNotifier(address: nil, sender: nil)

    private init(address: String?, sender: DatagramSender?) {
        self.address = address
        self.sender = sender
    }

    /// A notifier for `$NOTIFY_SOCKET` in `environment`, disabled when the variable is not set.
    /// The variable is left in place.
    ///
    /// - Throws: `ServiceEnvironmentError.invalidValue(variable:value:expected:)` when the
    ///   value is empty, neither an absolute path nor an `@` abstract name (a `vsock:` address,
    ///   say), or longer than a unix socket address can hold (107 bytes).
    public convenience init(environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ServiceEnvironmentError)
    {
        guard let value = environment["NOTIFY_SOCKET"] else {
            self.init(address: nil, sender: nil)
            return
        }
        try self.init(address: value)
    }

    /// A notifier for the unix datagram socket at `address`: an absolute path, or `@name` for
    /// the abstract namespace (`$NOTIFY_SOCKET`'s format).
    ///
    /// - Throws: `ServiceEnvironmentError.invalidValue(variable:value:expected:)` (naming
    ///   `NOTIFY_SOCKET`) for an address of another form or too long.
    public init(address: String) throws(ServiceEnvironmentError) {
        self.address = address
        self.sender = DatagramSender(pathBytes: try Self.socketPathBytes(address))
    }

    /// Whether notifications are sent anywhere.
    public var isEnabled: Bool { sender != nil }

    /// Sends `notifications` together, as one datagram (`READY=1\nSTATUS=…`; of two statuses,
    /// the last is sent). Does nothing when the notifier is disabled or `notifications` is
    /// empty. Any thread; never blocks.
    ///
    /// - Throws: `EventLoopError.system(function:errno:)` when the datagram cannot be sent:
    ///   `ECONNREFUSED` or `ENOENT` (nobody listens at the address), `EAGAIN` (the manager's
    ///   queue is full), `EMFILE` (no socket could be made). Nothing is retried.
    public func notify(_ notifications: ServiceNotification...) throws(EventLoopError) {
        try notify(notifications)
    }

    /// Sends `notifications` together, as one datagram. See
    /// ``notify(_:)-(ServiceNotification...)``.
    public func notify(_ notifications: [ServiceNotification]) throws(EventLoopError) {
        guard let sender, !notifications.isEmpty else { return }
        // Real time: systemd compares MONOTONIC_USEC (a reload's) with its own CLOCK_MONOTONIC.
        let message = Self.message(for: notifications, monotonicMicroseconds: monotonicNanoseconds() / 1_000)
        try sender.send(Array(message.utf8), function: "sendto NOTIFY_SOCKET=\(address ?? "")")
    }

    // MARK: The protocol

    /// The `sun_path` bytes for a `$NOTIFY_SOCKET` value.
    static func socketPathBytes(_ address: String) throws(ServiceEnvironmentError) -> [UInt8] {
        let expected = "an absolute path or an @abstract name of at most \(unixSocketPathCapacity - 1) bytes"
        let bytes = Array(address.utf8)
        if bytes.first == UInt8(ascii: "/"), bytes.count < unixSocketPathCapacity, !bytes.contains(0) {
            return bytes + [0]
        }
        if bytes.first == UInt8(ascii: "@"), bytes.count > 1, bytes.count <= unixSocketPathCapacity {
            return [0] + bytes.dropFirst()
        }
        throw .invalidValue(variable: "NOTIFY_SOCKET", value: address, expected: expected)
    }

    /// The datagram for `notifications`: one `KEY=value` line each.
    static func message(for notifications: [ServiceNotification], monotonicMicroseconds: UInt64) -> String {
        var lines: [String] = []
        var status: String?
        for notification in notifications {
            switch notification {
            case .ready: lines.append("READY=1")
            case .reloading:
                lines.append("RELOADING=1")
                lines.append("MONOTONIC_USEC=\(monotonicMicroseconds)")
            case .stopping: lines.append("STOPPING=1")
            case .watchdog: lines.append("WATCHDOG=1")
            case .status(let text): status = text
            }
        }
        guard let status else { return lines.joined(separator: "\n") }
        // The status goes last, cut to what is left of the limit (on a character boundary).
        let head = lines.isEmpty ? "" : lines.joined(separator: "\n") + "\n"
        let room = messageLimit - 1 - head.utf8.count - "STATUS=".utf8.count
        var text = String(status.map { $0 == "\n" || $0 == "\r" || $0 == "\r\n" || $0 == "\0" ? " " : $0 })
        if text.utf8.count > room {
            var cut = ""
            for character in text {
                if cut.utf8.count + character.utf8.count > room - "…".utf8.count { break }
                cut.append(character)
            }
            text = cut + "…"
        }
        return head + "STATUS=" + text
    }
}
