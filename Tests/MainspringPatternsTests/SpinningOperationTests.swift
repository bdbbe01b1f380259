import Foundation
import Observation
import Synchronization
import Testing
@testable import MainspringPatterns
import MainspringTestSupport
@testable import MainspringCore

/// `SpinningOperation`s, `QueueActivity` through Observation, and the README's and the
/// example's operations (the queue and its hooks are OperationTests.swift).
@Suite("Operations: SpinningOperation, QueueActivity, the README and the example", .serialized)
struct SpinningOperationTests {
    // MARK: SpinningOperation

    @Test("a SpinningOperation waiting 200 ms on a timer sleeps: under 10% CPU of that time")
    func spinningOperationSleeps() throws {
        final class Wait: SpinningOperation, @unchecked Sendable {
            let measured = Locked<(cpu: Duration, wall: Duration, onWorkerLoop: Bool)?>(nil)
            private var cpuStart = Duration.zero
            private var wallStart = ContinuousClock.now
            override func execute() {
                cpuStart = threadCPUTime()
                wallStart = ContinuousClock.now
                let loop = EventLoop.current
                let onWorkerLoop = loop.isCurrent && !Thread.isMainThread
                loop.schedule(after: .milliseconds(200)) {
                    let cpu = threadCPUTime() - self.cpuStart
                    self.measured.withLock { $0 = (cpu, ContinuousClock.now - self.wallStart, onWorkerLoop) }
                    self.finish()
                }
            }
        }
        let operation = Wait()
        let queue = OperationQueue()
        queue.addOperation(operation)
        let waited = startThread { queue.waitUntilAllOperationsAreFinished() }
        #expect(waited.wait(timeout: .now() + 20) == .success)
        let measured = try #require(operation.measured.value)
        #expect(measured.onWorkerLoop)
        #expect(measured.wall >= .milliseconds(200))
        #expect(measured.cpu < .milliseconds(20), "the worker thread used \(measured.cpu) while waiting \(measured.wall)")
        #expect(operation.isFinished)
    }

    @Test("a SpinningOperation reads lines and watches fds on its loop; finish() from another thread wakes it")
    func spinningOperationIO() throws {
        final class ReadLine: SpinningOperation, @unchecked Sendable {
            let fd: Int32
            let line = Locked<String?>(nil)
            private var reader: Watcher?
            init(fd: Int32) {
                self.fd = fd
                super.init()
            }
            override func execute() {
                reader = try? EventLoop.current.readLines(from: fd) { event in
                    if case .line(let text) = event {
                        self.line.withLock { $0 = text }
                        self.finish()
                    }
                }
            }
            override func willFinish() { reader?.cancel() }
        }
        final class Idle: SpinningOperation, @unchecked Sendable {
            let started = DispatchSemaphore(value: 0)
            let watched = Locked<Bool>(false)
            private var watcher: Watcher?
            let pipe = TestPipe()
            override func execute() {
                // A watcher for writability fires at once: the loop runs sources while it waits.
                watcher = try? EventLoop.current.watch(pipe.writeEnd, for: .write) { _ in
                    self.watched.withLock { $0 = true }
                    self.watcher?.cancel()
                    self.started.signal()
                }
            }
            override func willFinish() { watcher?.cancel() }
        }
        let input = TestPipe()
        let reader = ReadLine(fd: input.readEnd)
        let idle = Idle()
        let queue = OperationQueue()
        queue.addOperations([reader, idle], waitUntilFinished: false)
        startThread {
            usleep(20_000)
            input.write("hello\n")
        }
        // Required: finish() on an operation the queue has not started would trap.
        try #require(idle.started.wait(timeout: .now() + 30) == .success, "the idle operation started")
        #expect(!idle.isFinished)
        idle.finish()  // from this thread, not the worker's
        let waited = startThread { queue.waitUntilAllOperationsAreFinished() }
        #expect(waited.wait(timeout: .now() + 20) == .success)
        #expect(reader.line.value == "hello")
        #expect(idle.watched.value)
        #expect(reader.isFinished && idle.isFinished)
    }

    @Test("cancelling a SpinningOperation ends its spin promptly and finishes it")
    func spinningOperationCancel() throws {
        final class Long: SpinningOperation, @unchecked Sendable {
            let started = DispatchSemaphore(value: 0)
            let teardown = Locked<(cancelled: Bool, sameThread: Bool)?>(nil)
            private var timer: TimerHandle?
            private var worker: Thread?
            override func execute() {
                worker = Thread.current
                timer = EventLoop.current.schedule(after: .seconds(30)) { self.finish() }
                started.signal()
            }
            override func willFinish() {
                timer?.cancel()
                teardown.withLock { $0 = (isCancelled, Thread.current === worker) }
            }
        }
        let operation = Long()
        let queue = OperationQueue()
        queue.addOperation(operation)
        try #require(operation.started.wait(timeout: .now() + 30) == .success, "the queue started the operation")
        let start = ContinuousClock.now
        operation.cancel()
        let waited = startThread { operation.waitUntilFinished() }
        #expect(waited.wait(timeout: .now() + 10) == .success)
        #expect(ContinuousClock.now - start < .seconds(5))
        #expect(operation.isFinished && operation.isCancelled)
        let teardown = try #require(operation.teardown.value)
        #expect(teardown.cancelled)
        #expect(teardown.sameThread, "willFinish ran on the worker thread")
    }

