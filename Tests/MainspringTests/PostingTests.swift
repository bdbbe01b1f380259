import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("Posting work with execute")
struct PostingTests {
    @Test("4 producer threads × 100,000 posts: each runs exactly once, in order per producer")
    func manyProducersExactlyOnceFIFO() async throws {
        let producers = 4
        let perProducer = 100_000
        let result = try await onLoopThread { loop -> [[Int]] in
            // Touched only on the loop's thread, inside posted closures.
            nonisolated(unsafe) var seen = [[Int]](repeating: [], count: producers)
            nonisolated(unsafe) var total = 0
            for p in 0..<producers {
                startThread {
                    for i in 0..<perProducer {
                        loop.execute {
                            seen[p].append(i)
                            total += 1
                        }
                    }
                }
            }
            let finished = loop.spin(until: { total == producers * perProducer }, timeout: .seconds(60))
            #expect(finished)
            // Nothing more arrives afterwards (no duplicates).
            loop.spin(until: { false }, timeout: .milliseconds(50))
            #expect(total == producers * perProducer)
            return seen
        }
        for (p, items) in result.enumerated() {
            #expect(items.count == perProducer, "producer \(p)")
            #expect(items == Array(0..<perProducer), "producer \(p) out of order")
        }
    }

    @Test("posts from the loop's own thread run in FIFO order, after the current callback")
    func localFIFO() async throws {
        let order = try await onLoopThread { loop -> [Int] in
            nonisolated(unsafe) var order: [Int] = []
            loop.execute {
                for i in 0..<1_000 { loop.execute { order.append(i) } }
                order.append(-1)  // the posting callback finishes first
            }
            loop.spin(until: { order.count == 1_001 }, timeout: .seconds(10))
            return order
        }
        #expect(order == [-1] + Array(0..<1_000))
    }

    @Test("ready work runs by priority: input, then normal, then background")
    func priorityOrder() async throws {
        let order = try await onLoopThread { loop -> [String] in
            nonisolated(unsafe) var order: [String] = []
            loop.execute {
                loop.execute(priority: .background) { order.append("background") }
                loop.execute(priority: .normal) { order.append("normal") }
                loop.execute(priority: .input) { order.append("input") }
            }
            loop.spin(until: { order.count == 3 }, timeout: .seconds(5))
            return order
        }
        #expect(order == ["input", "normal", "background"])
    }

    @Test("a loop that nobody runs yet takes posts from any thread and runs them on its runner")
    func unboundLoopRunsOnRunner() async throws {
        let loop = try EventLoop()
        let ranOn = Locked<[Bool]>([])
        for _ in 0..<10 { loop.execute { ranOn.withLock { $0.append(loop.isCurrent) } } }
        let done = startThread {
            loop.execute { loop.stop() }
            try? loop.run()
        }
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(ranOn.value == Array(repeating: true, count: 10))
        #expect(!loop.isCurrent)
    }

    @Test("a loop bound to one thread refuses run() from another, with a clear error")
    func wrongThreadRun() async throws {
        let loop = try await onLoopThread { loop in loop }
        #expect(throws: EventLoopError.wrongThread(function: "EventLoop.run()")) { try loop.run() }
        #expect(throws: EventLoopError.self) { _ = try loop.watch(0, for: .read) { _ in } }
        let message = EventLoopError.wrongThread(function: "EventLoop.run()").description
        #expect(message.contains("loop's own thread"))
    }

