import Foundation
import Synchronization
import MainspringTesting
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("Feeder and FeedJob")
struct FeederTests {
    @Test("enqueued chunks run once each, in FIFO order, on the loop's thread")
    func fifoOnLoopThread() async throws {
        let (order, onLoop) = try await onLoopThread { loop -> ([Int], Bool) in
            let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
            nonisolated(unsafe) var order: [Int] = []
            nonisolated(unsafe) var onLoop = true
            for i in 0..<500 {
                feeder.enqueue {
                    onLoop = onLoop && loop.isCurrent
                    order.append(i)
                }
            }
            loop.spin(until: { order.count == 500 }, timeout: .seconds(10))
            loop.spin(until: { false }, timeout: .milliseconds(20))  // nothing runs twice
            return (order, onLoop)
        }
        #expect(order == Array(0..<500))
        #expect(onLoop)
    }

    @Test("chunks run at the feeder's priority")
    func priority() async throws {
        let (background, input) = try await onLoopThread { loop -> ([String], [String]) in
            func order(_ priority: Priority) -> [String] {
                let feeder = Feeder(loop: loop, priority: priority)
                nonisolated(unsafe) var log: [String] = []
                loop.execute {
                    feeder.enqueue { log.append("fed") }
                    loop.execute(priority: .normal) { log.append("normal") }
                }
                loop.spin(until: { log.count == 2 }, timeout: .seconds(5))
                return log
            }
            let before = loop.metrics.callbacks[.background] ?? 0
            let background = order(.background)
            #expect((loop.metrics.callbacks[.background] ?? 0) > before)
            return (background, order(.input))
        }
        #expect(background == ["normal", "fed"])
        #expect(input == ["fed", "normal"])
    }

    @Test("jobs and chunks run one after the other in submission order")
    func jobsAndChunksInOrder() async throws {
        let log = try await onLoopThread { loop -> [String] in
            let feeder = Feeder(loop: loop, pacing: .budget(.milliseconds(1)))
            nonisolated(unsafe) var log: [String] = []
            feeder.enqueue { log.append("first") }
            let a = feeder.feed(chunks: 3) { log.append("a\($0)") }
            feeder.enqueue { log.append("middle") }
            let b = feeder.feed(["x", "y"]) { log.append("b\($0)") }
            feeder.enqueue { log.append("last") }
            loop.spin(until: { log.count == 8 && a.isFinished && b.isFinished }, timeout: .seconds(10))
            #expect(a.progress == FeedJob.Progress(completed: 3, total: 3))
            #expect(b.progress == FeedJob.Progress(completed: 2, total: 2))
            return log
        }
        #expect(log == ["first", "a0", "a1", "a2", "middle", "bx", "by", "last"])
    }

    @Test("8 threads × 5,000 enqueues: every chunk runs exactly once, FIFO per thread")
    func enqueueFromManyThreads() async throws {
        let threads = 8
        let perThread = 5_000
        let seen = try await onLoopThread { loop -> [[Int]] in
            let feeder = Feeder(loop: loop, pacing: .budget(.microseconds(500)))
            nonisolated(unsafe) var seen = [[Int]](repeating: [], count: threads)
            nonisolated(unsafe) var total = 0
            for t in 0..<threads {
                startThread {
                    for i in 0..<perThread {
                        feeder.enqueue {
                            seen[t].append(i)
                            total += 1
                        }
                    }
                }
            }
            let done = loop.spin(until: { total == threads * perThread }, timeout: .seconds(60))
            #expect(done)
            loop.spin(until: { false }, timeout: .milliseconds(30))
            #expect(total == threads * perThread)
            return seen
        }
        for (t, items) in seen.enumerated() {
            #expect(items == Array(0..<perThread), "thread \(t)")
        }
    }

    @Test("a job's outcome and completion handler: completed, with exact progress")
    func completion() async throws {
        let (outcome, handlerOutcome, progress, sum) = try await onLoopThread {
            loop -> (FeedOutcome?, FeedOutcome?, FeedJob.Progress, Int) in
            let feeder = Feeder(loop: loop)
            nonisolated(unsafe) var sum = 0
            nonisolated(unsafe) var handled: FeedOutcome?
            nonisolated(unsafe) var late: FeedOutcome?
            let job = feeder.feed(chunks: 10_000) { sum += $0 }
            job.onCompletion { handled = $0 }
            loop.spin(until: { handled != nil }, timeout: .seconds(10))
            // A handler added after the end still runs, later, on the loop.
            job.onCompletion { late = $0 }
            #expect(late == nil)
            loop.spin(until: { late != nil }, timeout: .seconds(5))
            #expect(late == .completed)
            return (handled, late, job.progress, sum)
        }
        #expect(outcome == .completed)
        #expect(handlerOutcome == .completed)
        #expect(progress.completed == 10_000 && progress.total == 10_000 && progress.fractionCompleted == 1)
        #expect(sum == (0..<10_000).reduce(0, +))
    }

