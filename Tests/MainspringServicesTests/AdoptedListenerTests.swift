import CMainspringSystem
import Foundation
import Testing
@testable import MainspringServices
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

// A listening descriptor passed by a service manager (socket activation), adopted as a
// `Listener`: the descriptor checked, made non-blocking and close-on-exec, its errors named.

/// A listening TCP socket on 127.0.0.1 made with plain calls — blocking, inheritable — as a
/// service manager would pass it. Made close-on-exec, so a child another test spawns while it
/// is being set up never holds it; the flag is cleared once it listens (the test fixture's
/// spawns close every descriptor from 3 on in the child anyway), so that adopting must set it.
private func plainListeningSocket() throws -> (fd: Int32, port: UInt16) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EMFILE) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound, listen(fd, 16) == 0, fcntl(fd, F_SETFD, 0) == 0 else {
        close(fd)
        throw POSIXError(.EADDRINUSE)
    }
    return (fd, UInt16(bigEndian: address.sin_port))
}

@Suite("Adopting a listening descriptor")
struct AdoptedListenerTests {
    @Test("an inherited, blocking listening socket is adopted: non-blocking, close-on-exec, serving, closed with the listener")
    func adoptsListeningSocket() async throws {
        let (fd, port) = try plainListeningSocket()
        let identity = try #require(FileIdentity(of: fd))
        let outcome = try await onLoopThread { loop -> (flags: Int32, descriptorFlags: Int32, reply: String?, address: String, listenerPort: UInt16) in
            let listener = try Listener(.adopted(descriptor: fd), on: loop) { connection in
                connection.readLines { event in
                    switch event {
                    case .line(let text): connection.writeLine("echo: \(text)")
                    default: connection.close()
                    }
                }
            }
            let flags = fcntl(fd, F_GETFL)
            let descriptorFlags = fcntl(fd, F_GETFD)
            let reply = Locked<String?>(nil)
            startThread {
                let client = try? TestClient(port: port)
                client?.send("hello\n")
                let text = client?.readLine() ?? "no reply"
                reply.withLock { $0 = text }
                loop.execute {}  // wakes the loop to see the condition
            }
            loop.spin(until: { reply.value != nil }, timeout: .seconds(20))
            let result = (flags, descriptorFlags, reply.value, listener.localAddress, listener.port)
            listener.close()
            return result
        }
        #expect(outcome.reply == "echo: hello")
        #expect(outcome.flags & O_NONBLOCK != 0)
        #expect(outcome.descriptorFlags & FD_CLOEXEC != 0)
        #expect(outcome.listenerPort == port && outcome.address == "127.0.0.1:\(port)")
        // Closing the listener closed the socket: the number no longer names it (it may be
        // closed, or already reused by a test running in parallel). A connect to the port would
        // prove nothing: anybody may have been given the freed port meanwhile.
        #expect(FileIdentity(of: fd) != identity, "descriptor \(fd) still names the adopted socket \(identity)")
    }

    @Test("the async form: an adopted socket's connections are iterated with for try await")
    func adoptsForAsyncIteration() async throws {
        let (fd, port) = try plainListeningSocket()
        let group = try EventLoopGroup(loopCount: 1)
        let listener = try await Listener(.adopted(descriptor: fd), on: group.loops[0], group: group)
        #expect(listener.port == port)
        // The blocking client on a thread of its own: on the cooperative pool (two threads here)
        // it could starve the task that serves it.
        let reply = Task { await onPlainThread { () -> String? in
            let client = try? TestClient(port: port)
            // The echo comes from this test's task, which waits for a thread of that pool: at
            // the suite's start the pool was once held for 45 s by blocking tests (10 s ran out).
            client?.setReceiveTimeout(seconds: 180)
            client?.send("async hello\n")
            return client?.readLine()
        } }
        for try await connection in listener.connections {
            for try await event in connection.lines {
                if case .line(let text) = event { try await connection.send(line: "echo: \(text)") }
                break
            }
            connection.close()
            break
        }
        #expect(await reply.value == "echo: async hello")
        listener.close()
        _ = await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a unix stream socket is adopted too; its address is its path")
    func adoptsUnixSocket() async throws {
        let path = uniqueTestPath("adopt.sock")
        defer { unlink(path) }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(rc == 0 && listen(fd, 4) == 0)
        let serverAddress = address
        let (reply, shown) = try await onLoopThread { loop -> (String?, String) in
            let listener = try Listener(.adopted(descriptor: fd), on: loop) { connection in
                connection.readLines { event in
                    if case .line(let text) = event { connection.writeLine("unix: \(text)") } else { connection.close() }
                }
            }
            let reply = Locked<String?>(nil)
            startThread {
                let client = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
                defer { close(client) }
                var timeout = timeval(tv_sec: 10, tv_usec: 0)
                setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                var target = serverAddress
                let connected = withUnsafePointer(to: &target) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
                }
                var text = "no connection"
                if connected == 0 {
                    _ = Array("ping\n".utf8).withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    var buffer = [UInt8](repeating: 0, count: 64)
                    let n = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
                    text = n > 0 ? String(decoding: buffer[0..<n], as: UTF8.self) : "no reply"
                }
                reply.withLock { $0 = text }
                loop.execute {}
            }
            loop.spin(until: { reply.value != nil }, timeout: .seconds(20))
            defer { listener.close() }
            return (reply.value, listener.localAddress)
        }
        #expect(reply == "unix: ping\n")
        #expect(shown == path)
    }

