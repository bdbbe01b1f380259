import Foundation
import Mainspring
import Synchronization

// `descriptor-exhaustion`: the process runs out of file descriptors (its soft RLIMIT_NOFILE
// lowered, then the rest filled with /dev/null) while a loop serves a connection. Everything
// that needs a new descriptor must fail with an error — a loop, a thread's loop, a listener, a
// connection, a UDP socket, a child, a file watch, a spinning operation's loop — and what is
// already open must keep working: the connection echoes, timers (first armed now) fire, a spin's
// timeout ends it, the listener pauses instead of spinning on EMFILE and accepts the waiting
// client once descriptors are free again. Each outcome is a `key=value` line; the test reads them.

/// The error text of `body`, or `nil` if it did not throw.
private func failure(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch {
        return "\(error)"
    }
}

/// The error text of `EventLoop.forCurrentThread()` on a new thread (which has no loop yet),
/// or "made" when it made one.
private func threadLoopOutcome() -> String {
    let outcome = Outcome()
    let thread = Thread {
        do {
            _ = try EventLoop.forCurrentThread()
            outcome.set("made")
        } catch {
            outcome.set("\(error)")
        }
    }
    thread.start()
    return outcome.wait()
}

/// A text one thread sets and another waits for (a condition variable: ThreadSanitizer sees it).
private final class Outcome: @unchecked Sendable {
    private let condition = NSCondition()
    private var text: String?

    func set(_ value: String) {
        condition.lock()
        text = value
        condition.broadcast()
        condition.unlock()
    }

    func wait() -> String {
        condition.lock()
        defer { condition.unlock() }
        while text == nil { condition.wait() }
        return text!
    }

    /// The text, if set yet.
    var value: String? {
        condition.lock()
        defer { condition.unlock() }
        return text
    }
}

private final class LoopProbe: SpinningOperation, @unchecked Sendable {
    override func execute() { finish() }
}

/// Runs a `SpinningOperation` on a new thread (which has no loop yet) and describes how it
/// ended. A thread of its own, not an `OperationQueue`'s worker: every second, libdispatch's
/// worker-pool monitor opens `/proc/<tid>/stat` for each worker of a root queue that has work
/// waiting, and stops the process when that open fails — as it does here, out of descriptors
/// (seen under load: SIGILL while the operation waited for a worker). The operation's own
/// path is the same either way: `start()` on a thread without a loop.
private func spinningOperationOutcome() -> String {
    let operation = LoopProbe()
    let ended = Outcome()
    let thread = Thread {
        operation.start()
        ended.set("ended")
    }
    thread.start()
    _ = ended.wait()
    if let error = operation.loopError { return "cancelled=\(operation.isCancelled) \(error)" }
    return "executed"
}

/// How a connect to `port` ends while no socket can be made: an error thrown, or the
/// connection's close reason.
private func connectOutcome(port: UInt16, loop: EventLoop) -> String {
    final class Outcome { var text: String? }
    let outcome = Outcome()
    do {
        let connection = try Connection.startConnecting(to: "127.0.0.1", port: port, on: loop)
        connection.onClose { reason in outcome.text = "closed: \(reason)" }
        loop.spin(until: { outcome.text != nil }, timeout: .seconds(20))
        return outcome.text ?? "connected"
    } catch {
        return "\(error)"
    }
}

/// A blocking client socket made while descriptors are still free; it connects later.
private struct RawClient {
    let fd: Int32

    init() throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EMFILE) }
        var timeout = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    func connect(port: UInt16) -> Bool {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    func send(_ text: String) { _ = text.withCString { Glibc.send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) } }
    func receive() -> String {
        var buffer = [UInt8](repeating: 0, count: 256)
        let count = recv(fd, &buffer, buffer.count, 0)
        return count > 0 ? String(decoding: buffer[..<count], as: UTF8.self).trimmingCharacters(in: .newlines) : "recv=\(count)"
    }
}

