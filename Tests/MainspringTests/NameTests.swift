import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// Connects by name: the system's resolver off the loop, its deadline, Happy Eyeballs over real
/// loopback sockets (the address lists come from `HostResolver.overrides`, so the test decides
/// which family refuses or never answers), listeners on "::" and on names.
@Suite("Names", .serialized)
struct NameTests {
    /// A line echo server on `host`, port 0 (or `port`).
    static func echoServer(host: String = "127.0.0.1", port: UInt16 = 0, on loop: EventLoop) throws -> Listener {
        try Listener(.tcp(host: host, port: port), on: loop) { connection in
            connection.readLines { event in
                if case .line(let text) = event { connection.writeLine(text) }
                if event == .endOfFile { connection.close() }
            }
        }
    }

    @Test("connect by \"localhost\" and by an /etc/hosts name, callbacks and async; resolve returns the addresses")
    func namesFromHosts() async throws {
        let names = ["localhost"] + (hostsFileName().map { [$0] } ?? [])
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let listener = try await loop.submit { try Self.echoServer(on: loop) }
        for name in names {
            let connection = try await Connection.connect(to: name, port: listener.port, on: loop)
            try await connection.send(line: "hello \(name)")
            var lines = connection.lines.makeAsyncIterator()
            #expect(try await lines.next() == .line("hello \(name)"))
            #expect(connection.remoteAddress == "\(name):\(listener.port)")
            connection.close()
            let addresses = try await loop.resolve(name, port: 80)
            #expect(addresses.contains { $0.host == "127.0.0.1" && $0.port == 80 && $0.family == .ipv4 }, "\(addresses)")
        }
        #expect(try await loop.resolve("::1", port: 7) == [numericAddress("::1", port: 7)!])
        // The callback form: usable at once, writes buffered while the name resolves.
        let reply = try await onLoopThread { client -> [String] in
            nonisolated(unsafe) var replies: [String] = []
            let connection = try Connection.startConnecting(to: "localhost", port: listener.port, on: client)
            connection.readLines { if case .line(let text) = $0 { replies.append(text) } }
            connection.writeLine("early")
            connection.shutdownOutput()
            client.spin(until: { !replies.isEmpty }, timeout: .seconds(10))
            connection.close()
            return replies
        }
        #expect(reply == ["early"])
        try await loop.submit { listener.close() }
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a name that does not exist: the error names it, async and callbacks; a malformed host throws at once")
    func unknownName() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let name = "no-such-host-\(getpid()).invalid"
        let options = Connection.Options(resolveTimeout: .seconds(20))
        do {
            let connection = try await Connection.connect(to: name, port: 80, on: loop, options: options)
            Issue.record("\(name) connected: \(connection.remoteAddress)")
        } catch {
            guard case .hostNotFound(let host, _) = error else {
                Issue.record("connect to \(name) threw \(error), not .hostNotFound")
                return
            }
            #expect(host == name)
            #expect(error.description.contains(name), "\(error)")
        }
        await #expect(throws: EventLoopError.self) { _ = try await loop.resolve(name) }
        let reason = try await onLoopThread { client -> Connection.CloseReason? in
            nonisolated(unsafe) var reason: Connection.CloseReason?
            #expect(throws: EventLoopError.invalidAddress("not an address")) {
                _ = try Connection.startConnecting(to: "not an address", port: 1, on: client)
            }
            let connection = try Connection.startConnecting(to: name, port: 80, on: client, options: options)
            connection.onClose { reason = $0 }
            client.spin(until: { reason != nil }, timeout: .seconds(30))
            return reason
        }
        guard case .connectFailed(let error)? = reason else {
            Issue.record("onClose got \(String(describing: reason)), not .connectFailed")
            return
        }
        #expect(error.description.contains(name), "\(error)")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("the resolve deadline: a resolver that never answers fails in its timeout, naming the host; the loop keeps running")
    func resolveDeadline() async throws {
        let name = "stalled-\(getpid()).test"
        let release = DispatchSemaphore(value: 0)
        HostResolver.overrides.withLock { $0[name] = { _, _ in release.wait(); return .success([]) } }
        defer {
            release.signal()
            HostResolver.overrides.withLock { $0[name] = nil }
        }
        let (error, elapsed, ticks) = try await onLoopThread { loop -> (EventLoopError?, Duration, Int) in
            nonisolated(unsafe) var failure: EventLoopError?
            nonisolated(unsafe) var ticks = 0
            let ticker = loop.schedule(every: .milliseconds(20)) { _ in ticks += 1 }
            let started = now()
            let connection = try Connection.startConnecting(to: name, port: 80, on: loop,
                                                    options: .init(resolveTimeout: .milliseconds(300)))
            connection.onClose { if case .connectFailed(let error) = $0 { failure = error } }
            loop.spin(until: { failure != nil }, timeout: .seconds(10))
            let elapsed = now() - started
            ticker.cancel()
            return (failure, elapsed, ticks)
        }
        #expect(error == .resolveTimedOut(host: name, timeout: .milliseconds(300)))
        #expect(error?.description.contains(name) == true)
        #expect(elapsed >= .milliseconds(300) && elapsed < .seconds(8), "\(elapsed)")
        #expect(ticks >= 3, "the loop ran \(ticks) timer ticks while the resolver hung")
    }