    // MARK: Observation

    @Test("QueueActivity reports count and drains through Observation, on its loop")
    func observation() async throws {
        let results = try await onLoopThread { loop -> [String] in
            let queue = TrackedOperationQueue()
            let gate = DispatchSemaphore(value: 0)
            let activity = QueueActivity(of: queue, on: loop)
            nonisolated(unsafe) var changes = 0
            nonisolated(unsafe) var changesOnLoop = true
            func observe() {
                withObservationTracking {
                    _ = activity.operationCount
                    _ = activity.drainCount
                } onChange: {
                    // Called in willSet, on the thread that changes the model: the loop's.
                    changesOnLoop = changesOnLoop && loop.isCurrent
                    changes += 1
                }
            }
            var results: [String] = []
            func record() {
                results.append("count=\(activity.operationCount) drained=\(activity.isDrained) drains=\(activity.drainCount)")
            }
            record()
            observe()
            let operations = (0..<10).map { _ in
                TestOperation { operation in
                    DispatchQueue.global().async {
                        gate.wait()
                        operation.finish()
                    }
                }
            }
            queue.addTrackedOperations(operations)
            #expect(loop.spin(until: { changes == 1 }, timeout: .seconds(10)))
            record()  // The gate holds every operation: the count is exactly 10.
            observe()
            for _ in operations { gate.signal() }
            #expect(loop.spin(until: { changes == 2 }, timeout: .seconds(10)))
            #expect(loop.spin(until: { activity.drainCount == 1 }, timeout: .seconds(10)))
            record()
            results.append("finished=\(activity.finishedCount) changesOnLoop=\(changesOnLoop)")
            return results
        }
        #expect(results == [
            "count=0 drained=true drains=0",
            "count=10 drained=false drains=0",
            "count=0 drained=true drains=1",
            "finished=10 changesOnLoop=true",
        ])
    }

    // MARK: The README and the example

    @Test("the README's operations snippet runs (on a background loop instead of the main one)")
    func readmeSnippet() async throws {
        /// Stands in for the README's `store`: the callback comes on `loop` a moment later.
        struct Store: Sendable {
            let loop: EventLoop
            func save(_ id: Int, _ completion: @escaping @Sendable (Bool) -> Void) {
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(id % 5)) {
                    loop.execute { completion(true) }
                }
            }
        }
        let (printed, spinningWaitWorked) = try await onLoopThread { loop -> ([String], Bool) in
            let store = Store(loop: loop)
            let printed = Locked<[String]>([])
            @Sendable func print(_ text: String) { printed.withLock { $0.append(text) } }

            final class Save: AsyncOperation, @unchecked Sendable {
                let id: Int
                let store: Store
                init(id: Int, store: Store) {
                    self.id = id
                    self.store = store
                }
                override func execute() {
                    store.save(id) { _ in self.finish() }
                }
            }
            let queue = TrackedOperationQueue()
            queue.onDrained(on: loop) { print("all saved"); loop.stop() }
            queue.addOperations((1...20).map { Save(id: $0, store: store) }, waitUntilFinished: false)
            try loop.run()

            // The snippet's alternative to run(): a queue of its own, so the hook above (which
            // would fire again and stop the loop) stays out of it.
            let other = TrackedOperationQueue()
            other.addOperations((21...40).map { Save(id: $0, store: store) }, waitUntilFinished: false)
            let waited = other.waitUntilAllOperationsAreFinished(spinning: loop, timeout: .seconds(20))
            return (printed.value, waited)
        }
        #expect(printed == ["all saved"])
        #expect(spinningWaitWorked)
    }

    @Test("the mainspring-operations example runs its two batches and exits 0")
    func example() async throws {
        let result = try await runExecutable("mainspring-operations", arguments: ["15"])
        let text = result.stdout
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(text.contains("batch 1 (onDrained): 15 saves, 12 succeeded, 3 failed"), "output:\n\(text)")
        #expect(text.contains("batch 2 (waitUntilAllOperationsAreFinished(spinning:)): 15 saves, 12 succeeded, 3 failed"))
        #expect(text.contains("record 7 saved (callback on the main thread: true)"))
        #expect(text.contains("record 10 failed: rejected (empty record)"))
    }
}
