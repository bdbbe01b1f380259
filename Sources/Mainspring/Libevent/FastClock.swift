internal import CLibevent
import Foundation

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
        let ticks0 = ms_cycle_counter()
        let ns0 = monotonicNanoseconds()
        var ns1 = ns0
        while ns1 &- ns0 < 2_000_000 { ns1 = monotonicNanoseconds() }
        let ticks1 = ms_cycle_counter()
        guard ticks1 > ticks0 else {
            (baseTicks, baseNanoseconds, nanosecondsPerTick) = (0, 0, 0)
            return
        }
        baseTicks = ticks0
        baseNanoseconds = ns0
        nanosecondsPerTick = ((ns1 &- ns0) << 32) / (ticks1 &- ticks0)
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
        guard let source = try? String(contentsOfFile: path, encoding: .utf8) else { return false }
        return source.trimmingCharacters(in: .whitespacesAndNewlines) == "tsc" && ms_cycle_counter() != 0
        #elseif arch(arm64)
        return true
        #else
        return false
        #endif
    }
}