    /// A port on which 127.0.0.1 listens (an echo server) and `[::1]` is bound but refuses, or
    /// the reverse: binding the other family's port keeps it ours for the test.
    static func splitPort(listeningOn family: SocketAddress.Family, on loop: EventLoop) throws -> (Listener, RefusingSocket) {
        for _ in 0..<20 {
            let listener = try echoServer(host: family == .ipv4 ? "127.0.0.1" : "::1", on: loop)
            if let refusing = RefusingSocket(host: family == .ipv4 ? "::1" : "127.0.0.1", port: listener.port) {
                return (listener, refusing)
            }
            listener.close()
        }
        throw POSIXError(.EADDRINUSE)
    }

    @Test("Happy Eyeballs: the preferred family refuses, the other connects at once (both ways); all refusing names every address")
    func happyEyeballsRefused() async throws {
        let name = "refusing-\(getpid()).test"
        defer { HostResolver.overrides.withLock { $0[name] = nil } }
        for preferred in [SocketAddress.Family.ipv6, .ipv4] {
            let outcome = try await onLoopThread { loop -> (Bool, Duration, UInt16) in
                let (listener, refusing) = try Self.splitPort(listeningOn: preferred == .ipv6 ? .ipv4 : .ipv6, on: loop)
                let port = listener.port
                let order = preferred == .ipv6 ? ["::1", "127.0.0.1"] : ["127.0.0.1", "::1"]
                let addresses = order.map { numericAddress($0, port: port)! }
                HostResolver.overrides.withLock { $0[name] = { _, _ in .success(addresses) } }
                nonisolated(unsafe) var replies: [String] = []
                let started = now()
                // A delay far longer than the test: only the refusal can start the second attempt.
                let connection = try Connection.startConnecting(to: name, port: port, on: loop,
                                                        options: .init(connectionAttemptDelay: .seconds(30)))
                connection.readLines { if case .line(let text) = $0 { replies.append(text) } }
                connection.writeLine("ping")
                loop.spin(until: { !replies.isEmpty }, timeout: .seconds(10))
                let elapsed = now() - started
                connection.close()
                let accepted = listener.acceptedCount
                listener.close()
                withExtendedLifetime(refusing) {}
                return (replies == ["ping"], elapsed, UInt16(accepted))
            }
            #expect(outcome.0, "no echo with \(preferred) refusing")
            #expect(outcome.1 < .seconds(10), "\(outcome.1)")
            #expect(outcome.2 == 1)
        }
        // Both families refuse: one error naming the host and both addresses.
        let error = try await onLoopThread { loop -> EventLoopError? in
            guard let refusing4 = RefusingSocket(host: "127.0.0.1", port: 0),
                  let refusing6 = RefusingSocket(host: "::1", port: refusing4.port)
            else { return nil }
            let port = refusing4.port
            let addresses = ["::1", "127.0.0.1"].map { numericAddress($0, port: port)! }
            HostResolver.overrides.withLock { $0[name] = { _, _ in .success(addresses) } }
            nonisolated(unsafe) var failure: EventLoopError?
            let connection = try Connection.startConnecting(to: name, port: port, on: loop)
            connection.onClose { if case .connectFailed(let error) = $0 { failure = error } }
            loop.spin(until: { failure != nil }, timeout: .seconds(10))
            withExtendedLifetime((refusing4, refusing6)) {}
            return failure
        }
        guard case .connectFailed(let host, _, let attempts)? = error else {
            Issue.record("both refusing gave \(String(describing: error))")
            return
        }
        #expect(host == name)
        #expect(attempts.map(\.errno) == [ECONNREFUSED, ECONNREFUSED])
        #expect(attempts.map(\.address).allSatisfy { $0.hasPrefix("[::1]:") || $0.hasPrefix("127.0.0.1:") })
        let text = error!.description
        #expect(text.contains(name) && text.contains("[::1]:") && text.contains("127.0.0.1:"), "\(text)")
    }