    @Test("EventLoop.current on a group's thread — in a callback, in a task preferring the loop — is that loop; none is made")
    func currentOnAGroupThreadIsItsLoop() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        #expect(try await loop.submit { EventLoop.current === loop && (try? EventLoop.forCurrentThread()) === loop })
        #expect(await Task(executorPreference: loop) { EventLoop.current === loop }.value)
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("in a task that runs on no loop, EventLoop.forCurrentThread() is an error and makes no loop")
    func currentInAPoolTaskIsAnError() async throws {
        // Twice on the same thread: a loop made by the first call would be returned by the second.
        let (outcome, again) = await Task.detached { () -> (Result<EventLoop, EventLoopError>, Result<EventLoop, EventLoopError>) in
            (Result { () throws(EventLoopError) in try EventLoop.forCurrentThread() },
             Result { () throws(EventLoopError) in try EventLoop.forCurrentThread() })
        }.value
        guard case .failure = again else {
            Issue.record("the second call found a loop: \(again)")
            return
        }
        guard case .failure(.wrongThread(let function)) = outcome else {
            Issue.record("expected wrongThread, got \(outcome)")
            return
        }
        #expect(function.contains("a task that runs on no loop"), "\(function)")
    }

    @Test("a task on a thread that was given a loop outside any task (as a Dispatch worker the pool shares) gets an error, not that idle loop")
    func aTaskOnAThreadWithAnIdleLoopGetsAnError() async throws {
        // The flake this pins down: a `SpinningOperation` on an `OperationQueue` binds a loop to
        // a Dispatch worker, and the cooperative pool later runs a task on that same thread.
        // Here the thread is one of our own, so it happens every time.
        let executor = OwnThreadTaskExecutor()
        let bound = await executor.runOutsideAnyTask { EventLoop.current }
        let (outcome, sameThread) = await Task(executorPreference: executor) {
            (Result { () throws(EventLoopError) in try EventLoop.forCurrentThread() }, executor.isCurrentThread)
        }.value
        #expect(sameThread, "the task ran on the executor's thread")
        guard case .failure(.wrongThread(let function)) = outcome else {
            Issue.record("expected wrongThread, got \(outcome) (the thread's loop is \(bound))")
            return
        }
        #expect(function.contains("a task that runs on no loop"), "\(function)")
        #expect(await executor.runOutsideAnyTask { EventLoop.current } === bound, "outside a task the thread keeps its loop")
        executor.stop()
    }

    @Test("EventLoop.current is one loop per thread, bound to it")
    func currentIsPerThread() async throws {
        // Return the loops themselves (not identifiers) so both stay alive while compared.
        let (a, boundToA) = try await onLoopThread { loop in (loop, loop.isCurrent && EventLoop.current === loop) }
        let b = try await onLoopThread { loop in loop }
        #expect(boundToA)
        #expect(a !== b)
        #expect(!a.isCurrent && !b.isCurrent)
    }
}

/// A task executor on one thread of its own, which also runs plain closures outside any task:
/// a stand-in for a Dispatch worker thread that Swift concurrency's pool shares.
private final class OwnThreadTaskExecutor: TaskExecutor, @unchecked Sendable {
    private enum Work: Sendable { case job(UnownedJob), closure(@Sendable () -> Void), stop }
    private let queue = Locked<[Work]>([])
    private let ready = DispatchSemaphore(value: 0)
    private let threadID = Locked<pthread_t?>(nil)

    init() {
        let thread = Thread { [self] in
            threadID.withLock { $0 = pthread_self() }
            while true {
                ready.wait()
                let work = queue.withLock { $0.removeFirst() }
                switch work {
                case .job(let job): job.runSynchronously(on: asUnownedTaskExecutor())
                case .closure(let body): body()
                case .stop: return
                }
            }
        }
        thread.start()
    }

    var isCurrentThread: Bool { threadID.withLock { $0.map { pthread_equal($0, pthread_self()) != 0 } ?? false } }

    func enqueue(_ job: UnownedJob) { push(.job(job)) }

    /// Runs `body` on the thread, outside any task, and returns its result.
    func runOutsideAnyTask<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            push(.closure { continuation.resume(returning: body()) })
        }
    }

    func stop() { push(.stop) }

    private func push(_ work: Work) {
        queue.withLock { $0.append(work) }
        ready.signal()
    }
}
