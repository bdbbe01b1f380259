#if canImport(Glibc)
import Glibc
#endif
@_spi(MainspringHTTP) import MainspringCore

/// The value of a response's `Date` header field (`Sun, 06 Nov 1994 08:49:37 GMT`, the
/// IMF-fixdate of RFC 9110), formatted once per second instead of once per response.
///
/// One per loop (not thread-safe). Costs the loop's calendar reading (`time()`, the vDSO: no
/// system call; a simulated loop's virtual date) and a comparison per response; formatting once
/// a second.
struct HTTPDateCache {
    private var second: time_t = -1
    private var text = ""

    /// The date of `loop`'s current second (`EventLoop.calendarSeconds()`).
    mutating func current(on loop: EventLoop) -> String {
        let now = time_t(loop.calendarSeconds())
        if now != second {
            second = now
            text = Self.format(now)
        }
        return text
    }

    private static let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// `seconds` since the epoch as an IMF-fixdate.
    static func format(_ seconds: time_t) -> String {
        var time = seconds
        var parts = tm()
        gmtime_r(&time, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let day = days[Int(parts.tm_wday) % 7], month = months[Int(parts.tm_mon) % 12]
        return "\(day), \(two(parts.tm_mday)) \(month) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}
