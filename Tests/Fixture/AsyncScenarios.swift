import Foundation
import Mainspring

// Scenarios of the async API that need a process of their own: signals, stdin, descriptor
// counts that no parallel test disturbs, and a precondition failure.

/// The open sockets of this process (connections, listeners): what the scenario opens and must
/// close. (libdispatch opens timer and event descriptors of its own lazily; they are not counted.)
private func openSockets() -> Int {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
    return names.filter { name in
        (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)"))?.hasPrefix("socket:") == true
    }.count
}

/// Captured by the tasks under test: it is freed once their closures are.
private final class Tracker: Sendable {}

// MARK: async-cancel

/// Cancelling a task mid-iteration and mid-send: the connection closes with `.cancelled`, the
/// task ends, its closure is released, and the process's sockets are back to the baseline.
@MainActor
func asyncCancelScenario() throws {
    let group = try EventLoopGroup(loopCount: 2)
    Task { @MainActor in
        do {
            try await cancelChecks(group: group)
        } catch {
            fail("async-cancel threw \(error)")
        }
        EventLoop.main.stop()
    }
    try EventLoop.main.run()
}

@MainActor
private func cancelChecks(group: EventLoopGroup) async throws {
    let baseline = openSockets()
    let listener = try await Listener(.tcp(), on: group.loops[0], group: group, options: .init(outputLimit: 16 << 10))
    var accepted = listener.connections.makeAsyncIterator()
    weak var readerTracker: Tracker?
    weak var senderTracker: Tracker?

    // Mid-iteration: a task waiting for lines that never come.
    let reader = try await Connection.connect(to: "127.0.0.1", port: listener.port, on: group.loops[1])
    guard let readConnection = try await accepted.next() else { fail("no connection accepted") }
    do {
        let tracker = Tracker()
        readerTracker = tracker
        let iterating = Task(executorPreference: readConnection.loop) { () -> String in
            _ = tracker
            do {
                for try await _ in readConnection.lines {}
                return "ended"
            } catch {
                return "threw \(error)"
            }
        }
        try await Task.sleep(for: .milliseconds(50))  // suspended in `lines` by now
        iterating.cancel()
        report("iteration-outcome", await iterating.value)
        report("iteration-close-reason", await readConnection.closed)
    }
    // The peer sees the connection end.
    var peerEvents: [String] = []
    do {
        for try await event in reader.lines { peerEvents.append("\(event)") }
    } catch {
        peerEvents.append("threw \(error)")
    }
    report("iteration-peer", peerEvents.joined(separator: ","))
    reader.close()
    _ = await reader.closed

    // Mid-send: a task sending to a peer that never reads.
    let sink = try await Connection.connect(to: "127.0.0.1", port: listener.port, on: group.loops[1])
    guard let sendConnection = try await accepted.next() else { fail("no second connection") }
    let sent = Counter()
    do {
        let tracker = Tracker()
        senderTracker = tracker
        let sending = Task(executorPreference: sendConnection.loop) { () -> String in
            _ = tracker
            let line = String(repeating: "s", count: 4_000)
            do {
                while true {
                    try await sendConnection.send(line: line)
                    sent.increment()
                }
            } catch {
                return "threw \(error)"
            }
        }
        // Wait until the sender is stuck: the kernel buffers and the output limit are full.
        var last = -1
        while sent.value != last {
            last = sent.value
            try await Task.sleep(for: .milliseconds(100))
        }
        sending.cancel()
        report("send-outcome", await sending.value)
        report("send-close-reason", await sendConnection.closed)
        report("sent-before-cancel", last)
    }
    sink.close()
    _ = await sink.closed

    listener.close()
    while listener.isListening { try await Task.sleep(for: .milliseconds(5)) }
    try await Task.sleep(for: .milliseconds(20))
    report("closures-released", readerTracker == nil && senderTracker == nil)
    report("sockets-before", baseline)
    report("sockets-after", openSockets())
    let shutdown = await group.shutdown(gracePeriod: .seconds(2))
    report("shutdown", shutdown)
}

/// A count shared with a task (behind an `NSLock`, which ThreadSanitizer understands).
private final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func increment() { lock.withLock { count += 1 } }
    var value: Int { lock.withLock { count } }
}

// MARK: async-signals

/// `EventLoop.main.signals`: the test sends SIGHUP then SIGTERM to the awaiting task.
@MainActor
func asyncSignalsScenario() throws {
    let signals = try EventLoop.main.signals([SIGTERM, SIGHUP, SIGINT])
    Task { @MainActor in
        report("ready", true)
        var seen: [Int32] = []
        for await signal in signals {
            seen.append(signal)
            report("signal", signal)
            if signal == SIGTERM { break }
        }
        report("seen", seen.map(String.init).joined(separator: ","))
        EventLoop.main.stop()
    }
    try EventLoop.main.run()
}

// MARK: async-stdin

/// `EventLoop.main.lines(from: stdin)` with junk: every event, in order, then the end.
@MainActor
func asyncStdinScenario() throws {
    Task { @MainActor in
        do {
            for await event in try await EventLoop.main.lines(from: STDIN_FILENO, maxLineLength: 16) {
                report("event", event)
            }
            report("ended", true)
        } catch {
            fail("lines(from:) threw \(error)")
        }
        EventLoop.main.stop()
    }
    try EventLoop.main.run()
}

// MARK: async-second-consumer

/// Iterating a connection's input a second time: a precondition failure that says why.
@MainActor
func asyncSecondConsumerScenario() throws {
    let group = try EventLoopGroup(loopCount: 1)
    Task { @MainActor in
        do {
            let listener = try await Listener(.tcp(), on: group.loops[0], group: group)
            let client = try await Connection.connect(to: "127.0.0.1", port: listener.port, on: group.loops[0])
            try await client.send(line: "hello")
            var accepted = listener.connections.makeAsyncIterator()
            guard let connection = try await accepted.next() else { fail("nothing accepted") }
            for try await event in connection.lines {
                report("first", event)
                break
            }
            // Taking turns is fine; two readers at once are not: two tasks read while nothing
            // more arrives, so both suspend, and whichever parks second is refused.
            let waiting = Task(executorPreference: connection.loop) { try await connection.readLine() }
            report("second-reader", "starting")
            _ = try await Task(executorPreference: connection.loop) { try await connection.readLine() }.value
            _ = try await waiting.value
            fail("a second reader was allowed while another was suspended")
        } catch {
            fail("async-second-consumer threw \(error)")
        }
    }
    try EventLoop.main.run()
}
