import Foundation

/// Host name resolution without blocking a loop: `getaddrinfo` on a few threads of its own
/// (see docs/ARCHITECTURE.md, "Names"), an answer posted back to the asking loop, and a
/// deadline kept on the loop, so that a resolver that never answers costs the caller its
/// timeout, not more.
enum HostResolver {
    /// Resolver threads at most. A lookup waiting for a slow nameserver holds one; lookups past
    /// this many wait in line (the deadline still runs).
    static let maxThreads = 8
    /// A thread with nothing to do for this long ends.
    static let idleSeconds = 10.0
    /// How much nicer than the thread that starts them resolver threads run. A lookup mostly
    /// waits on the network; when it does compute (`/etc/hosts`, nsswitch, parsing answers) on
    /// busy cores, the loops, whose input waits behind it, go first.
    static let niceIncrement: Int32 = 5

    /// Makes the calling (resolver) thread `niceIncrement` nicer: on Linux the nice value
    /// belongs to a thread, and `nice(2)` changes the caller's only. Best effort: a failure
    /// leaves it as it is.
    private static func lowerThreadPriority() {
        _ = nice(niceIncrement)
    }

    private struct Job {
        let host: String
        let port: UInt16
        let deliver: @Sendable (Result<[SocketAddress], EventLoopError>) -> Void
    }

    private final class Pool: @unchecked Sendable {
        // Only touched under `condition`.
        var jobs: [Job] = []
        var first = 0
        var threads = 0
        var idle = 0
        let condition = NSCondition()
    }

    private static let pool = Pool()

    /// Test seam: hosts whose lookup runs this closure (on a resolver thread) instead of
    /// getaddrinfo, so a test controls the address list, or stalls.
    static let overrides = Protected<[String: @Sendable (String, UInt16) -> Result<[SocketAddress], EventLoopError>]>([:])

    /// Looks `host` up on a resolver thread and calls `deliver` there with the answer.
    static func lookUp(_ host: String, port: UInt16,
                       _ deliver: @escaping @Sendable (Result<[SocketAddress], EventLoopError>) -> Void)
    {
        let pool = pool
        pool.condition.lock()
        pool.jobs.append(Job(host: host, port: port, deliver: deliver))
        let start = pool.idle == 0 && pool.threads < maxThreads
        if start { pool.threads += 1 }
        pool.condition.signal()
        pool.condition.unlock()
        if start {
            let thread = Thread { work(pool) }
            thread.name = "mainspring.resolver"
            thread.start()
        }
    }

    private static func work(_ pool: Pool) {
        lowerThreadPriority()
        while true {
            pool.condition.lock()
            while pool.first == pool.jobs.count {
                pool.idle += 1
                let woken = pool.condition.wait(until: Date(timeIntervalSinceNow: idleSeconds))
                pool.idle -= 1
                if !woken && pool.first == pool.jobs.count {
                    pool.threads -= 1
                    pool.condition.unlock()
                    return
                }
            }
            let job = pool.jobs[pool.first]
            pool.first += 1
            if pool.first == pool.jobs.count {
                pool.jobs.removeAll(keepingCapacity: pool.jobs.count <= 64)
                pool.first = 0
            }
            pool.condition.unlock()
            let hook = overrides.withLock { $0[job.host] }
            job.deliver(hook?(job.host, job.port) ?? lookUpAddresses(job.host, port: job.port))
        }
    }
}

extension EventLoop {
    /// Resolves `host` (a name, or an IP literal, which is returned as it is) for `port`: its
    /// IPv4 and IPv6 addresses, in the system's order of preference (RFC 6724).
    ///
    /// Uses the system's resolver (`getaddrinfo`: /etc/hosts, nsswitch.conf, resolv.conf, as
    /// every other program on the machine) on a resolver thread of Mainspring's — never on a
    /// loop. The wait suspends the caller only; a resolver that does not answer within
    /// `timeout` ends the call with `.resolveTimedOut` (the lookup itself finishes on its
    /// thread, and its answer is dropped). Cancelling the task ends the wait at once with
    /// `.cancelled` (the lookup's answer is dropped likewise). Any task; costs a post to a
    /// resolver thread and one back to this loop.
    /// - Throws: `EventLoopError.hostNotFound` (the name does not exist, or no nameserver
    ///   answered), `.resolveTimedOut`, `.invalidAddress` (not a well-formed name),
    ///   `.cancelled`, `.loopClosed`.
    public func resolve(_ host: String, port: UInt16 = 0, timeout: Duration = .seconds(10)) async
        throws(EventLoopError) -> [SocketAddress]
    {
        let loop = self
        // Resumed once: by the answer, the deadline, the task's cancellation, or — when the loop
        // is freed before the answer comes back — the loop's end.
        let result: Result<[SocketAddress], EventLoopError> = await waitCancellably { once in
            loop.resolveAddresses(host, port: port, timeout: timeout) { once.resume(with: .success($0)) }
        }
        return try result.get()
    }

    /// The loop-side resolve: `done` runs once on this loop's thread, at `.input` priority, with
    /// the addresses or the error (at once, within this call, for a literal or a malformed host).
    /// Loop thread only.
    func resolveAddresses(_ host: String, port: UInt16, timeout: Duration,
                          _ done: @escaping (Result<[SocketAddress], EventLoopError>) -> Void)
    {
        preconditionOnLoop("EventLoop.resolve(_:port:timeout:)")
        if let literal = numericAddress(host, port: port) {
            done(.success([literal]))
            return
        }
        guard isPlausibleHostName(host) else {
            done(.failure(.invalidAddress(host)))
            return
        }
        _ = requirePositive(timeout, "EventLoop.resolve's timeout")
        world.resolve(host, port: port, timeout: timeout, on: self, done)
    }

    /// A name's lookup by the system's resolver (`getaddrinfo` on a resolver thread), within
    /// `timeout`; `done` on this loop's thread.
    func resolveWithSystem(_ host: String, port: UInt16, timeout: Duration,
                           _ done: @escaping (Result<[SocketAddress], EventLoopError>) -> Void)
    {
        let pending = PendingResolve(done)
        pending.timer = schedule(after: timeout) {
            pending.finish(.failure(.resolveTimedOut(host: host, timeout: timeout)))
        }
        let unchecked = LoopBound(pending)
        let loop = self
        HostResolver.lookUp(host, port: port) { result in
            // Dropped, not run, when the loop is gone: nobody waits on a dead loop.
            loop.execute(priority: .input) { unchecked.value.finish(result) }
        }
    }
}

/// A resolve the loop waits for: the first of the answer and the deadline wins. Loop thread only.
private final class PendingResolve {
    var done: ((Result<[SocketAddress], EventLoopError>) -> Void)?
    var timer: TimerHandle?
    init(_ done: @escaping (Result<[SocketAddress], EventLoopError>) -> Void) { self.done = done }

    func finish(_ result: Result<[SocketAddress], EventLoopError>) {
        guard let done else { return }
        self.done = nil
        timer?.cancel()
        timer = nil
        done(result)
    }
}
