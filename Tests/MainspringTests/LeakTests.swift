import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

/// Bytes the process has allocated with malloc and not freed (glibc's `mallinfo2`).
private func heapInUse() -> Int { Int(mallinfo2().uordblks) }

/// Runs `batch` once to warm up, then `rounds` more times, and returns the smallest heap growth
/// of a round. A leak grows every round; allocations by tests running in parallel come and go,
/// so they cannot make every round grow.
private func smallestGrowth(rounds: Int = 3, _ batch: () throws -> Void) rethrows -> Int {
    try batch()
    var smallest = Int.max
    for _ in 0..<rounds {
        let before = heapInUse()
        try batch()
        smallest = min(smallest, heapInUse() - before)
    }
    return smallest
}

@Suite("Leaks: memory stays flat, descriptors and sources are let go", .serialized)
struct LeakTests {
    @Test("10,000 loops created and freed")
    func loops() async throws {
        let growth = try await onLoopThread { _ in
            try smallestGrowth {
                for _ in 0..<10_000 {
                    let loop = try EventLoop()
                    loop.execute {}
                    loop.runOnce(blocking: false)
                }
            }
        }
        // One leaked loop is > 60 KB (its histograms): 10,000 would be 600 MB. The bound leaves
        // room for what tests running in parallel allocate meanwhile.
        #expect(growth < 64 << 20, "heap grew \(growth) bytes per 10,000 loops")
    }

    @Test("100,000 timers and 10,000 watchers created, fired or cancelled")
    func timersAndWatchers() async throws {
        let growth = try await onLoopThread { loop in
            try smallestGrowth {
                var fired = 0
                for i in 0..<100_000 {
                    let handle = loop.schedule(after: .zero) { fired += 1 }
                    if i % 2 == 0 { handle.cancel() }
                }
                loop.spin(until: { fired == 50_000 }, timeout: .seconds(30))
                let pipe = TestPipe()
                for _ in 0..<10_000 {
                    let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in }
                    watcher.cancel()
                }
            }
        }
        // A leaked timer is a source, a libevent event and a closure (> 300 bytes): 100,000
        // would be > 30 MB; the bound leaves room for tests running in parallel.
        #expect(growth < 24 << 20, "heap grew \(growth) bytes per round")
    }

    @Test("500 loopback connections opened and closed, three times: no descriptor, no source and no registration left behind")
    func connections() async throws {
        let rounds = try await onLoopThread { loop -> [Round] in
            // This round's connection sources (both sides), weakly: alive after the round means
            // leaked; and the inodes of their sockets: one still open after the round is a leaked
            // descriptor, whatever state its connection is in.
            nonisolated(unsafe) var sources: [WeakSource] = []
            nonisolated(unsafe) var sockets = Set<UInt64>()
            let listener = try Listener(.tcp(), on: loop) { connection in
                sources.append(WeakSource(connection.source))
                if let inode = socketInode(of: connection.source) { sockets.insert(inode) }
                connection.readLines { event in if event == .endOfFile { connection.close() } }
            }
            defer { listener.close() }
            var rounds: [Round] = []
            for _ in 0..<3 {
                sources.removeAll()
                sockets.removeAll()
                var closed = 0
                for _ in 0..<500 {
                    let client = try Connection.startConnecting(to: "127.0.0.1", port: listener.port, on: loop)
                    sources.append(WeakSource(client.source))
                    if let inode = socketInode(of: client.source) { sockets.insert(inode) }
                    client.onClose { _ in closed += 1 }
                    client.write("hello\n")
                    client.shutdownOutput()
                    client.readLines { event in if event == .endOfFile { client.close() } }
                }
                // The clients' sockets exist from the connect on: the count finds them open.
                let openWhileConnecting = openDescriptors(of: sockets)
                loop.spin(until: { closed == 500 }, timeout: .seconds(60))
                // Closed on both sides: the loop lets go of every source (only the listener stays
                // registered) and every source is freed; then the loop closes the descriptors
                // (libevent closes a freed bufferevent's socket in its next pass, not at once).
                loop.spin(until: { loop.sourceCount == 1 && sources.count == 1_000 && sources.allSatisfy { $0.source == nil } },
                          timeout: .seconds(10))
                loop.spin(until: { openDescriptors(of: sockets) == 0 }, timeout: .seconds(10))
                rounds.append(Round(closed: closed, openWhileConnecting: openWhileConnecting, made: sources.count,
                                    sockets: sockets.count, alive: sources.count(where: { $0.source != nil }),
                                    registered: loop.sourceCount - 1, open: openDescriptors(of: sockets)))
            }
            return rounds
        }
        for (index, round) in rounds.enumerated() {
            #expect(round.closed == 500, "round \(index): \(round.closed) of 500 connections closed")
            #expect(round.made == 1_000 && round.sockets == 1_000,
                    "round \(index): \(round.made) connection sources and \(round.sockets) sockets for 500 connections (both sides)")
            #expect(round.openWhileConnecting == 500, "round \(index): \(round.openWhileConnecting) of 500 connecting clients' descriptors found open")
            #expect(round.alive == 0, "round \(index): \(round.alive) of 1,000 connection sources outlived their connection")
            #expect(round.registered == 0, "round \(index): \(round.registered) sources besides the listener still registered on the loop")
            #expect(round.open == 0, "round \(index): \(round.open) descriptors of closed connections still open")
        }
    }
}

/// What one round of `LeakTests.connections` left.
private struct Round: Sendable {
    var closed: Int
    var openWhileConnecting: Int
    var made: Int
    var sockets: Int
    var alive: Int
    var registered: Int
    var open: Int
}

/// A connection's source, held weakly.
private struct WeakSource {
    weak var source: ConnectionSource?
    init(_ source: ConnectionSource) { self.source = source }
}

/// The inode of a connection's socket (unique while the socket exists). Loop thread.
private func socketInode(of source: ConnectionSource) -> UInt64? {
    guard let fd = source.socket?.fd, fd >= 0 else { return nil }
    var info = stat()
    guard fstat(fd, &info) == 0 else { return nil }
    return UInt64(info.st_ino)
}

/// How many of this process's descriptors are one of these sockets (/proc/self/fd/N links to
/// "socket:[INODE]"). Descriptors that tests running in parallel open are not among them.
private func openDescriptors(of sockets: Set<UInt64>) -> Int {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return entries.count(where: { entry in
        var buffer = [CChar](repeating: 0, count: 64)
        let length = readlink("/proc/self/fd/\(entry)", &buffer, buffer.count)
        guard length > 0 else { return false }
        let target = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard target.hasPrefix("socket:["), target.hasSuffix("]"),
              let inode = UInt64(target.dropFirst("socket:[".count).dropLast()) else { return false }
        return sockets.contains(inode)
    })
}
