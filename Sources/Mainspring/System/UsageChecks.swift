/// Checks a rule of the API's use (the right thread, one consumer, one start, a positive
/// interval) and stops the process with `message` when it is broken.
///
/// Unlike `precondition`, whose message optimised (`-O`) builds drop, the message reaches
/// stderr in every build configuration: a caller who breaks a rule in a release build learns
/// which rule. The check itself costs one branch; the message is built only on failure.
@inline(__always)
package func requireUsage(
    _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
    file: StaticString = #fileID, line: UInt = #line
) {
    if !condition() { usageFailure(message(), file: file, line: line) }
}

/// Stops the process with `message` (printed in every build configuration) for a misuse of
/// the API that has no way back. See `requireUsage(_:_:file:line:)`.
@inline(never)
package func usageFailure(_ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) -> Never {
    fatalError(message(), file: file, line: line)
}
