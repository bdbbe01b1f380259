internal import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

/// A cheap monotonic clock for the dispatcher's own bookkeeping: the poll deadline, busy time,
/// queue waits and starvation checks, read after every callback.
///
/// It scales the CPU cycle counter to nanoseconds (about 10 ns a read) when the kernel itself
/// trusts that counter (`current_clocksource` is `tsc`, or an AArch64 generic timer); otherwise
/// it reads `CLOCK_MONOTONIC`. The scale is calibrated once per process against
/// `CLOCK_MONOTONIC` over 2 ms. It is *not* slewed like `CLOCK_MONOTONIC`, so its readings are
/// only ever compared with each other: timers and spin timeouts use `monotonicNanoseconds()`.
struct FastClock: Sendable {
    private let baseTicks: UInt64
    private let baseNanoseconds: UInt64
    /// Nanoseconds per tick, as a 32.32 fixed-point number; 0 means "use CLOCK_MONOTONIC".
    private let nanosecondsPerTick: UInt64

    /// The process-wide calibration.
    static let shared = FastClock()

    private init() {
        guard Self.cycleCounterIsTrusted() else {
            (baseTicks, baseNanoseconds, nanosecondsPerTick) = (0, 0, 0)
            return
        }
        // Each end of the calibration is a (ticks, ns) pair read as close together as possible:
        // a preemption or VM exit between the two reads would skew the scale (a 10 µs hiccup
        // over 2 ms is 0.5%, enough to make a 1 ms budget run two 1 ms chunks).
        let (ticks0, ns0) = Self.closePair()
        while monotonicNanoseconds() &- ns0 < 2_000_000 {}
        let (ticks1, ns1) = Self.closePair()
        guard ticks1 > ticks0, ns1 > ns0 else {
            (baseTicks, baseNanoseconds, nanosecondsPerTick) = (0, 0, 0)
            return
        }
        baseTicks = ticks0
        baseNanoseconds = ns0
        nanosecondsPerTick = ((ns1 &- ns0) << 32) / (ticks1 &- ticks0)
    }

    /// A `CLOCK_MONOTONIC` reading and the cycle counter at the same instant: the counter read
    /// just before and just after, the tightest of eight tries, taken at its midpoint.
    private static func closePair() -> (ticks: UInt64, nanoseconds: UInt64) {
        var best: (width: UInt64, ticks: UInt64, nanoseconds: UInt64) = (.max, 0, 0)
        for _ in 0..<8 {
            let before = ms_cycle_counter()
            let nanoseconds = monotonicNanoseconds()
            let after = ms_cycle_counter()
            guard after >= before, after &- before < best.width else { continue }
            best = (after &- before, before &+ (after &- before) / 2, nanoseconds)
        }
        return (best.ticks, best.nanoseconds)
    }

    /// Now, in nanoseconds, on this clock's own scale.
    @inline(__always)
    func now() -> UInt64 {
        guard nanosecondsPerTick != 0 else { return monotonicNanoseconds() }
        let delta = ms_cycle_counter() &- baseTicks
        let (high, low) = delta.multipliedFullWidth(by: nanosecondsPerTick)
        return baseNanoseconds &+ (high << 32 | low >> 32)
    }

    /// Whether the cycle counter runs at a constant rate, in step on every CPU.
    private static func cycleCounterIsTrusted() -> Bool {
        #if arch(x86_64)
        let path = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
        // `try?`: no readable clocksource file (a container without /sys, say) just means the
        // cycle counter is not trusted and the monotonic clock is used instead.
        guard let source = try? String(contentsOfFile: path, encoding: .utf8) else { return false }
        return source.trimmingCharacters(in: .whitespacesAndNewlines) == "tsc" && ms_cycle_counter() != 0
        #elseif arch(arm64)
        return true
        #else
        return false
        #endif
    }
}
