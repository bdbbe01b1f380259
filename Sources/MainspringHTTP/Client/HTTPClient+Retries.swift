import Foundation
import MainspringCore
import Synchronization

/// Retries: the policy's loop around one attempt (`sendFollowingRedirects`).
extension HTTPClient {
    /// Sends `request` (following redirects, and trying again as its retry policy says) and
    /// reads the final response's head.
    func send(_ request: HTTPClientRequest) async throws(HTTPClientError) -> (ResponseHead, any ResponseBody) {
        let deadline = RequestDeadline(timeout: request.timeout ?? configuration.requestTimeout, deadline: request.deadline,
                                       now: loop.clock.now)
        let policy = request.retryPolicy ?? configuration.retryPolicy ?? .none
        guard policy.maxRetries > 0 else { return try await sendFollowingRedirects(request, deadline: deadline) }
        retryBudget.deposit(now: loop.clock.now.nanoseconds)
        let idempotent = request.method.isIdempotent || policy.retriesNonIdempotentRequests
        var retries = 0
        while true {
            let failure: HTTPClientError
            do {
                let (head, reader) = try await sendFollowingRedirects(request, deadline: deadline)
                guard retries < policy.maxRetries, idempotent, policy.retryableStatuses.contains(head.status) else {
                    return (head, reader)
                }
                let asked = head.status == 503 || head.status == 429
                    ? retryAfter(head.headers["retry-after"], nowMilliseconds: loop.calendarMilliseconds()) : nil
                guard let wait = await retryWait(policy, retries: retries, atLeast: asked, deadline: deadline) else {
                    return (head, reader)
                }
                // The answer is dropped: its body read off (up to the limit) so that the
                // connection can serve the retry, or closed.
                do {
                    try await reader.discard(upTo: configuration.maxBodyBytes)
                } catch {
                    reader.abandon()
                }
                try await pause(wait)
            } catch let error {
                failure = error
                guard retries < policy.maxRetries, Self.mayRetry(failure, idempotent: idempotent),
                      let wait = await retryWait(policy, retries: retries, atLeast: nil, deadline: deadline)
                else { throw failure }
                try await pause(wait)
            }
            retries += 1
        }
    }

    /// Whether an attempt that failed with `error` may be made again: one that never left, any
    /// request; one that may have reached the server, an idempotent one.
    private static func mayRetry(_ error: HTTPClientError, idempotent: Bool) -> Bool {
        switch error {
        case .connectFailed, .connectTimeout, .unresolvedHost, .sendFailed: return true
        case .closedMidResponse, .responseTimeout: return idempotent
        default: return false
        }
    }

    /// The wait before the next retry (at least `atLeast`: a `Retry-After`), or nil when there
    /// is none to make: it would end past the request's deadline, or the budget is spent.
    private func retryWait(_ policy: RetryPolicy, retries: Int, atLeast: Duration?, deadline: RequestDeadline) async
        -> Duration?
    {
        let loop = self.loop
        // Drawn on the loop (a simulation's stream is the driving thread's). `submit` fails only
        // when the loop is gone: no jitter then — the pause that follows fails the request anyway.
        let random = loop.isCurrent ? loop.randomUnit() : ((try? await loop.submit { loop.randomUnit() }) ?? 0)
        var wait = policy.backoff(beforeRetry: retries + 1, random: random)
        if let atLeast { wait = max(wait, atLeast) }
        if let remaining = deadline.remaining(at: loop.clock.now), wait >= remaining { return nil }
        guard retryBudget.withdraw(now: loop.clock.now.nanoseconds) else { return nil }
        return wait
    }

    /// Waits `duration` on the loop's clock before a retry.
    private func pause(_ duration: Duration) async throws(HTTPClientError) {
        do {
            try await loop.sleep(for: duration)
        } catch {
            throw Task.isCancelled ? .cancelled : .clientClosed
        }
        if isShutDown { throw .clientClosed }
    }
}