    @Test("outcome can be awaited from a task while the loop runs on its thread")
    func awaitOutcome() async throws {
        let loop = try EventLoop()
        let jobBox = Locked<FeedJob?>(nil)
        let ready = DispatchSemaphore(value: 0)
        let done = startThread {
            let feeder = Feeder(loop: loop)
            jobBox.withLock { $0 = feeder.feed(chunks: 200) { _ in usleep(100) } }
            ready.signal()
            try? loop.run()
        }
        ready.wait()
        let job = try #require(jobBox.value)
        let outcome = await job.outcome
        #expect(outcome == .completed)
        #expect(job.progress.completed == 200)
        #expect(job.isFinished)
        loop.stop()
        #expect(done.wait(timeout: .now() + 5) == .success)
    }

    @Test("cancel mid-job: outcome .cancelled, exact progress, the remaining chunks never run")
    func cancelMidJob() async throws {
        let (ran, progress, outcome) = try await onLoopThread { loop -> ([Int], FeedJob.Progress, FeedOutcome?) in
            let feeder = Feeder(loop: loop, pacing: .budget(.milliseconds(1)))
            nonisolated(unsafe) var ran: [Int] = []
            nonisolated(unsafe) var outcome: FeedOutcome?
            nonisolated(unsafe) var job: FeedJob?
            job = feeder.feed(chunks: 1_000) { i in
                ran.append(i)
                if i == 436 { job?.cancel() }  // from inside a chunk: this one completes
            }
            job?.onCompletion { outcome = $0 }
            loop.spin(until: { outcome != nil }, timeout: .seconds(10))
            // Give the feeder every chance to (wrongly) run more.
            loop.spin(until: { false }, timeout: .milliseconds(30))
            return (ran, job!.progress, outcome)
        }
        #expect(outcome == .cancelled)
        #expect(ran == Array(0...436))
        #expect(progress == FeedJob.Progress(completed: 437, total: 1_000))
    }

    @Test("cancel from another thread while the job runs: no chunk starts after the job finished")
    func cancelFromOtherThread() async throws {
        let (ranAfterFinish, progress, ranCount, outcome) = try await onLoopThread {
            loop -> (Bool, Int, Int, FeedOutcome?) in
            let feeder = Feeder(loop: loop, pacing: .budget(.microseconds(200)))
            nonisolated(unsafe) var ranCount = 0
            nonisolated(unsafe) var finished = false
            nonisolated(unsafe) var ranAfterFinish = false
            nonisolated(unsafe) var outcome: FeedOutcome?
            let job = feeder.feed(chunks: 1_000_000) { _ in
                if finished { ranAfterFinish = true }
                ranCount += 1
                usleep(20)
            }
            job.onCompletion { outcome = $0; finished = true }
            startThread {
                while job.progress.completed < 100 { usleep(200) }
                job.cancel()
            }
            loop.spin(until: { finished }, timeout: .seconds(20))
            loop.spin(until: { false }, timeout: .milliseconds(30))
            return (ranAfterFinish, job.progress.completed, ranCount, outcome)
        }
        #expect(outcome == .cancelled)
        #expect(!ranAfterFinish)
        #expect(progress == ranCount)
        #expect(progress >= 100 && progress < 1_000_000)
    }

    @Test("pause and resume a job: it steps aside (the work behind it runs) and resumes in place")
    func pauseResumeJob() async throws {
        let log = try await onLoopThread { loop -> [String] in
            let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
            nonisolated(unsafe) var log: [String] = []
            nonisolated(unsafe) var job: FeedJob?
            job = feeder.feed(chunks: 6) { i in
                log.append("j\(i)")
                if i == 2 { job?.pause() }
            }
            feeder.enqueue { log.append("behind") }
            loop.spin(until: { log.count == 4 }, timeout: .seconds(5))
            #expect(job!.isPaused)
            // While paused, nothing of the job runs.
            loop.spin(until: { false }, timeout: .milliseconds(30))
            #expect(log == ["j0", "j1", "j2", "behind"])
            #expect(job!.progress.completed == 3)
            job!.resume()
            loop.spin(until: { job!.isFinished }, timeout: .seconds(5))
            return log
        }
        #expect(log == ["j0", "j1", "j2", "behind", "j3", "j4", "j5"])
    }

