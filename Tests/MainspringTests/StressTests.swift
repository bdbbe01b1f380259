import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// Sizes are multiplied by 100 when the environment has `STRESS=1` (`make stress`).
let stressScale = ProcessInfo.processInfo.environment["STRESS"] == "1" ? 100 : 1

@Suite("Stress", .serialized)
struct StressTests {
    @Test("8 producers × random priorities: every item exactly once, FIFO per producer per priority")
    func producersRandomPriorities() async throws {
        let producers = 8
        let perProducer = 20_000 * stressScale
        let (seen, total) = try await onLoopThread { loop -> ([[[Int]]], Int) in
            // seen[producer][priority] = sequence numbers in the order they ran.
            nonisolated(unsafe) var seen = [[[Int]]](repeating: [[], [], []], count: producers)
            nonisolated(unsafe) var total = 0
            for p in 0..<producers {
                startThread {
                    var generator = SystemRandomNumberGenerator()
                    for i in 0..<perProducer {
                        let priority = Priority.allCases.randomElement(using: &generator)!
                        loop.execute(priority: priority) {
                            seen[p][priority.queueIndex].append(i)
                            total += 1
                        }
                    }
                }
            }
            loop.spin(until: { total == producers * perProducer }, timeout: .seconds(120))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            return (seen, total)
        }
        #expect(total == producers * perProducer)
        for p in 0..<producers {
            let all = seen[p].flatMap { $0 }
            #expect(all.count == perProducer, "producer \(p)")
            #expect(Set(all).count == perProducer, "producer \(p): duplicates")
            for lane in seen[p] { #expect(lane == lane.sorted(), "producer \(p): out of order within a priority") }
        }
    }

    @Test("100,000 timers created and cancelled at random, some from other timers' handlers")
    func timersCreatedAndCancelled() async throws {
        let count = 100_000 * min(stressScale, 10)
        let (firedAfterCancel, lost, fired, cancelled) = try await onLoopThread { loop -> (Int, Int, Int, Int) in
            var generator = SystemRandomNumberGenerator()
            nonisolated(unsafe) var state = [UInt8](repeating: 0, count: count)  // 0 armed, 1 fired, 2 cancelled
            nonisolated(unsafe) var firedAfterCancel = 0
            nonisolated(unsafe) var handles: [TimerHandle?] = Array(repeating: nil, count: count)
            nonisolated(unsafe) var settled = 0
            for i in 0..<count {
                let delay = Duration.microseconds(Int64.random(in: 0...20_000, using: &generator))
                handles[i] = loop.schedule(after: delay) {
                    if state[i] == 2 { firedAfterCancel += 1; return }
                    state[i] = 1
                    settled += 1
                    // Sometimes cancel another random timer from inside this handler.
                    let victim = Int.random(in: 0..<count)
                    if state[victim] == 0, Bool.random() {
                        handles[victim]?.cancel()
                        state[victim] = 2
                        settled += 1
                    }
                }
                // And cancel about a third straight away.
                if Int.random(in: 0..<3, using: &generator) == 0 {
                    handles[i]?.cancel()
                    state[i] = 2
                    settled += 1
                }
            }
            loop.spin(until: { settled == count }, timeout: .seconds(60))
            loop.spin(until: { false }, timeout: .milliseconds(30))
            let lost = state.filter { $0 == 0 }.count
            return (firedAfterCancel, lost, state.filter { $0 == 1 }.count, state.filter { $0 == 2 }.count)
        }
        #expect(firedAfterCancel == 0)
        #expect(lost == 0)
        #expect(fired + cancelled == count)
        #expect(fired > 0 && cancelled > 0)
    }

    @Test("watchers cancelled while their events are ready never run")
    func watchersCancelledWhileReady() async throws {
        let rounds = 200 * stressScale
        let ranAfterCancel = try await onLoopThread { loop -> Int in
            nonisolated(unsafe) var ranAfterCancel = 0
            for _ in 0..<rounds {
                let pipes = (0..<8).map { _ in TestPipe() }
                for pipe in pipes { pipe.write("x") }  // all ready in the same poll
                nonisolated(unsafe) var watchers: [Watcher] = []
                nonisolated(unsafe) var cancelled = Set<Int>()
                nonisolated(unsafe) var handled = 0
                for (index, pipe) in pipes.enumerated() {
                    watchers.append(try loop.watch(pipe.readEnd, for: .read) { _ in
                        if cancelled.contains(index) { ranAfterCancel += 1 }
                        handled += 1
                        // The first handler to run cancels every other watcher.
                        for (other, watcher) in watchers.enumerated() where other != index {
                            watcher.cancel()
                            cancelled.insert(other)
                        }
                        watchers[index].cancel()
                        cancelled.insert(index)
                    })
                }
                loop.spin(until: { handled > 0 }, timeout: .seconds(5))
                loop.runOnce(blocking: false)
                #expect(handled == 1)
                // The pipes must stay open until the watchers are done: a release build may
                // otherwise free them (and close their fds) right after their last use above.
                withExtendedLifetime(pipes) {}
            }
            return ranAfterCancel
        }
        #expect(ranAfterCancel == 0)
    }

    @Test("loops created and destroyed 10,000 times")
    func loopsCreatedAndDestroyed() async throws {
        let count = 10_000 * max(1, stressScale / 10)
        let failures = try await onLoopThread { _ -> Int in
            var failures = 0
            for i in 0..<count {
                do {
                    let loop = try EventLoop()
                    loop.execute {}
                    if i % 2 == 0 { loop.runOnce(blocking: false) }
                } catch {
                    failures += 1
                }
            }
            return failures
        }
        #expect(failures == 0)
    }

    @Test("stop() during a posting flood: every item ran or was counted as dropped")
    func stopDuringFlood() async throws {
        let producers = 4
        let perProducer = 50_000 * stressScale / 10
        let ran = Locked<Int>(0)
        let loopBox = Locked<EventLoop?>(nil)
        let postingDone = (0..<producers).map { _ in DispatchSemaphore(value: 0) }
        let ready = DispatchSemaphore(value: 0)
        let loopThread = startThread {
            let loop = EventLoop.current
            loopBox.withLock { $0 = loop }
            ready.signal()
            // Run until stopped mid-flood; the thread then exits, which shuts the loop down.
            try? loop.run()
            for done in postingDone { done.wait() }
        }
        ready.wait()
        let loop = loopBox.value!
        for p in 0..<producers {
            startThread {
                for _ in 0..<perProducer { loop.execute { ran.withLock { $0 += 1 } } }
                postingDone[p].signal()
            }
        }
        usleep(5_000)
        loop.stop()
        loopThread.wait()
        // The loop is shut down by its thread's exit, just after the body returned.
        let deadline = ContinuousClock.now + .seconds(10)
        while !loop.isOrphaned && ContinuousClock.now < deadline { usleep(1_000) }
        #expect(loop.isOrphaned)
        let metrics = loop.metrics
        #expect(ran.value + metrics.droppedAtShutdown == producers * perProducer,
                "ran \(ran.value), dropped \(metrics.droppedAtShutdown)")
    }

    @Test("EventLoopGroup.shutdown during a posting flood: every item ran or was counted as dropped")
    func groupShutdownDuringFlood() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let perProducer = 50_000 * stressScale / 10
        let ran = Locked<Int>(0)
        let producers = (0..<4).map { _ in
            startThread {
                for _ in 0..<perProducer { group.next().execute { ran.withLock { $0 += 1 } } }
            }
        }
        usleep(5_000)
        let report = await group.shutdown(gracePeriod: .zero)
        for producer in producers { producer.wait() }
        let dropped = group.loops.map(\.metrics.droppedAtShutdown).reduce(0, +)
        #expect(ran.value + dropped == 4 * perProducer, "ran \(ran.value), dropped \(dropped), report \(report)")
        #expect(report.droppedWork <= dropped)
    }
}