func descriptorExhaustionScenario() throws {
    let loop = EventLoop.main
    // libdispatch makes the main queue's eventfd on the main loop's first run and aborts if it
    // cannot: run it once while descriptors are free (see MainQueueSource).
    loop.runOnce(blocking: false)
    // libdispatch likewise makes its own epoll instance when its first worker thread starts, and
    // aborts if it cannot: start one now (a plain operation, which makes no loop).
    let warmUp = OperationQueue()
    warmUp.addOperation {}
    warmUp.waitUntilAllOperationsAreFinished()
    let listener = try Listener(.tcp(), on: loop) { connection in
        connection.readLines { event in
            if case .line(let text) = event { connection.writeLine("echo \(text)") }
        }
    }
    var echoed: [String] = []
    let client = try Connection.startConnecting(to: "127.0.0.1", port: listener.port, on: loop)
    client.readLines { event in
        if case .line(let text) = event { echoed.append(text) }
    }
    client.writeLine("before")
    check(loop.spin(until: { echoed.count == 1 }, timeout: .seconds(20)), "no echo before exhaustion")
    let late = try RawClient()
    let group = try EventLoopGroup(loopCount: 1)
    defer { group.shutdownBlocking(gracePeriod: .seconds(5)) }

    // Out of descriptors: a low soft limit, filled up.
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    let open = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").compactMap { Int32($0) }
    limit.rlim_cur = rlim_t(open.max()! + 64)
    check(setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, "setrlimit failed: errno \(errno)")
    var filler: [Int32] = []
    while true {
        let fd = Glibc.open("/dev/null", O_RDONLY | O_CLOEXEC)
        if fd < 0 { break }
        filler.append(fd)
    }
    report("exhausted", errno == EMFILE)

    report("new-loop", failure { _ = try EventLoop() } ?? "made")
    report("thread-loop", threadLoopOutcome())
    report("spinning-operation", spinningOperationOutcome())
    report("listener", failure { _ = try Listener(.tcp(), on: loop) { _ in } } ?? "made")
    report("connection", connectOutcome(port: listener.port, loop: loop))
    report("datagram", failure { _ = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop) } ?? "made")
    report("spawn", failure { _ = try Subprocess.launch(.init(executable: "/bin/true"), on: loop) } ?? "spawned")
    report("file-watch", failure { _ = try loop.observeFile(at: "/tmp") { _ in } } ?? "made")

    // What is open keeps working.
    client.writeLine("during")
    check(loop.spin(until: { echoed.count == 2 }, timeout: .seconds(20)), "no echo while out of descriptors")
    report("echo-during", echoed[1])
    var fired = false
    loop.schedule(after: .milliseconds(5)) { fired = true }
    report("timer", loop.spin(until: { fired }, timeout: .seconds(20)))
    report("spin-timeout", loop.spin(until: { false }, timeout: .milliseconds(20)))
    let worker = group.loops[0]
    let workerTimer = Atomic<Bool>(false)
    // The group's loop arms its first timer now: libevent's timer event is made on demand.
    worker.execute {
        worker.schedule(after: .milliseconds(5)) {
            workerTimer.store(true, ordering: .releasing)
            loop.execute {}  // wakes the main loop's spin
        }
    }
    report("group-timer", loop.spin(until: { workerTimer.load(ordering: .acquiring) }, timeout: .seconds(20)))

    // A client arrives: the listener cannot accept it (EMFILE) and pauses; freed descriptors
    // let it in.
    check(late.connect(port: listener.port), "the late client cannot connect: errno \(errno)")
    late.send("late\n")
    loop.spin(until: { false }, timeout: .milliseconds(200))
    for fd in filler { close(fd) }
    report("late-echo", receiveWhileRunning(loop: loop, client: late))
    report("new-loop-after", failure { _ = try EventLoop() } ?? "made")
    report("thread-loop-after", threadLoopOutcome())
    listener.close()
    client.close()
}

/// Reads the late client's reply on a helper thread while the main loop runs (the reply is
/// the main loop's work).
private func receiveWhileRunning(loop: EventLoop, client: RawClient) -> String {
    let reply = Outcome()
    Thread.detachNewThread {
        reply.set(client.receive())
        loop.execute {}
    }
    loop.spin(until: { reply.value != nil }, timeout: .seconds(25))
    return reply.value ?? "no reply"
}
