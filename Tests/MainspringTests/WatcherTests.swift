import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("Fd watchers")
struct WatcherTests {
    @Test("a pipe watcher sees data, then end of file")
    func pipeReadAndEOF() async throws {
        let pipe = TestPipe()
        let received = try await onLoopThread { loop -> (String, Bool) in
            nonisolated(unsafe) var text = ""
            nonisolated(unsafe) var sawEOF = false
            nonisolated(unsafe) var watcher: Watcher?
            watcher = try loop.watch(pipe.readEnd, for: .read) { events in
                #expect(events.contains(.read))
                var buffer = [UInt8](repeating: 0, count: 256)
                let n = buffer.withUnsafeMutableBytes { read(pipe.readEnd, $0.baseAddress, $0.count) }
                if n > 0 {
                    text += String(decoding: buffer[0..<n], as: UTF8.self)
                } else {
                    sawEOF = true
                    watcher?.cancel()
                }
            }
            startThread {
                pipe.write("hello ")
                usleep(10_000)
                pipe.write("world")
                pipe.closeWrite()
            }
            loop.spin(until: { sawEOF }, timeout: .seconds(5))
            return (text, sawEOF)
        }
        #expect(received.0 == "hello world")
        #expect(received.1)
    }

    @Test("watching a closed or invalid fd is a thrown badDescriptor error")
    func badDescriptor() async throws {
        try await onLoopThread { loop in
            let fd = neverOpenDescriptor()
            #expect(throws: EventLoopError.badDescriptor(fd)) { _ = try loop.watch(fd, for: .read) { _ in } }
            #expect(throws: EventLoopError.badDescriptor(-1)) { _ = try loop.readLines(from: -1) { _ in } }
            #expect(EventLoopError.badDescriptor(fd).description.contains("not open"))
        }
    }

    @Test("a watcher cancelled while its event is already ready never runs")
    func cancelWhileReady() async throws {
        let ran = try await onLoopThread { loop -> Bool in
            let pipe = TestPipe()
            pipe.write("x")
            nonisolated(unsafe) var ran = false
            nonisolated(unsafe) var victim: Watcher?
            // Both fds are ready in the same poll; the first handler cancels the second watcher.
            let other = TestPipe()
            other.write("y")
            let first = try loop.watch(other.readEnd, for: .read) { _ in victim?.cancel() }
            victim = try loop.watch(pipe.readEnd, for: .read) { _ in ran = true }
            loop.spin(until: { victim!.isCancelled }, timeout: .seconds(2))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            first.cancel()
            return ran
        }
        #expect(!ran)
    }

    @Test("a handler is never re-entered, even when it spins while its fd stays readable")
    func neverReentered() async throws {
        let (maxDepth, calls, cpu) = try await onLoopThread { loop -> (Int, Int, Duration) in
            let pipe = TestPipe()
            pipe.write("data that nobody reads")
            nonisolated(unsafe) var depth = 0
            nonisolated(unsafe) var maxDepth = 0
            nonisolated(unsafe) var calls = 0
            let cpuBefore = threadCPUTime()
            let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in
                calls += 1
                depth += 1
                maxDepth = max(maxDepth, depth)
                if calls == 1 {
                    // The fd stays readable while we wait 100 ms: the watcher must be held back,
                    // not re-entered, and the nested spin must sleep rather than busy-loop.
                    loop.spin(until: { false }, timeout: .milliseconds(100))
                }
                depth -= 1
            }
            loop.spin(until: { calls >= 2 }, timeout: .seconds(2))
            watcher.cancel()
            return (maxDepth, calls, threadCPUTime() - cpuBefore)
        }
        #expect(maxDepth == 1)
        #expect(calls >= 2)  // resumed after the handler returned
        #expect(cpu < .milliseconds(60), "the nested spin burned \(cpu) of CPU")
    }

    @Test("an fd closed behind its watcher's back does not poison the next file with its number")
    func staleWatcherOnReusedNumber() async throws {
        let (fired, staleEvents, staleCancelled) = try await onLoopThread { loop -> (Bool, [LineEvent], Bool) in
            // A reader and a watcher on a pipe whose read end then changes file behind their
            // back: dup2 puts a new pipe's read end on the same number (atomically, so no test
            // running in parallel can take the number in between).
            let old = TestPipe()
            let number = old.readEnd
            nonisolated(unsafe) var staleEvents: [LineEvent] = []
            let staleReader = try loop.readLines(from: number) { staleEvents.append($0) }
            let staleWatcher = try loop.watch(number, for: .read) { _ in }
            let fresh = TestPipe()
            #expect(dup2(fresh.readEnd, number) == number)
            _ = fcntl(number, F_SETFD, FD_CLOEXEC)  // dup2 clears it (dup3 is not in Swift's Glibc)
            nonisolated(unsafe) var fired = false
            let watcher = try loop.watch(number, for: .read) { _ in fired = true }
            fresh.write("x")
            loop.spin(until: { fired }, timeout: .seconds(5))
            watcher.cancel()
            withExtendedLifetime((old, fresh)) {}
            return (fired, staleEvents, staleReader.isCancelled && staleWatcher.isCancelled)
        }
        #expect(fired, "the new file's watcher never fired")
        #expect(staleEvents == [.error(EBADF)])
        #expect(staleCancelled)
    }

    @Test("a regular file is always ready: its watcher runs every turn until cancelled")
    func regularFile() async throws {
        let path = uniqueTestPath("watch")
        _ = FileManager.default.createFile(atPath: path, contents: Data("abc".utf8))
        defer { unlink(path) }
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        defer { close(fd) }
        let count = try await onLoopThread { loop -> Int in
            nonisolated(unsafe) var count = 0
            nonisolated(unsafe) var watcher: Watcher?
            watcher = try loop.watch(fd, for: .read) { _ in
                count += 1
                if count == 5 { watcher?.cancel() }
            }
            loop.spin(until: { count >= 5 }, timeout: .seconds(2))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            return count
        }
        #expect(count == 5)
    }
}

/// A number at the process's hard fd limit: never open, even after a test raises the soft limit.
/// (A just-closed fd is not safe for tests of bad descriptors: tests running in parallel may be
/// handed the same number at any moment.)
func neverOpenDescriptor() -> Int32 {
    var limit = rlimit()
    getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    return Int32(clamping: min(UInt(limit.rlim_max), UInt(Int32.max - 1)))
}
