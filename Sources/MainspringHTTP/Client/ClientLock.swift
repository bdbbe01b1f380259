import Foundation

/// A value behind an `NSLock`, for the client's shared state. Not `Synchronization.Mutex`:
/// ThreadSanitizer (`make sanitize`) does not see `Mutex`'s futex as synchronisation and reports
/// the protected value as raced.
final class ClientLock<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure) -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
