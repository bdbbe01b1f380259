/// The library's one carrier of a value that is not `Sendable` to the thread that may use it:
/// a loop-bound object (a source, a handler, a request), posted through `execute` or a
/// continuation to its own loop and used only there, or a value made on a loop for the task
/// that asked for it, whose own rules say where it may be used.
///
/// The compiler cannot check that rule — a loop's thread is not an actor's isolation — so this
/// is where `@unchecked Sendable` stands in for it, once, instead of a hand-written carrier per
/// type. Where the receiver alone uses the value, `sending` does the job without it, and where
/// threads share a value, `Protected` does.
package struct LoopBound<Value>: @unchecked Sendable {
    /// The value; use it only where its own rules allow (its loop's thread, most often).
    package let value: Value

    @inlinable @inline(__always)
    package init(_ value: Value) { self.value = value }
}

extension LoopBound where Value == () -> Void {
    /// Runs the carried closure (on the loop it was made for).
    @inlinable @inline(__always)
    package func run() { value() }
}

/// A weak reference, for a `LoopBound` that must not keep its object alive.
package struct WeakReference<Object: AnyObject> {
    package weak var object: Object?

    @inlinable
    package init(_ object: Object?) { self.object = object }
}