    @Test("pause and resume a feeder from another thread; a paused feeder runs nothing")
    func pauseResumeFeeder() async throws {
        let (countWhilePaused, countAfter, finalCount) = try await onLoopThread { loop -> (Int, Int, Int) in
            let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
            nonisolated(unsafe) var count = 0
            feeder.pause()
            #expect(feeder.isPaused)
            let job = feeder.feed(chunks: 50) { _ in count += 1 }
            feeder.enqueue { count += 1000 }
            loop.spin(until: { false }, timeout: .milliseconds(30))
            let whilePaused = count
            startThread { feeder.resume() }
            loop.spin(until: { job.isFinished && count == 1_050 }, timeout: .seconds(5))
            let after = count
            // Pause from inside a chunk: nothing after it runs until resumed.
            feeder.enqueue { feeder.pause() }
            feeder.enqueue { count += 1 }
            loop.spin(until: { false }, timeout: .milliseconds(30))
            #expect(count == 1_050)
            feeder.resume()
            loop.spin(until: { count == 1_051 }, timeout: .seconds(5))
            return (whilePaused, after, count)
        }
        #expect(countWhilePaused == 0)
        #expect(countAfter == 1_050)
        #expect(finalCount == 1_051)
    }

    @Test("a pause between turns (of the job or the feeder) is not counted as starvation")
    func pauseIsNotStarvation() async throws {
        let (jobPaused, feederPaused) = try await onLoopThread { loop -> (FeedJob.Statistics, FeedJob.Statistics) in
            /// Pauses after 5 of 20 chunks, from the loop between two turns (as an input handler
            /// would), for 600 ms; returns the job's statistics once it finished.
            func run(pausingFeeder: Bool) -> FeedJob.Statistics {
                let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
                let job = feeder.feed(chunks: 20) { _ in }
                loop.spin(until: { job.progress.completed >= 5 }, timeout: .seconds(5))
                if pausingFeeder { feeder.pause() } else { job.pause() }
                loop.spin(until: { false }, timeout: .milliseconds(600))
                if pausingFeeder { feeder.resume() } else { job.resume() }
                loop.spin(until: { job.isFinished }, timeout: .seconds(5))
                return job.statistics
            }
            return (run(pausingFeeder: false), run(pausingFeeder: true))
        }
        for statistics in [jobPaused, feederPaused] {
            #expect(statistics.chunks == 20)
            // The pause is in the wall-clock time, not in the longest gap (generous bound: a
            // loaded machine may delay a turn, but not by the 600 ms pause).
            #expect(statistics.elapsed >= .milliseconds(600))
            #expect(statistics.longestGap < .milliseconds(300), "longest gap \(statistics.longestGap)")
        }
    }

    @Test("cancelling a paused job finishes it at once; cancelAll drops queued work, later work runs")
    func cancelPausedAndCancelAll() async throws {
        let result = try await onLoopThread { loop -> (FeedOutcome?, FeedOutcome?, FeedOutcome?, [String]) in
            let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
            nonisolated(unsafe) var log: [String] = []
            nonisolated(unsafe) var outcomes: [String: FeedOutcome] = [:]
            let paused = feeder.feed(chunks: 5) { log.append("p\($0)") }
            paused.pause()
            paused.onCompletion { outcomes["paused"] = $0 }
            paused.cancel()
            loop.spin(until: { outcomes["paused"] != nil }, timeout: .seconds(5))

            feeder.pause()
            let a = feeder.feed(chunks: 5) { log.append("a\($0)") }
            a.onCompletion { outcomes["a"] = $0 }
            feeder.enqueue { log.append("dropped") }
            feeder.cancelAll()
            feeder.enqueue { log.append("after") }
            let b = feeder.feed(chunks: 2) { log.append("b\($0)") }
            b.onCompletion { outcomes["b"] = $0 }
            loop.spin(until: { outcomes["a"] != nil }, timeout: .seconds(5))
            #expect(log.isEmpty, "a paused feeder stays paused after cancelAll")
            feeder.resume()
            loop.spin(until: { outcomes["b"] != nil }, timeout: .seconds(5))
            return (outcomes["paused"], outcomes["a"], outcomes["b"], log)
        }
        #expect(result.0 == .cancelled)
        #expect(result.1 == .cancelled)
        #expect(result.2 == .completed)
        #expect(result.3 == ["after", "b0", "b1"])
    }

