import Foundation
import Testing
@testable import Mainspring

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
}
