import Foundation
import MainspringCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A stand-in for systemd's notification socket: a unix datagram socket, bound to a path in
/// the test process's own directory (`uniqueTestPath`) or to an abstract name with a random part, whose address goes into `$NOTIFY_SOCKET`. A thread receives
/// every datagram and stamps it with `CLOCK_MONOTONIC` (the clock every process shares), so
/// tests can compare arrival times with stamps a child process reports.
package final class FakeNotifySocket: @unchecked Sendable {
    package struct Message: Sendable, CustomStringConvertible {
        /// `CLOCK_MONOTONIC` nanoseconds at arrival.
        package let arrival: UInt64
        package let text: String
        /// The `KEY=value` lines.
        package var assignments: [Substring] { text.split(separator: "\n") }
        package func contains(_ assignment: String) -> Bool { assignments.contains { $0 == assignment } }
        package func value(of key: String) -> String? {
            assignments.first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) }
        }
        package var description: String { "\(Double(arrival) / 1e9): \(text.replacingOccurrences(of: "\n", with: "\\n"))" }
    }

    /// The value for `$NOTIFY_SOCKET`: the path, or `@name`.
    package let address: String
    private let fd: Int32
    private let path: String?
    private let shared = Shared()

    /// What the receiving thread shares with the socket's owner.
    private final class Shared: Sendable {
        let received = Locked<[Message]>([])
        let arrived = DispatchSemaphore(value: 0)
        let stopping = Atomic<Bool>(false)
        let readerDone = DispatchSemaphore(value: 0)
    }

    package init(abstract: Bool = false) throws {
        let socketFD = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard socketFD >= 0 else { throw POSIXError(.EMFILE) }
        var bytes: [UInt8]
        if abstract {
            let name = uniqueAbstractName("mainspring-test-notify")
            address = "@" + name
            path = nil
            bytes = [0] + Array(name.utf8)
        } else {
            address = uniqueTestPath("notify.sock")
            path = address
            bytes = Array(address.utf8) + [0]
        }
        var storage = sockaddr_un()
        storage.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &storage.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
        let rc = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socketFD, $0, length) }
        }
        guard rc == 0 else {
            let code = errno
            Glibc.close(socketFD)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EINVAL)
        }
        // Stored only now: an init that throws after every property is set runs `deinit`, which
        // would close the descriptor again and wait for a reader thread that never started.
        fd = socketFD
        var timeout = timeval(tv_sec: 0, tv_usec: 50_000)
        setsockopt(socketFD, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let shared = self.shared
        Thread.detachNewThread {
            var buffer = [UInt8](repeating: 0, count: 8_192)
            while !shared.stopping.load(ordering: .acquiring) {
                let n = buffer.withUnsafeMutableBytes { recv(socketFD, $0.baseAddress, $0.count, 0) }
                guard n > 0 else { continue }
                let message = Message(arrival: monotonicNanoseconds(), text: String(decoding: buffer[0..<n], as: UTF8.self))
                shared.received.withLock { $0.append(message) }
                shared.arrived.signal()
            }
            shared.readerDone.signal()
        }
    }

    deinit {
        shared.stopping.store(true, ordering: .releasing)
        shared.readerDone.wait()
        Glibc.close(fd)
        if let path { unlink(path) }
    }

    /// Every datagram so far, in arrival order.
    package var messages: [Message] { shared.received.value }

    /// The first datagram after the first `after` ones that satisfies `predicate`, if one came.
    private func received(after: Int, _ predicate: (Message) -> Bool) -> Message? {
        shared.received.value.dropFirst(after).first(where: predicate)
    }

    /// Waits (up to `timeout`) for a datagram after the first `after` ones that satisfies
    /// `predicate`; returns it.
    package func waitFor(after: Int = 0, timeout: Duration = .seconds(20), _ predicate: (Message) -> Bool) -> Message? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let found = received(after: after, predicate) { return found }
            let left = deadline - ContinuousClock.now
            if left <= .zero { return nil }
            _ = shared.arrived.wait(timeout: .now() + .milliseconds(min(100, max(1, Int(left.milliseconds)))))
        }
    }

    /// The same wait for async tests, without blocking: it polls every 5 ms with `Task.sleep`, so
    /// the thread of the cooperative pool (two on a 2-core machine) stays free for the code under
    /// test — a blocking wait there starved the very service group whose notification it awaited.
    /// Cancelling the waiting task ends the wait with `nil`.
    package func waitFor(after: Int = 0, timeout: Duration = .seconds(20), _ predicate: (Message) -> Bool) async -> Message? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let found = received(after: after, predicate) { return found }
            if ContinuousClock.now >= deadline { return nil }
            do { try await Task.sleep(for: .milliseconds(5)) } catch { return nil }
        }
    }
}
