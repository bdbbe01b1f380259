import CMainspringSystem
import Foundation
import Synchronization
import Testing
import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// Runs `body` on a new dedicated thread (not the test's cooperative thread) with that thread's
/// own `EventLoop.current`, and returns its result. The loop dies with the thread.
package func onLoopThread<T: Sendable>(
    _ body: @escaping @Sendable (EventLoop) throws -> T
) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do {
                continuation.resume(returning: try body(EventLoop.current))
            } catch {
                continuation.resume(throwing: error)
            }
        }
        thread.stackSize = 4 << 20
        thread.start()
    }
}

/// Runs blocking `body` (plain socket calls, waits) on a new dedicated thread and returns its
/// result, or throws its error: blocking a thread of the cooperative pool (two on a 2-core
/// machine) would starve every other test's tasks meanwhile. A `body` that cannot throw makes a
/// call that cannot either.
package func onPlainThread<T: Sendable, Failure: Error>(_ body: @escaping @Sendable () throws(Failure) -> T) async throws(Failure) -> T {
    let result: Result<T, Failure> = await withCheckedContinuation { continuation in
        let thread = Thread { continuation.resume(returning: Result(catching: body)) }
        thread.stackSize = 4 << 20
        thread.start()
    }
    return try result.get()
}

/// Starts a thread running `body` and returns a semaphore signalled when it ends.
@discardableResult
package func startThread(_ body: @escaping @Sendable () -> Void) -> DispatchSemaphore {
    let done = DispatchSemaphore(value: 0)
    let thread = Thread {
        body()
        done.signal()
    }
    thread.start()
    return done
}

/// A pipe whose ends close when the value is released (each end at most once). Both ends are
/// close-on-exec from the start: a child another test spawns meanwhile must not hold them open.
package final class TestPipe: @unchecked Sendable {
    package let readEnd: Int32
    package let writeEnd: Int32
    private let closed = Protected<(read: Bool, write: Bool)>((false, false))

    package init() {
        var fds: [Int32] = [0, 0]
        precondition(ms_pipe2(&fds, O_CLOEXEC) == 0, "pipe2 failed: \(errno)")
        readEnd = fds[0]
        writeEnd = fds[1]
    }

    package func write(_ text: String) { write(Array(text.utf8)) }

    package func write(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(writeEnd, $0.baseAddress! + offset, $0.count - offset) }
            precondition(n > 0 || errno == EINTR, "write failed: \(errno)")
            if n > 0 { offset += n }
        }
    }

    package func closeWrite() {
        if closed.withLock({ let was = $0.write; $0.write = true; return !was }) { close(writeEnd) }
    }

    package func closeRead() {
        if closed.withLock({ let was = $0.read; $0.read = true; return !was }) { close(readEnd) }
    }

    deinit {
        closeWrite()
        closeRead()
    }
}