    @Test("a descriptor that is not a listening stream socket is refused with what it is, and stays the caller's")
    func refusesOtherDescriptors() async throws {
        var pipeEnds: [Int32] = [-1, -1]
        try #require(ms_pipe2(&pipeEnds, O_CLOEXEC) == 0)
        let file = open("/proc/self/status", O_RDONLY | O_CLOEXEC)
        let udp = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let tcp = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)  // never listens
        let devNull = open("/dev/null", O_RDONLY | O_CLOEXEC)
        // Which file each number names now: if one were closed by mistake, a test running in
        // parallel could be given its number at once, so "still open" would prove nothing, and
        // closing it at the end would close that test's descriptor.
        let opened = [pipeEnds[0], pipeEnds[1], file, udp, tcp, devNull]
        let identities = opened.map { FileIdentity(of: $0) }
        try #require(identities.allSatisfy { $0 != nil }, "could not open the test's descriptors")
        defer {
            for (fd, identity) in zip(opened, identities) where FileIdentity(of: fd) == identity { close(fd) }
        }
        let cases: [(Int32, String)] = [
            (pipeEnds[0], "a pipe, not a socket"),
            (file, "a regular file, not a socket"),
            (devNull, "a character device, not a socket"),
            (udp, "a datagram socket, not a stream socket"),
            (tcp, "a stream socket that is not listening"),
        ]
        let descriptors = cases.map(\.0) + [-1]
        let errors = try await onLoopThread { loop -> [EventLoopError?] in
            descriptors.map { fd -> EventLoopError? in
                do throws(EventLoopError) {
                    _ = try Listener(.adopted(descriptor: fd), on: loop) { _ in }
                    return nil
                } catch {
                    return error
                }
            }
        }
        for ((fd, reason), error) in zip(cases, errors) {
            #expect(error == .notListeningSocket(descriptor: fd, reason: reason))
            let before = identities[opened.firstIndex(of: fd)!]
            #expect(FileIdentity(of: fd) == before, "descriptor \(fd) was closed; it should still be the caller's")
        }
        guard case .notListeningSocket(-1, let reason)? = errors.last else {
            Issue.record("descriptor -1: \(String(describing: errors.last))")
            return
        }
        #expect(reason.hasPrefix("not an open descriptor"))
        #expect(EventLoopError.notListeningSocket(descriptor: 3, reason: "a pipe, not a socket").description
            == "descriptor 3 is not a listening stream socket: it is a pipe, not a socket")
    }

    @Test("adopting off the loop's thread is a wrongThread error")
    func wrongThread() async throws {
        let loop = try EventLoop()
        let claimed = DispatchSemaphore(value: 0)
        let thread = Thread {
            loop.runOnce(blocking: false)  // this thread owns the loop now
            claimed.signal()
        }
        thread.start()
        claimed.wait()
        #expect(throws: EventLoopError.wrongThread(function: "Listener.init(.adopted, on:…)")) {
            _ = try Listener(.adopted(descriptor: 0), on: loop) { _ in }
        }
    }
}
