/// Why a Mainspring call failed. Every case names what went wrong and where.
public enum EventLoopError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A loop-thread-only call was made from another thread. `function` is the call.
    case wrongThread(function: String)
    /// The file descriptor is not open (or not valid for this use).
    case badDescriptor(Int32)
    /// A libevent function failed; `function` is its C name, `errno` what the operating system
    /// reported for it (`EBADF` from `epoll_ctl`, `ENOMEM`, …), or 0 when libevent set none.
    case libevent(function: String, errno: Int32 = 0)
    /// A system call failed with `errno`.
    case system(function: String, errno: Int32)
    /// The signal is already watched on another loop; only one loop may own a signal.
    case signalInUse(signal: Int32)
    /// The loop was shut down and accepts no more sources.
    case loopClosed
    /// The task that waited was cancelled: the call ended at once and undid what it had
    /// started (see "Cancellation" in the documentation's "Handles, Cancellation and Closing").
    case cancelled
    /// A host that is neither an IPv4 or IPv6 literal nor a well-formed host name (empty, a
    /// space, a label longer than 63 bytes, …), or a Unix socket path that cannot be one.
    case invalidAddress(String)
    /// `host` did not resolve: the resolver's answer (`getaddrinfo`'s message: "Name or service
    /// not known" for a name that does not exist, "Temporary failure in name resolution" when
    /// no nameserver answered).
    case hostNotFound(host: String, reason: String)
    /// Resolving `host` took longer than `timeout` (`Connection.Options.resolveTimeout`, or the
    /// timeout given to `EventLoop.resolve(_:port:timeout:)`).
    case resolveTimedOut(host: String, timeout: Duration)
    /// Every address that `host` resolved to refused or failed: each address tried, with its
    /// connect's errno, in the order they were tried.
    case connectFailed(host: String, port: UInt16, attempts: [ConnectAttempt])
    /// A Unix socket listener's path is taken — by a live socket, or by a file that is not a
    /// socket — and was left alone; `reason` says which.
    case unixSocketPathInUse(path: String, reason: String)
    /// A descriptor given to ``Listener/init(_:on:group:options:accept:)`` (`.adopted`) (by socket
    /// activation, say) is not a listening stream socket; `reason` says what it is instead.
    case notListeningSocket(descriptor: Int32, reason: String)
    /// A descriptor given to ``Connection/adopting(descriptor:on:options:)`` is not a connected
    /// stream socket; `reason` says what it is instead.
    case notConnectedSocket(descriptor: Int32, reason: String)
    /// A TLS handshake failed: no longer thrown — a TLS connect throws
    /// ``TLSError/handshakeFailed(reason:)``, and `HTTPClient` reports it as
    /// `HTTPClientError.tlsFailed`.
    @available(*, deprecated, message: "a TLS connect throws TLSError.handshakeFailed")
    case tls(reason: String)
    /// A child process could not be started (the deprecated `Subprocess.spawn(_:on:)`; its
    /// successor `Subprocess.launch(_:on:)` throws ``SubprocessError/cannotStart(executable:path:errno:)``).
    @available(*, deprecated, message: "Subprocess.launch(_:on:) throws SubprocessError.cannotStart")
    case spawnFailed(executable: String, path: String, errno: Int32)
    /// A child process was not started: a text of its configuration holds a NUL byte (the
    /// deprecated `Subprocess.spawn(_:on:)`; its successor throws
    /// ``SubprocessError/nulInConfiguration(executable:field:)``).
    @available(*, deprecated, message: "Subprocess.launch(_:on:) throws SubprocessError.nulInConfiguration")
    case nulInSpawnConfiguration(executable: String, field: String)
    /// A path could not be watched (the deprecated `watchFile(at:_:)` and `fileEvents(at:)`;
    /// their successors throw ``FileWatchError/cannotWatch(path:errno:)``).
    @available(*, deprecated, message: "EventLoop.observeFile(at:_:) and fileChanges(at:) throw FileWatchError.cannotWatch")
    case watchFailed(path: String, errno: Int32)
    /// A closed datagram socket: no longer thrown — ``DatagramSocket`` throws
    /// ``DatagramError/closed``.
    @available(*, deprecated, message: "DatagramSocket throws DatagramError.closed")
    case socketClosed
    /// A datagram too large for UDP: no longer thrown — ``DatagramSocket`` throws
    /// ``DatagramError/tooLarge(size:limit:)``.
    @available(*, deprecated, message: "DatagramSocket throws DatagramError.tooLarge")
    case datagramTooLarge(size: Int, limit: Int?)
    /// A simulated loop (`MainspringTesting`) was asked for something real — a descriptor, a
    /// socket, a listener, a signal, a child process — or can never make progress (a deadlock).
    /// `refused` says what. Nothing real is mixed into a simulation silently.
    case simulatedLoop(refused: String)
    /// A listener or a datagram socket was asked to bind a host name: binding happens on the
    /// loop's thread, where resolving the name (`getaddrinfo`, which can take seconds) would
    /// stall every connection of the loop. Resolve it first, off the loop, with
    /// ``EventLoop/resolve(_:port:timeout:)``, and bind one of its addresses; literals and
    /// `"localhost"` bind directly.
    case bindNeedsAddress(host: String)

    /// The text of every case, the deprecated ones included (see `DescribesEveryCase`).
    public var description: String { caseDescription }

    /// The text of every case (`description`); deprecated so that it may name the deprecated
    /// cases, and exhaustive (no `default`) so that a new case cannot be forgotten.
    @available(*, deprecated, message: "use description")
    package var text: String {
        switch self {
        case .wrongThread(let function):
            return "\(function) must be called on the loop's own thread; use execute(_:) to get there"
        case .badDescriptor(let fd):
            return "file descriptor \(fd) is not open"
        case .libevent(let function, let code):
            return code == 0 ? "libevent call \(function) failed"
                : "libevent call \(function) failed: \(errnoDescription(code))"
        case .system(let function, let code):
            return "\(function) failed: \(errnoDescription(code))"
        case .signalInUse(let signal):
            return "signal \(signal) is already watched on another loop; a signal belongs to one loop at a time"
        case .loopClosed:
            return "the loop is shut down"
        case .cancelled:
            return "cancelled: the waiting task was cancelled"
        case .invalidAddress(let host):
            return "'\(host)' is not an IPv4 or IPv6 address, nor a host name"
        case .hostNotFound(let host, let reason):
            return "cannot resolve '\(host)': \(reason)"
        case .resolveTimedOut(let host, let timeout):
            return "resolving '\(host)' took longer than \(timeout)"
        case .connectFailed(let host, let port, let attempts):
            let tried = attempts.isEmpty ? "no address to try" : attempts.map(\.description).joined(separator: "; ")
            return "connect to \(host):\(port) failed: \(tried)"
        case .unixSocketPathInUse(let path, let reason):
            return "cannot listen on unix socket \(path): it exists and is \(reason)"
        case .notListeningSocket(let descriptor, let reason):
            return "descriptor \(descriptor) is not a listening stream socket: it is \(reason)"
        case .notConnectedSocket(let descriptor, let reason):
            return "descriptor \(descriptor) is not a connected stream socket: it is \(reason)"
        case .tls(let reason):
            return "TLS: \(reason)"
        case .socketClosed:
            return "the socket is closed"
        case .datagramTooLarge(let size, let limit):
            return DatagramError.tooLarge(size: size, limit: limit).description
        case .bindNeedsAddress(let host):
            return "cannot bind the host name '\(host)' on the loop's thread (resolving it would block the loop): "
                + "resolve it first with EventLoop.resolve(_:port:timeout:) and bind one of its addresses, "
                + "or bind an IPv4 or IPv6 address or \"localhost\""
        case .simulatedLoop(let refused):
            return "a simulated loop refuses \(refused); simulated loops run on virtual time with nothing real in them"
        case .spawnFailed(let executable, let path, let code):
            return SubprocessError.cannotStart(executable: executable, path: path, errno: code).description
        case .nulInSpawnConfiguration(let executable, let field):
            return SubprocessError.nulInConfiguration(executable: executable, field: field).description
        case .watchFailed(let path, let code):
            return FileWatchError.cannotWatch(path: path, errno: code).description
        }
    }
}

extension EventLoopError: DescribesEveryCase {}

extension String {
    /// The text with each NUL written as `\0`, for messages.
    func replacingNULs() -> String {
        utf8.contains(0) ? unicodeScalars.map { $0 == "\u{0}" ? "\\0" : String($0) }.joined() : self
    }
}

extension EventLoopError {
    /// One connect attempt of `EventLoopError.connectFailed`: the address tried and why it
    /// failed.
    public struct ConnectAttempt: Sendable, Equatable, CustomStringConvertible {
        /// The address tried, with its port ("[::1]:80", "127.0.0.1:80").
        public let address: String
        /// The connect's errno (`ECONNREFUSED`, `ENETUNREACH`, `ETIMEDOUT`, …).
        public let errno: Int32

        public init(address: String, errno: Int32) {
            self.address = address
            self.errno = errno
        }

        public var description: String { "\(address): \(errnoDescription(errno))" }
    }
}

#if canImport(Glibc)
import Glibc
#endif
