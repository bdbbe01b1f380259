import Foundation
import MainspringCore

extension HTTPClient {
    /// When and how a failed request is tried again (``Configuration/retryPolicy``, or a
    /// request's own ``HTTPClientRequest/retryPolicy``). Off unless given.
    ///
    /// A request is tried again when its attempt
    /// - never left: the connect was refused or failed, timed out, or the connection was reset
    ///   before any byte of the response came on a request that sends no body — whatever its
    ///   method;
    /// - or failed after it was sent (the connection closed mid-response, the response timeout)
    ///   or was answered with one of ``retryableStatuses`` (502, 503, 504) — only for an
    ///   idempotent method (`GET`, `HEAD`, `PUT`, `DELETE`, `OPTIONS`, `TRACE`) unless
    ///   ``retriesNonIdempotentRequests`` says otherwise.
    ///
    /// Between attempts it waits an exponential backoff with jitter — ``initialBackoff`` times
    /// ``multiplier`` to the power of the retries so far, at most ``maxBackoff``, of which a
    /// random part (``jitter``) is left out — on the client's loop's clock: virtual time in a
    /// simulation, where the jitter is drawn from the simulation's seed, so that a replay waits
    /// the same. A `503` or `429` with `Retry-After` (seconds, or an HTTP date) waits at least
    /// that long. No wait runs past the request's deadline (``Configuration/requestTimeout``):
    /// when the next attempt could not start before it, the last failure (or response) is what
    /// the request gets. The client's ``RetryBudget`` caps how many retries it makes in all, so
    /// that an upstream in trouble does not get its load multiplied.
    public struct RetryPolicy: Sendable, Equatable {
        /// Attempts after the first, at most (0: none).
        public var maxRetries: Int
        /// The wait before the first retry (before its jitter).
        public var initialBackoff: Duration
        /// Each retry's wait is the last one's times this.
        public var multiplier: Double
        /// The longest wait between attempts (before its jitter).
        public var maxBackoff: Duration
        /// How much of each wait is random, 0...1: 1 (the default, "full jitter") waits anywhere
        /// between zero and the backoff, 0 exactly the backoff. Spreads the retries of many
        /// clients that failed together.
        public var jitter: Double
        /// The statuses whose response is tried again (for idempotent requests): 502, 503, 504
        /// by default. The last attempt's response is returned as it is.
        public var retryableStatuses: Set<Int>
        /// Whether a `POST` or `PATCH` that may have reached the server is tried again (false:
        /// only when it never left).
        public var retriesNonIdempotentRequests: Bool

        /// A policy; the defaults: 2 retries, 50 ms doubling up to 2 s, full jitter.
        public init(maxRetries: Int = 2, initialBackoff: Duration = .milliseconds(50), multiplier: Double = 2,
                    maxBackoff: Duration = .seconds(2), jitter: Double = 1,
                    retryableStatuses: Set<Int> = [502, 503, 504], retriesNonIdempotentRequests: Bool = false)
        {
            requireUsage(maxRetries >= 0, "HTTPClient.RetryPolicy: maxRetries must be at least 0, not \(maxRetries)")
            requireUsage(multiplier >= 1 && multiplier.isFinite, "HTTPClient.RetryPolicy: multiplier must be at least 1, not \(multiplier)")
            requireUsage((0...1).contains(jitter), "HTTPClient.RetryPolicy: jitter must be within 0...1, not \(jitter)")
            self.maxRetries = maxRetries
            self.initialBackoff = max(initialBackoff, .zero)
            self.multiplier = multiplier
            self.maxBackoff = max(maxBackoff, .zero)
            self.jitter = jitter
            self.retryableStatuses = retryableStatuses
            self.retriesNonIdempotentRequests = retriesNonIdempotentRequests
        }

        /// No retries (a request's way to opt out of its client's policy).
        public static let none = RetryPolicy(maxRetries: 0)

        /// The wait before retry number `retry` (1 for the first), `random` in `0..<1` drawing
        /// its jitter.
        func backoff(beforeRetry retry: Int, random: Double) -> Duration {
            let base = initialBackoff.seconds * pow(multiplier, Double(max(0, retry - 1)))
            let capped = min(base, maxBackoff.seconds)
            let waited = capped * (1 - jitter * random)
            return .nanoseconds(Int64(clamping: UInt64((waited * 1e9).rounded(.down))))
        }
    }

