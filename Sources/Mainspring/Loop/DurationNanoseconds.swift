// Mainspring's one rule for the durations its API takes (the "Durations" article says it to
// users; every API that takes a duration names which kind it is):
//
// - A **wait** — a delay, a timeout, a grace period, how long something lasts (a step of a
//   timeline): negative counts as zero, which means "now" or "do not wait". Never a failure.
// - A **period** — how often something repeats, or how long a quiet spell lasts before the
//   library acts on it (a repeating timer's interval, an idle timeout, the poll interval, a
//   stall threshold): zero or negative has no meaning, so it stops the program with a message
//   naming the parameter (`requirePositive`). A repeating timer's interval is also raised to
//   `EventLoop.minimumRepeatInterval`, so that no timer can make its loop spin.
//
// The few documented clamps that remain (a Feeder budget of zero runs one chunk a turn; HTTP
// timeouts are at least a millisecond) are stated where they apply.

extension Duration {
    /// The duration in whole nanoseconds, clamped to `0...UInt64.max / 2`: negative durations
    /// become zero (the rule for waits), absurdly long ones a few centuries.
    package var clampedNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 || (seconds == 0 && attoseconds <= 0) { return 0 }
        if seconds >= Int64(UInt64.max / 2 / 1_000_000_000) { return UInt64.max / 2 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    /// A duration of `nanoseconds`.
    package init(nanoseconds: UInt64) {
        self = .nanoseconds(Int64(clamping: nanoseconds))
    }
}

/// The rule for periods: `duration` must be positive, or the program stops with a message that
/// names `parameter` (the call and the argument, as the caller wrote them) and the value.
/// Returns its nanoseconds (at least 1).
@inline(__always)
package func requirePositive(_ duration: Duration, _ parameter: @autoclosure () -> String,
                             file: StaticString = #fileID, line: UInt = #line) -> UInt64
{
    requireUsage(duration > .zero,
                 "Mainspring: \(parameter()) must be a positive duration, not \(duration) (zero or negative has no meaning for a period)",
                 file: file, line: line)
    return max(1, duration.clampedNanoseconds)
}

extension Duration {
    /// The duration in whole nanoseconds, signed, clamped to `Int64`'s range (for instants,
    /// which move both ways).
    var clampedSignedNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        return scaled.addingReportingOverflow(attoseconds / 1_000_000_000).overflow
            ? (seconds < 0 ? .min : .max) : scaled + attoseconds / 1_000_000_000
    }
}
