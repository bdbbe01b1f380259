import Foundation
import Synchronization
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// How many times `countingHandler` ran, per signal number (a plain C signal handler: what a
/// program or a library installed before Mainspring watched the signal).
private let handlerCalls = (0..<65).map { _ in CallCounter() }

private final class CallCounter: Sendable {
    let count = Atomic<Int>(0)
}

private func calls(_ signal: Int32) -> Int { handlerCalls[Int(signal)].count.load(ordering: .acquiring) }

/// Installs a C handler for `signal` that counts its calls; returns a function that puts the
/// disposition it replaced back.
private func installCountingHandler(_ signal: Int32) -> () -> Void {
    _ = calls(signal)  // initialise the counters before a handler can touch them
    var action = sigaction()
    action.__sigaction_handler.sa_handler = { signal in
        handlerCalls[Int(signal)].count.add(1, ordering: .releasing)
    }
    sigemptyset(&action.sa_mask)
    var previous = sigaction()
    precondition(sigaction(signal, &action, &previous) == 0, "sigaction failed")
    return {
        var previous = previous
        sigaction(signal, &previous, nil)
    }
}

@Suite("Signals", .serialized)
struct SignalTests {
    @Test("raise(SIGUSR1) reaches onSignal on the loop's thread; cancel restores the default")
    func raiseReachesHandler() async throws {
        let (count, onLoop) = try await onLoopThread { loop -> (Int, Bool) in
            nonisolated(unsafe) var count = 0
            nonisolated(unsafe) var onLoop = true
            let watcher = try loop.onSignal(SIGUSR1) {
                count += 1
                onLoop = onLoop && loop.isCurrent
            }
            raise(SIGUSR1)
            loop.spin(until: { count == 1 }, timeout: .seconds(5))
            raise(SIGUSR1)
            loop.spin(until: { count == 2 }, timeout: .seconds(5))
            watcher.cancel()
            return (count, onLoop)
        }
        #expect(count == 2)
        #expect(onLoop)
    }

    @Test("two loops cannot both watch one signal; the error says so")
    func ownership() async throws {
        let first = Locked<Bool>(false)
        let release = DispatchSemaphore(value: 0)
        let registered = DispatchSemaphore(value: 0)
        let holder = startThread {
            let loop = EventLoop.current
            let watcher = try? loop.onSignal(SIGUSR2) {}
            first.withLock { $0 = watcher != nil }
            registered.signal()
            release.wait()
            watcher?.cancel()
        }
        registered.wait()
        #expect(first.value)
        try await onLoopThread { loop in
            #expect(throws: EventLoopError.signalInUse(signal: SIGUSR2)) { _ = try loop.onSignal(SIGUSR2) {} }
            // Another signal is fine on this loop.
            let other = try loop.onSignal(SIGWINCH) {}
            other.cancel()
        }
        release.signal()
        holder.wait()
        // Once released, another loop may take it.
        try await onLoopThread { loop in
            let watcher = try loop.onSignal(SIGUSR2) {}
            watcher.cancel()
        }
        #expect(EventLoopError.signalInUse(signal: SIGUSR2).description.contains("another loop"))
    }

    @Test("signals that cannot be caught are a thrown error")
    func uncatchable() async throws {
        try await onLoopThread { loop in
            #expect(throws: EventLoopError.self) { _ = try loop.onSignal(SIGKILL) {} }
            #expect(throws: EventLoopError.self) { _ = try loop.onSignal(999) {} }
        }
    }

    // MARK: The previous disposition is back when cancel() returns

    @Test("a signal raised right after the last watcher's cancel() reaches the previous handler, every round")
    func cancelRestoresPreviousHandlerAtOnce() async throws {
        let restore = installCountingHandler(SIGUSR1)
        defer { restore() }
        let (missed, watched) = try await onLoopThread { loop -> (Int, Int) in
            var missed = 0
            nonisolated(unsafe) var watched = 0
            for _ in 0..<300 {
                let watcher = try loop.onSignal(SIGUSR1) { watched += 1 }
                let before = calls(SIGUSR1)
                watcher.cancel()
                // raise() runs the handler on this thread before it returns.
                raise(SIGUSR1)
                if calls(SIGUSR1) != before + 1 { missed += 1 }
            }
            // Whatever a missed signal did, it is not the watcher's to see after cancel().
            loop.spin(until: { false }, timeout: .milliseconds(50))
            return (missed, watched)
        }
        #expect(missed == 0, "\(missed) of 300 signals raised after cancel() never reached the previous handler")
        #expect(watched == 0)
    }

