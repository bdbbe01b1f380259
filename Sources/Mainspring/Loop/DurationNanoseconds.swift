extension Duration {
    /// The duration in whole nanoseconds, clamped to `0...UInt64.max / 2`: negative durations
    /// become zero (Mainspring's rule for bad durations), absurdly long ones a few centuries.
    var clampedNanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        if seconds < 0 || (seconds == 0 && attoseconds <= 0) { return 0 }
        if seconds >= Int64(UInt64.max / 2 / 1_000_000_000) { return UInt64.max / 2 }
        return UInt64(seconds) * 1_000_000_000 + UInt64(attoseconds / 1_000_000_000)
    }

    /// A duration of `nanoseconds`.
    init(nanoseconds: UInt64) {
        self = .nanoseconds(Int64(clamping: nanoseconds))
    }
}
