import Synchronization

/// A connection's options, its close reasons and the input its byte readers get.
extension Connection {
    /// Limits and timeouts of a connection.
    ///
    /// Checked when a listener or an outgoing connection is made with them: a `maxLineLength` or
    /// `outputLimit` below 1, or an `idleTimeout` that is zero or negative (a period, see
    /// <doc:Durations>), stops the program with a message naming it. `closeTimeout` is a wait:
    /// negative counts as zero (close without waiting for the output).
    public struct Options: Sendable, Equatable {
        /// The longest line `readLines` delivers; longer ones are reported as `.tooLong`.
        public var maxLineLength: Int
        /// Buffered output above which reading pauses until half of it has drained.
        public var outputLimit: Int
        /// Closes the connection (reason `.idleTimeout`) after this long without input; nil: never.
        public var idleTimeout: Duration?
        /// How long `close()` waits for buffered output to drain before closing anyway.
        public var closeTimeout: Duration
        /// Connects by name only: how long resolving the name may take before the connect fails
        /// with `EventLoopError.resolveTimedOut` (default 10 s).
        public var resolveTimeout: Duration
        /// Connects by name only: how long an attempt runs unanswered before the next address is
        /// tried beside it (RFC 8305's Connection Attempt Delay; default 250 ms).
        public var connectionAttemptDelay: Duration

        /// Stops the program when an option breaks the rules above; `function` is the call.
        func check(_ function: StaticString) {
            requireUsage(maxLineLength > 0, "Mainspring: \(function): Connection.Options.maxLineLength must be at least 1, not \(maxLineLength)")
            requireUsage(outputLimit > 0, "Mainspring: \(function): Connection.Options.outputLimit must be at least 1, not \(outputLimit)")
            if let idleTimeout { _ = requirePositive(idleTimeout, "\(function): Connection.Options.idleTimeout") }
            _ = requirePositive(resolveTimeout, "\(function): Connection.Options.resolveTimeout")
            _ = requirePositive(connectionAttemptDelay, "\(function): Connection.Options.connectionAttemptDelay")
        }

        /// Options with the documented defaults: 64 KiB lines, 1 MiB output, no idle timeout,
        /// 10 s to flush on close, 10 s to resolve a name, 250 ms between connection attempts.
        public init(maxLineLength: Int = 65_536, outputLimit: Int = 1 << 20, idleTimeout: Duration? = nil,
                    closeTimeout: Duration = .seconds(10), resolveTimeout: Duration = .seconds(10),
                    connectionAttemptDelay: Duration = .milliseconds(250))
        {
            self.maxLineLength = maxLineLength
            self.outputLimit = outputLimit
            self.idleTimeout = idleTimeout
            self.closeTimeout = closeTimeout
            self.resolveTimeout = resolveTimeout
            self.connectionAttemptDelay = connectionAttemptDelay
        }
    }

    /// Why a connection closed. Delivered once, to `onClose`; returned by `await closed`; and
    /// thrown by the async operations that the close interrupted. Every case is a close: the
    /// connection is closed when one is reported. (Two deprecated cases are never reported:
    /// `tls(_:)`, now ``tlsFailed(_:)``, and `invalidCount(_:)`, now a usage error.)
    public enum CloseReason: Error, Sendable, Equatable, CustomStringConvertible {
        /// `close()` was called (and the output was sent, or `closeTimeout` passed), or the last
        /// handle went away.
        case closed
        /// No input arrived for `Options.idleTimeout`.
        case idleTimeout
        /// The socket failed (`ECONNRESET`, `ECONNREFUSED`, …).
        case error(Int32)
        /// A task reading or sending was cancelled — the connection then closes as `close()`
        /// closes it: what was queued before is still sent, within `closeTimeout` — or
        /// `abort()` was called, or the loop shut down with the connection still open
        /// (`EventLoopGroup.shutdown` after its grace period): those two close at once, output
        /// not yet sent dropped.
        case cancelled
        /// The connection's TLS layer failed (`MainspringTLS`): a record that did not decrypt, an
        /// alert from the peer — ``TLSError/protocolError(reason:)`` with OpenSSL's account. A
        /// TLS peer that goes away is not this: as over plain TCP, a socket that ends (with or
        /// without close_notify) is the end of the input, and one that fails (a reset) is
        /// `.error(errno)`. (Boxed, as ``connectFailed(_:)`` is.)
        indirect case tlsFailed(TLSError)
        /// No longer reported: a connection whose TLS fails closes with ``tlsFailed(_:)``,
        /// carrying the one TLS error, ``TLSError``.
        @available(*, deprecated, message: "a TLS failure closes with tlsFailed(TLSError.protocolError(reason:))")
        case tls(String)
        /// A connect by name failed before the connection was established: the name did not
        /// resolve (`EventLoopError.hostNotFound`, `.resolveTimedOut`), or every address refused
        /// (`.connectFailed`, naming each). A connect to a literal address reports `.error(errno)`.
        /// (Boxed: it keeps `CloseReason` the size of a `String`, which every async read and
        /// send carries in its frame as the error it may throw.)
        indirect case connectFailed(EventLoopError)
        /// No longer reported (it was not a close): `read(exactly:)` with a negative count is a
        /// usage error, as `prefix(_:)` with one is — check a length taken from the input first.
        @available(*, deprecated, message: "read(exactly:) requires a count of at least 0; check a length from the input before reading")
        case invalidCount(Int)

        /// The text of every case, the deprecated ones included (see `DescribesEveryCase`).
        public var description: String { caseDescription }

        /// The text of every case (`description`); deprecated so that it may name the deprecated
        /// cases, and exhaustive (no `default`) so that a new case cannot be forgotten.
        @available(*, deprecated, message: "use description")
        package var text: String {
            switch self {
            case .closed: return "closed"
            case .idleTimeout: return "idle timeout"
            case .error(let code): return "error \(code) (\(errnoName(code)))"
            case .cancelled: return "cancelled"
            case .tlsFailed(let error): return error.description
            case .tls(let reason): return "TLS: \(reason)"
            case .connectFailed(let error):
                // An error of the connect itself says "connect to host:port failed" already.
                if case .connectFailed = error { return error.description }
                return "connect failed: \(error)"
            case .invalidCount(let count): return "cannot read \(count) bytes: a count is at least 0"
            }
        }
    }

    /// Bytes read from the peer, for `readBytes`.
    public enum Input: Sendable, Equatable {
        /// The next bytes from the peer, at most 64 KiB at a time.
        case bytes([UInt8])
        /// The peer closed its side of the connection; reported once, after the last bytes.
        case endOfFile
    }
}

extension Connection.CloseReason: DescribesEveryCase {}