    @Test("a signal that arrives while the last watcher is being cancelled reaches the previous handler")
    func signalDuringCancelIsForwarded() async throws {
        let restore = installCountingHandler(SIGUSR1)
        defer {
            SignalRegistry.beforeRestore = nil
            restore()
        }
        // Raised at the worst moment: the watcher is unregistered, Mainspring's handler still
        // installed — half the rounds on the cancelling thread itself, half from another thread
        // (waited for), so the catch lands in the handler with nobody to deliver it to.
        nonisolated(unsafe) var fromAnotherThread = false
        SignalRegistry.beforeRestore = { signal in
            if fromAnotherThread {
                let done = DispatchSemaphore(value: 0)
                Thread {
                    unblockSignalInCurrentThread(signal)
                    raise(signal)
                    done.signal()
                }.start()
                done.wait()
            } else {
                raise(signal)
            }
        }
        let (missed, watched) = try await onLoopThread { loop -> (Int, Int) in
            var missed = 0
            nonisolated(unsafe) var watched = 0
            for round in 0..<100 {
                fromAnotherThread = round % 2 == 1
                let watcher = try loop.onSignal(SIGUSR1) { watched += 1 }
                let before = calls(SIGUSR1)
                watcher.cancel()
                if calls(SIGUSR1) != before + 1 { missed += 1 }
            }
            loop.spin(until: { false }, timeout: .milliseconds(50))
            return (missed, watched)
        }
        #expect(missed == 0, "\(missed) of 100 signals caught during cancel() never reached the previous handler")
        #expect(watched == 0)
    }

    @Test("watching and cancelling wait for no other thread: no signal thread exists, 1,000 rounds are quick")
    func noRoundTrip() async throws {
        let restore = installCountingHandler(SIGUSR2)
        defer { restore() }
        let elapsed = try await onLoopThread { loop -> Duration in
            let start = ContinuousClock.now
            for _ in 0..<1_000 { try loop.onSignal(SIGUSR2) {}.cancel() }
            return ContinuousClock.now - start
        }
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        let threads = names.compactMap { try? String(contentsOfFile: "/proc/self/task/\($0)/comm", encoding: .utf8) }
        #expect(!threads.contains { $0.hasPrefix("mainspring.sig") }, "\(threads)")
        #expect(elapsed < .seconds(5), "1,000 watch/cancel rounds took \(elapsed)")
    }

    @Test("two signals caught while the loop is busy are handled in the order they came, not by number")
    func orderAcrossSignals() async throws {
        let restore = [installCountingHandler(SIGUSR1), installCountingHandler(SIGUSR2)]
        defer { restore.forEach { $0() } }
        let wrong = try await onLoopThread { loop -> Int in
            nonisolated(unsafe) var order: [Int32] = []
            let first = try loop.onSignal(SIGUSR1) { order.append(SIGUSR1) }
            let second = try loop.onSignal(SIGUSR2) { order.append(SIGUSR2) }
            var wrong = 0
            for round in 0..<50 {
                order = []
                let (early, late) = round % 2 == 0 ? (SIGUSR2, SIGUSR1) : (SIGUSR1, SIGUSR2)
                // Both are caught while the loop is busy, so its next poll sees both at once.
                loop.execute {
                    raise(early)
                    raise(late)
                }
                loop.spin(until: { order.count == 2 }, timeout: .seconds(10))
                if order != [early, late] { wrong += 1 }
            }
            first.cancel()
            second.cancel()
            return wrong
        }
        #expect(wrong == 0, "\(wrong) of 50 pairs handled out of order")
    }

