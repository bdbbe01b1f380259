import Foundation
import Mainspring

// `make leaks` runs this under valgrind memcheck: loops, timers, watchers, line readers,
// signals, connections, feeders and groups are created, used and freed, then the process exits.
// memcheck must find no "definitely lost" block.
func leakCheckScenario() throws {
    let rounds = Int(CommandLine.arguments.dropFirst(2).first ?? "") ?? 200
    // Loops made and freed, with work and sources on them.
    for _ in 0..<rounds {
        let loop = try EventLoop()
        loop.execute {}
        _ = loop.runOnce(blocking: false)
    }
    let loop = EventLoop.main
    // Timers fired and cancelled.
    var fired = 0
    for i in 0..<rounds {
        let timer = loop.schedule(after: .zero) { fired += 1 }
        if i % 2 == 0 { timer.cancel() }
    }
    let repeating = loop.schedule(every: .milliseconds(1)) { _ in }
    loop.spin(until: { fired == rounds / 2 }, timeout: .seconds(10))
    repeating.cancel()
    // Watchers and line readers on pipes, to end of file.
    for _ in 0..<rounds / 10 {
        let pipe = Foundation.Pipe()
        var ended = false
        let reader = try loop.readLines(from: pipe.fileHandleForReading.fileDescriptor) { event in
            if event == .endOfFile { ended = true }
        }
        pipe.fileHandleForWriting.write(Data("one\ntwo\n".utf8))
        try pipe.fileHandleForWriting.close()
        loop.spin(until: { ended }, timeout: .seconds(5))
        reader.cancel()
    }
    // A signal watcher.
    let watcher = try loop.onSignal(SIGUSR1) {}
    watcher.cancel()
    // Connections through a listener.
    var closed = 0
    let listener = try Listener(.tcp(), on: loop) { connection in
        connection.readLines { event in
            if case .line(let text) = event { connection.writeLine(text) }
            if event == .endOfFile { connection.close() }
        }
    }
    for _ in 0..<rounds / 10 {
        let client = try Connection.startConnecting(to: "127.0.0.1", port: listener.port, on: loop)
        client.onClose { _ in closed += 1 }
        client.readLines { event in if event == .endOfFile { client.close() } }
        client.writeLine("hello")
        client.shutdownOutput()
    }
    loop.spin(until: { closed == rounds / 10 }, timeout: .seconds(20))
    listener.close()
    // A feeder job, and a loop group.
    let feeder = Feeder(loop: loop)
    let job = feeder.feed(chunks: 1_000) { _ in }
    loop.spin(until: { job.isFinished }, timeout: .seconds(10))
    let group = try EventLoopGroup(loopCount: 2)
    for worker in group.loops { worker.execute {} }
    group.shutdownBlocking(gracePeriod: .seconds(1))
    report("fired", fired)
    report("closed", closed)
    report("job", job.progress.completed)
}
