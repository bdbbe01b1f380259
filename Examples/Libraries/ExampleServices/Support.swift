import Foundation
import Mainspring

/// A value behind an `NSLock` (a pthread mutex, which ThreadSanitizer understands).
public final class Guarded<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    public init(_ value: Value) { self.value = value }

    public func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

/// A value only ever touched on one loop's thread, carried across threads.
final class UncheckedBox<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension EventLoop {
    /// Runs `body` on this loop and waits for its result. Call it from another thread (it would
    /// deadlock on the loop's own thread, so there it just runs `body`).
    func runAndWait<T>(_ body: @escaping () throws -> T) throws -> T {
        if isCurrent { return try body() }
        let result = Guarded<Result<UncheckedBox<T>, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let work = UncheckedBox(body)
        execute {
            let outcome = Result { UncheckedBox(try work.value()) }
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        return try result.withLock { $0! }.get().value
    }
}