    @Test("SIGTERM raised right after its watcher's cancel() ends the process (the default action is back)")
    func sigtermDefaultIsBack() async throws {
        for round in 0..<10 {
            let result = try await runFixture("signal-default", timeout: .seconds(30))
            #expect(result.crashedBySignal && result.status == SIGTERM && !result.timedOut,
                    "round \(round): \(result.summary)")
        }
    }

    @Test("a watcher that cancels itself in its handler restores the previous handler before cancel() returns")
    func cancelFromOwnHandler() async throws {
        let restore = installCountingHandler(SIGUSR1)
        defer { restore() }
        let (missed, watched) = try await onLoopThread { loop -> (Int, Int) in
            nonisolated(unsafe) var missed = 0
            nonisolated(unsafe) var watched = 0
            for _ in 0..<100 {
                nonisolated(unsafe) var watcher: Watcher?
                watcher = try loop.onSignal(SIGUSR1) {
                    watched += 1
                    let before = calls(SIGUSR1)
                    watcher?.cancel()
                    raise(SIGUSR1)
                    if calls(SIGUSR1) != before + 1 { missed += 1 }
                }
                let target = watched + 1
                raise(SIGUSR1)
                if !loop.spin(until: { watched == target }, timeout: .seconds(10)) { break }
                #expect(watcher?.isCancelled == true)
            }
            return (missed, watched)
        }
        #expect(watched == 100)
        #expect(missed == 0, "\(missed) signals raised after a cancel() from the handler were lost")
    }

    @Test("a signal raised inside its own handler is delivered again after the handler returns")
    func raiseInsideOwnHandler() async throws {
        let restore = installCountingHandler(SIGUSR1)
        defer { restore() }
        let (runs, previousCalls) = try await onLoopThread { loop -> (Int, Int) in
            let before = calls(SIGUSR1)
            nonisolated(unsafe) var runs = 0
            let watcher = try loop.onSignal(SIGUSR1) {
                runs += 1
                if runs == 1 { raise(SIGUSR1) }
            }
            raise(SIGUSR1)
            loop.spin(until: { runs == 2 }, timeout: .seconds(10))
            // No third run: the second raise was delivered once.
            loop.spin(until: { runs > 2 }, timeout: .milliseconds(100))
            watcher.cancel()
            return (runs, calls(SIGUSR1) - before)
        }
        #expect(runs == 2)
        #expect(previousCalls == 0, "the previous handler saw a signal while a watcher existed")
    }

    @Test("signals on several loops: each last cancel() restores its signal's previous handler at once")
    func severalLoopsCancelConcurrently() async throws {
        let signals = [SIGUSR1, SIGUSR2, SIGWINCH, SIGURG]
        let restores = signals.map { installCountingHandler($0) }
        defer { for restore in restores { restore() } }
        let missed = Locked<[Int32: Int]>([:])
        let threads = signals.map { signal in
            startThread {
                let loop = EventLoop.current
                for _ in 0..<100 {
                    guard let watcher = try? loop.onSignal(signal, {}) else {
                        missed.withLock { $0[signal, default: 0] += 1000 }
                        return
                    }
                    let before = calls(signal)
                    watcher.cancel()
                    raise(signal)
                    if calls(signal) != before + 1 { missed.withLock { $0[signal, default: 0] += 1 } }
                }
            }
        }
        for done in threads {
            let finished = await onPlainThread { done.wait(timeout: .now() + 60) == .success }
            #expect(finished, "a loop thread hung in onSignal or cancel()")
        }
        #expect(missed.value.isEmpty, "signals lost after cancel() (signal: count): \(missed.value)")
    }

    @Test("a signal handed from one loop to another right after cancel(): never signalInUse, never lost")
    func handOverBetweenLoops() async throws {
        let restore = installCountingHandler(SIGUSR2)
        defer { restore() }
        let failures = Locked<[String]>([])
        for round in 0..<50 {
            let firstDone = DispatchSemaphore(value: 0)
            let secondGo = DispatchSemaphore(value: 0)
            let first = startThread {
                let loop = EventLoop.current
                do {
                    let watcher = try loop.onSignal(SIGUSR2) {}
                    watcher.cancel()
                } catch {
                    failures.withLock { $0.append("round \(round): first onSignal threw \(error)") }
                }
                secondGo.signal()
                firstDone.wait()
            }
            let second = startThread {
                secondGo.wait()
                let loop = EventLoop.current
                nonisolated(unsafe) var seen = 0
                do {
                    let watcher = try loop.onSignal(SIGUSR2) { seen += 1 }
                    raise(SIGUSR2)
                    if !loop.spin(until: { seen == 1 }, timeout: .seconds(10)) {
                        failures.withLock { $0.append("round \(round): the second loop never saw its signal") }
                    }
                    let before = calls(SIGUSR2)
                    watcher.cancel()
                    raise(SIGUSR2)
                    if calls(SIGUSR2) != before + 1 {
                        failures.withLock { $0.append("round \(round): lost after the second cancel()") }
                    }
                } catch {
                    failures.withLock { $0.append("round \(round): second onSignal threw \(error)") }
                }
                firstDone.signal()
            }
            let finished = await onPlainThread {
                first.wait(timeout: .now() + 30) == .success && second.wait(timeout: .now() + 30) == .success
            }
            #expect(finished, "round \(round) hung")
            if !finished { break }
        }
        #expect(failures.value.isEmpty, "\(failures.value.prefix(5))")
    }

    @Test("a loop freed, or its thread ending, with signal watchers open restores the previous handler")
    func loopEndsWithWatchersOpen() async throws {
        let restore = installCountingHandler(SIGUSR1)
        defer { restore() }
        let missed = try await onLoopThread { _ -> Int in
            unblockSignalInCurrentThread(SIGUSR1)
            var missed = 0
            for round in 0..<40 {
                if round % 2 == 0 {
                    // The thread of EventLoop.current exits with its watcher open; joined, so its
                    // loop has been shut down when this returns.
                    runOnJoinedThread { _ = try? EventLoop.current.onSignal(SIGUSR1) {} }
                } else {
                    // A loop of our own is freed with its watcher open.
                    runOnJoinedThread {
                        guard let loop = try? EventLoop() else { return }
                        _ = try? loop.onSignal(SIGUSR1) {}
                    }
                }
                let before = calls(SIGUSR1)
                raise(SIGUSR1)
                if calls(SIGUSR1) != before + 1 { missed += 1 }
            }
            return missed
        }
        #expect(missed == 0, "\(missed) of 40 signals lost after a loop with a watcher ended")
    }
}

/// Runs `body` on a new POSIX thread and returns once that thread has exited (its thread-local
/// destructors included).
private func runOnJoinedThread(_ body: @escaping @Sendable () -> Void) {
    final class Body { let run: @Sendable () -> Void; init(_ run: @escaping @Sendable () -> Void) { self.run = run } }
    var thread = pthread_t()
    let argument = Unmanaged.passRetained(Body(body)).toOpaque()
    let rc = pthread_create(&thread, nil, { argument in
        Unmanaged<Body>.fromOpaque(argument!).takeRetainedValue().run()
        return nil
    }, argument)
    precondition(rc == 0, "pthread_create failed")
    pthread_join(thread, nil)
}