    /// The close reason of a connect by name that every address refused says each thing once:
    /// it read "connect failed: connect to NAME:P failed: 127.0.0.1:P: ECONNREFUSED …", its
    /// own words around the error's.
    @Test("a connect by name that is refused closes with a reason that says where and why once")
    func refusedByNameSaysItOnce() async throws {
        let name = "refusing-once-\(getpid()).test"
        defer { HostResolver.overrides.withLock { $0[name] = nil } }
        let (reason, port) = try await onLoopThread { loop -> (Connection.CloseReason?, UInt16) in
            guard let refusing = RefusingSocket(host: "127.0.0.1", port: 0) else { return (nil, 0) }
            let port = refusing.port
            let address = numericAddress("127.0.0.1", port: port)!
            HostResolver.overrides.withLock { $0[name] = { _, _ in .success([address]) } }
            nonisolated(unsafe) var reason: Connection.CloseReason?
            let connection = try Connection.startConnecting(to: name, port: port, on: loop)
            connection.onClose { reason = $0 }
            loop.spin(until: { reason != nil }, timeout: .seconds(10))
            withExtendedLifetime(refusing) {}
            return (reason, port)
        }
        let text = reason?.description ?? "no close reason"
        #expect(text == "connect to \(name):\(port) failed: 127.0.0.1:\(port): \(errnoName(ECONNREFUSED)) (errno \(ECONNREFUSED))", "\(text)")
        #expect(text.components(separatedBy: "failed").count == 2, "\(text)")
    }

    @Test("Happy Eyeballs: the preferred family never answers (a full accept queue); the other starts after the delay and wins")
    func happyEyeballsBlackholed() async throws {
        let name = "blackholed-\(getpid()).test"
        defer { HostResolver.overrides.withLock { $0[name] = nil } }
        let outcome = try await onLoopThread { loop -> (Bool, Duration, Int) in
            var found: (Listener, Blackhole)?
            for _ in 0..<20 where found == nil {
                let listener = try Self.echoServer(on: loop)
                if let hole = Blackhole(host: "::1", port: listener.port) { found = (listener, hole) } else { listener.close() }
            }
            guard let (listener, hole) = found else { throw POSIXError(.EADDRINUSE) }
            let addresses = ["::1", "127.0.0.1"].map { numericAddress($0, port: listener.port)! }
            HostResolver.overrides.withLock { $0[name] = { _, _ in .success(addresses) } }
            nonisolated(unsafe) var replies: [String] = []
            let started = now()
            let connection = try Connection.startConnecting(to: name, port: listener.port, on: loop,
                                                    options: .init(connectionAttemptDelay: .milliseconds(200)))
            connection.readLines { if case .line(let text) = $0 { replies.append(text) } }
            connection.writeLine("ping")
            loop.spin(until: { !replies.isEmpty }, timeout: .seconds(10))
            let elapsed = now() - started
            connection.close()
            let accepted = listener.acceptedCount
            listener.close()
            withExtendedLifetime(hole) {}
            return (replies == ["ping"], elapsed, accepted)
        }
        #expect(outcome.0)
        #expect(outcome.1 >= .milliseconds(200) && outcome.1 < .seconds(8), "\(outcome.1)")
        #expect(outcome.2 == 1)
    }

