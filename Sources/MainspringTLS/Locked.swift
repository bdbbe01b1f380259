import Foundation

/// A value behind an `NSLock`. Not `Synchronization.Mutex`: ThreadSanitizer (`make sanitize`)
/// does not see `Mutex`'s futex as synchronisation and reports its value as raced.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<Result>(_ body: (inout Value) -> Result) -> Result {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}