    @Test("cancelAll from another thread stops a running job after the chunk in progress")
    func cancelAllFromOtherThread() async throws {
        let (outcome, completed, ran) = try await onLoopThread { loop -> (FeedOutcome?, Int, Int) in
            let feeder = Feeder(loop: loop)
            nonisolated(unsafe) var ran = 0
            nonisolated(unsafe) var outcome: FeedOutcome?
            let job = feeder.feed(chunks: 10_000_000) { _ in ran += 1 }
            job.onCompletion { outcome = $0 }
            startThread {
                while job.progress.completed < 1_000 { usleep(100) }
                feeder.cancelAll()
            }
            loop.spin(until: { outcome != nil }, timeout: .seconds(20))
            return (outcome, job.progress.completed, ran)
        }
        #expect(outcome == .cancelled)
        #expect(completed == ran)
        #expect(ran >= 1_000 && ran < 10_000_000)
    }

    @Test("a sequence job: total known for collections, unknown otherwise; empty jobs complete")
    func sequenceJobs() async throws {
        let result = try await onLoopThread { loop -> ([Int], Int?, Int?, FeedOutcome?, FeedOutcome?) in
            let feeder = Feeder(loop: loop)
            nonisolated(unsafe) var seen: [Int] = []
            let lazy = feeder.feed(sequence(first: 1, next: { $0 < 64 ? $0 * 2 : nil })) { seen.append($0) }
            let array = feeder.feed([7, 8, 9]) { seen.append($0) }
            nonisolated(unsafe) var emptyOutcome: FeedOutcome?
            nonisolated(unsafe) var zeroOutcome: FeedOutcome?
            feeder.feed([Int]()) { _ in Issue.record("an empty job ran a chunk") }.onCompletion { emptyOutcome = $0 }
            feeder.feed(chunks: -3) { _ in Issue.record("a negative count ran a chunk") }.onCompletion { zeroOutcome = $0 }
            loop.spin(until: { zeroOutcome != nil }, timeout: .seconds(5))
            #expect(lazy.progress.completed == 7)
            #expect(array.progress.fractionCompleted == 1)
            return (seen, lazy.progress.total, array.progress.total, emptyOutcome, zeroOutcome)
        }
        #expect(result.0 == [1, 2, 4, 8, 16, 32, 64, 7, 8, 9])
        #expect(result.1 == nil)
        #expect(result.2 == 3)
        #expect(result.3 == .completed)
        #expect(result.4 == .completed)
    }

    @Test("each turn polls: a ready fd handler runs between two long chunks")
    func inputBetweenChunks() async throws {
        let log = try await onLoopThread { loop -> [String] in
            let feeder = Feeder(loop: loop, pacing: .oneChunkPerTurn)
            let pipe = TestPipe()
            nonisolated(unsafe) var log: [String] = []
            let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in
                var byte: UInt8 = 0
                _ = read(pipe.readEnd, &byte, 1)
                log.append("input")
            }
            let job = feeder.feed(chunks: 3) { i in
                log.append("chunk\(i)")
                if i == 0 { pipe.write("x") }  // ready before chunk 1 could start
            }
            loop.spin(until: { job.isFinished }, timeout: .seconds(5))
            watcher.cancel()
            return log
        }
        #expect(log == ["chunk0", "input", "chunk1", "chunk2"])
    }

    @Test("budget pacing runs as many chunks a turn as its budget holds; one-chunk pacing runs one")
    func pacingTurns() throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        // 10,000 chunks of 1 µs under a 5 ms budget: 5,000 a turn, two turns.
        let budget = Feeder(loop: loop, pacing: .budget(.milliseconds(5))).feed(chunks: 10_000) { _ in
            simulation.consume(.microseconds(1))
        }
        let one = Feeder(loop: loop, pacing: .oneChunkPerTurn).feed(chunks: 100) { _ in }
        simulation.runUntilIdle()
        #expect(budget.statistics.chunks == 10_000)
        #expect(budget.statistics.turns == 2)
        #expect(one.statistics.turns == 100)
    }

    @Test("a budget turn starts no chunk that the rest of the budget cannot hold: 1 ms chunks, 1 ms budget")
    func budgetDoesNotOverrun() throws {
        let simulation = try Simulation()
        let job = Feeder(loop: simulation.loop, pacing: .budget(.milliseconds(1))).feed(chunks: 50) { _ in
            simulation.consume(.milliseconds(1))
        }
        simulation.runUntilIdle()
        #expect(job.statistics.chunks == 50)
        #expect(job.statistics.turns == 50)
        #expect(job.statistics.elapsed == .milliseconds(50))
    }
}