    @Test("listeners on \"::\" accept IPv4 and IPv6; on \"localhost\"; TLS-free clients by both literals")
    func dualStackAndNamedListeners() async throws {
        let (v4, v6, named) = try await onLoopThread { loop -> (Bool, Bool, Bool) in
            let wildcard = try Self.echoServer(host: "::", on: loop)
            let local = try Self.echoServer(host: "localhost", on: loop)
            defer { wildcard.close(); local.close() }
            func echo(_ host: String, _ port: UInt16) -> Bool {
                nonisolated(unsafe) var replies: [String] = []
                guard let connection = try? Connection.startConnecting(to: host, port: port, on: loop) else { return false }
                connection.readLines { if case .line(let text) = $0 { replies.append(text) } }
                connection.writeLine("x")
                loop.spin(until: { !replies.isEmpty }, timeout: .seconds(10))
                connection.close()
                return replies == ["x"]
            }
            return (echo("127.0.0.1", wildcard.port), echo("::1", wildcard.port), echo("localhost", local.port))
        }
        #expect(v4 && v6 && named)
    }

    @Test("binding a host name is refused at once (resolving it would block the loop); resolve first, then bind the address")
    func bindingANameNeedsAnAddress() async throws {
        // A name that would take the resolver's time (and not exist): before, the listener called
        // getaddrinfo for it on the loop's thread and threw hostNotFound when that came back.
        let name = hostsFileName() ?? "mainspring-test.invalid"
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let errors = try await loop.submit { () -> [EventLoopError?] in
            var errors: [EventLoopError?] = []
            do throws(EventLoopError) {
                _ = try Listener(.tcp(host: name, port: 0), on: loop) { $0.close() }
                errors.append(nil)
            } catch {
                errors.append(error)
            }
            do throws(DatagramError) {
                _ = try DatagramSocket(bindingTo: name, port: 0, on: loop)
                errors.append(nil)
            } catch {
                guard case .loop(let error) = error else { Issue.record("\(error)"); return errors }
                errors.append(error)
            }
            return errors
        }
        #expect(errors == [.bindNeedsAddress(host: name), .bindNeedsAddress(host: name)])
        #expect(errors.first??.description.contains("EventLoop.resolve") == true)
        // The way the error names: resolve off the loop, then bind one of the addresses.
        let addresses = try await loop.resolve("localhost", port: 0)
        let address = try #require(addresses.first)
        let listener = try await loop.submit { try Self.echoServer(host: address.host, on: loop) }
        #expect(listener.port != 0)
        listener.close()
        await group.shutdown()
    }
}

/// A TCP socket bound to `host:port` and never listening: connects to it are refused, and the
/// port stays ours. Nil when the address is taken.
final class RefusingSocket: @unchecked Sendable {
    let fd: Int32
    let port: UInt16

    init?(host: String, port: UInt16, listenBacklog: Int32? = nil) {
        guard let address = numericAddress(host, port: port) else { return nil }
        let fd = socket(address.family == .ipv6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        let bound = address.storage.withUnsafeBytes { bytes in
            bind(fd, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count)) == 0
        }
        if !bound || (listenBacklog.map { listen(fd, $0) != 0 } ?? false) {
            close(fd)
            return nil
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        self.fd = fd
        self.port = withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress($0, length: length)?.port ?? 0 }
        }
    }

    deinit { close(fd) }
}

/// A listening socket whose accept queue (backlog 0) is filled by one connection nobody
/// accepts: the kernel drops further SYNs, so a connect to it neither succeeds nor fails.
final class Blackhole: @unchecked Sendable {
    let listening: RefusingSocket
    let filler: Int32

    init?(host: String, port: UInt16) {
        guard let listening = RefusingSocket(host: host, port: port, listenBacklog: 0),
              let address = numericAddress(host, port: port)
        else { return nil }
        let filler = socket(address.family == .ipv6 ? AF_INET6 : AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        let connected = address.storage.withUnsafeBytes { bytes in
            connect(filler, bytes.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count)) == 0
        }
        guard connected else {
            close(filler)
            return nil
        }
        self.listening = listening
        self.filler = filler
    }

    deinit { close(filler) }
}
