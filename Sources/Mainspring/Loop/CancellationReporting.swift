/// An error that may be the report of a cancelled task, in its own type.
///
/// Swift has one cancellation error, `CancellationError`, but a call with typed errors
/// (`throws(HTTPClientError)`) cannot throw it: its type must say "cancelled" itself. So each of
/// the library's typed error types has one case for it, `cancelled` — ``EventLoopError/cancelled``,
/// ``Connection/CloseReason/cancelled``, ``DatagramError/cancelled``, ``TLSError/cancelled``,
/// `HTTPClientError.cancelled`, `WebSocketError.cancelled` — and conforms to this protocol, so
/// that one question, ``Swift/Error/isCancellation``, recognizes a cancellation whatever
/// reported it (also where one error carries another: a send that a cancellation ended,
/// `HTTPClientError.sendFailed(.cancelled)`):
///
/// ```swift
/// do {
///     try await serve(connection)   // reads (CloseReason), requests (HTTPClientError), sleeps (CancellationError)
/// } catch where error.isCancellation {
///     return                        // stopped, as asked: not a failure
/// }
/// ```
///
/// Calls with untyped errors throw `CancellationError` itself (``EventLoop/sleep(for:)``,
/// `LoopClock`, `Listener.connections`), as the standard library's do. A type of your own may
/// conform, for the same question.
public protocol CancellationReportingError: Error {
    /// Whether this error reports that the waiting task was cancelled (the type's `cancelled`,
    /// or one it carries). Ask ``Swift/Error/isCancellation``, which answers for every error.
    var reportsCancellation: Bool { get }
}

extension Error {
    /// Whether this error reports that the waiting task was cancelled: a `CancellationError`,
    /// or a ``CancellationReportingError`` that says so (every typed error of the library with a
    /// `cancelled` case: ``EventLoopError``, ``Connection/CloseReason``, ``DatagramError``,
    /// ``TLSError``, `HTTPClientError`, `WebSocketError`). Free: a type check, no allocation.
    public var isCancellation: Bool {
        if self is CancellationError { return true }
        if let reporting = self as? any CancellationReportingError { return reporting.reportsCancellation }
        return false
    }
}

extension EventLoopError: CancellationReportingError {
    /// Whether this is ``cancelled``.
    public var reportsCancellation: Bool { self == .cancelled }
}

extension Connection.CloseReason: CancellationReportingError {
    /// Whether this is ``cancelled`` — a task reading or sending was cancelled (or `abort()`
    /// was called, or the loop shut down with the connection open) — or a connect that the
    /// cancellation ended.
    public var reportsCancellation: Bool {
        switch self {
        case .cancelled: return true
        case .connectFailed(let error): return error.reportsCancellation
        default: return false
        }
    }
}

extension DatagramError: CancellationReportingError {
    /// Whether this is ``cancelled`` (or the loop's own, ``loop(_:)`` carrying
    /// `EventLoopError.cancelled`).
    public var reportsCancellation: Bool {
        switch self {
        case .cancelled: return true
        case .loop(let error): return error.reportsCancellation
        default: return false
        }
    }
}

extension TLSError: CancellationReportingError {
    /// Whether this is ``cancelled`` (or a connect under TLS that the cancellation ended).
    public var reportsCancellation: Bool {
        switch self {
        case .cancelled: return true
        case .connect(let error): return error.reportsCancellation
        default: return false
        }
    }
}