    /// How many retries the client makes in all: a fraction of its requests, plus a few a
    /// second whatever the traffic (Finagle's retry budget). Each request earns ``ratio`` of a
    /// retry, what was earned fades over ``window``, and each retry spends one; when nothing is
    /// left, a failure is returned as it is rather than tried again. So when an upstream fails
    /// everything, the client sends it at most `1 + ratio` times its requests, not
    /// `1 + maxRetries` times. Kept on the client's loop's clock.
    public struct RetryBudget: Sendable, Equatable {
        /// Retries earned per request (0.2: one retry for every five requests).
        public var ratio: Double
        /// Retries allowed each second even without requests to earn them (a quiet client can
        /// still retry); at most one second's worth is saved up.
        public var minimumPerSecond: Double
        /// How long what requests earned lasts (it fades exponentially with this time constant).
        public var window: Duration

        /// A budget; the defaults: 20% of requests, 10 a second, over 10 s.
        public init(ratio: Double = 0.2, minimumPerSecond: Double = 10, window: Duration = .seconds(10)) {
            requireUsage(ratio >= 0 && ratio.isFinite, "HTTPClient.RetryBudget: ratio must be at least 0, not \(ratio)")
            requireUsage(minimumPerSecond >= 0 && minimumPerSecond.isFinite,
                         "HTTPClient.RetryBudget: minimumPerSecond must be at least 0, not \(minimumPerSecond)")
            requireUsage(window > .zero, "HTTPClient.RetryBudget: window must be positive, not \(window)")
            self.ratio = ratio
            self.minimumPerSecond = minimumPerSecond
            self.window = window
        }

        /// No limit: every retry the policy allows is made.
        public static let unlimited = RetryBudget(ratio: .infinity.nextDown, minimumPerSecond: 0)
    }
}

/// A client's retry budget as it runs: what requests earned (fading) and the per-second reserve.
final class RetryBudgetState: Sendable {
    private struct Balance {
        var earned = 0.0
        var reserve: Double
        var at: UInt64?
    }

    let budget: HTTPClient.RetryBudget
    private let balance: Protected<Balance>

    init(_ budget: HTTPClient.RetryBudget) {
        self.budget = budget
        balance = Protected(Balance(reserve: budget.minimumPerSecond))
    }

    /// Brings the balance to `now` (loop ns): what was earned fades, the reserve refills.
    private func age(_ balance: inout Balance, to now: UInt64) {
        if let at = balance.at, now > at {
            let seconds = Double(now - at) / 1e9
            balance.earned *= exp(-seconds / budget.window.seconds)
            balance.reserve = min(budget.minimumPerSecond, balance.reserve + seconds * budget.minimumPerSecond)
        }
        balance.at = now
    }

    /// A request was made (not a retry): it earns its share.
    func deposit(now: UInt64) {
        balance.withLock { balance in
            age(&balance, to: now)
            balance.earned = min(balance.earned + budget.ratio, Double(Int.max))
        }
    }

    /// Takes one retry from the budget; false when there is none.
    func withdraw(now: UInt64) -> Bool {
        balance.withLock { balance in
            age(&balance, to: now)
            // (A hair under one counts: ten requests at 0.1 earn 0.9999999999999999.)
            if balance.earned >= 1 - 1e-9 {
                balance.earned = max(0, balance.earned - 1)
                return true
            }
            if balance.reserve >= 1 {
                balance.reserve -= 1
                return true
            }
            return false
        }
    }
}

/// `Retry-After`: delay-seconds, or an HTTP date (RFC 9110 §10.2.3) measured from `nowMilliseconds`
/// (the loop's calendar); nil when absent or unreadable.
func retryAfter(_ value: String?, nowMilliseconds: Int64) -> Duration? {
    guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
    if value.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) {
        guard let seconds = Int64(value) else { return .seconds(Int64.max / 1_000_000_000) }
        return .seconds(seconds)
    }
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "GMT")
    formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
    guard let date = formatter.date(from: value) else { return nil }
    let milliseconds = Int64(date.timeIntervalSince1970 * 1_000) - nowMilliseconds
    return .milliseconds(max(0, milliseconds))
}