/// A directory of this test process's own, made once with `mkdtemp` (`/tmp/ms-XXXXXX`: short,
/// so unix socket paths under it fit `sun_path`'s 108 bytes) and removed when the process exits.
/// Paths made of the PID alone are not unique: a PID is reused, and a crashed run leaves its
/// files behind for the next one with the same PID.
package let testDirectory: String = {
    var template = Array("/tmp/ms-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { fatalError("mkdtemp failed: \(String(cString: strerror(errno)))") }
    let path = String(cString: made)
    atexit { try? FileManager.default.removeItem(atPath: testDirectory) }
    return path
}()

private let testPathCounter = Atomic<Int>(0)

/// A path in `testDirectory` that nothing has used yet: `<dir>/<n>-<name>`. Nothing is created.
package func uniqueTestPath(_ name: String) -> String {
    "\(testDirectory)/\(testPathCounter.wrappingAdd(1, ordering: .relaxed).oldValue)-\(name)"
}

/// A name for the abstract unix socket namespace, which is shared by every process of the
/// network namespace and has no directory to make it ours: the PID, a counter and a random part.
package func uniqueAbstractName(_ prefix: String) -> String {
    "\(prefix)-\(getpid())-\(testPathCounter.wrappingAdd(1, ordering: .relaxed).oldValue)-\(String(UInt64.random(in: 0...UInt64.max), radix: 36))"
}

/// A value shared between threads under a lock (Mainspring's TSan-visible `Protected`).
package final class Locked<Value: Sendable>: @unchecked Sendable {
    private let mutex: Protected<Value>
    package init(_ value: Value) { mutex = Protected(value) }
    package func withLock<R>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
    package var value: Value { mutex.withLock { $0 } }
}

/// Runs a timing measurement up to `attempts` times, until one run meets its timing bounds.
/// `measure` checks with `#expect` what must hold on every run (counts, order, never early) and
/// returns nil when its timing bounds (enough ticks, not too late) were met, or what it missed.
/// A loaded machine can stall any one run — a descheduled thread is late by tens of
/// milliseconds — but not every one of several; a defect misses the bounds every time. Records
/// an issue when every attempt missed; returns the misses.
@discardableResult
package func inSomeAttempt(_ attempts: Int = 5, sourceLocation: SourceLocation = #_sourceLocation,
                   _ measure: () async throws -> String?) async rethrows -> [String]
{
    var misses: [String] = []
    for _ in 0..<attempts {
        guard let miss = try await measure() else { return misses }
        misses.append(miss)
    }
    Issue.record("timing bounds missed in all \(attempts) attempts: \(misses.joined(separator: "; "))",
                 sourceLocation: sourceLocation)
    return misses
}

/// Monotonic now, for tests.
package func now() -> ContinuousClock.Instant { ContinuousClock.now }

/// CPU time used by the whole process so far.
package func processCPUTime() -> Duration {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    let user = Duration.seconds(usage.ru_utime.tv_sec) + .microseconds(usage.ru_utime.tv_usec)
    let system = Duration.seconds(usage.ru_stime.tv_sec) + .microseconds(usage.ru_stime.tv_usec)
    return user + system
}

/// CPU time used by the calling thread so far.
package func threadCPUTime() -> Duration {
    var ts = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return .seconds(ts.tv_sec) + .nanoseconds(ts.tv_nsec)
}

extension Duration {
    package var milliseconds: Double { Double(components.seconds) * 1_000 + Double(components.attoseconds) / 1e15 }
}

/// A loop on its own thread, running until `stop()`; for tests that await work on it.
package final class BackgroundLoop: Sendable {
    package let loop: EventLoop
    private let done: DispatchSemaphore

    package init() throws {
        let loop = try EventLoop()
        self.loop = loop
        done = startThread { try? loop.run() }
    }

    /// Stops the loop and waits for its thread to return.
    package func stop() {
        loop.stop()
        done.wait()
    }
}

/// A counter shared between threads.
package final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    package init() {}
    package func increment() { value.add(1, ordering: .acquiringAndReleasing) }
    package var count: Int { value.load(ordering: .acquiring) }
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
package func eventually(timeout: Duration = .seconds(20), _ condition: () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))  // a cancelled sleep only polls sooner
    }
    return condition()
}

/// `eventually` for an async condition.
package func eventuallyAsync(timeout: Duration = .seconds(20), _ condition: () async -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return await condition()
}

/// A name /etc/hosts maps to 127.0.0.1, other than "localhost", if there is one.
package func hostsFileName() -> String? {
    guard let text = try? String(contentsOfFile: "/etc/hosts", encoding: .utf8) else { return nil }
    for line in text.split(separator: "\n") {
        let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
        guard fields.count >= 2, fields[0] == "127.0.0.1" else { continue }
        for name in fields.dropFirst() where name != "localhost" && isPlausibleHostName(String(name)) {
            if name.first == "#" { break }
            return String(name)
        }
    }
    return nil
}

/// A new, empty directory for one test.
package func freshDirectory(_ name: String = "watched") -> String {
    let path = uniqueTestPath(name)
    mkdir(path, 0o755)
    return path
}

/// A test's own failure, with what went wrong in words (`throw TestFailure("no answer")`).
package struct TestFailure: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}
