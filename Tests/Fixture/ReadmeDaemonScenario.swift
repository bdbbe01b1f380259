import Foundation
import Mainspring

// README.md, "The main thread: DispatchQueue.main, @MainActor, actors on loops": the daemon, as
// written there (its top-level code is the body of `readmeDaemonScenario`). Keep the two in step.

/// Main-thread state: only @MainActor code touches it.
@MainActor final class Service {
    var handled = 0
    var pending = 0
    var inputEnded = false

    func reply(to line: String) -> String {
        handled += 1
        return "echo \(line)"
    }

    func stopWhenIdle() {
        if inputEnded && pending == 0 { EventLoop.main.stop() }
    }
}

/// Storage on a background loop: every call runs on that loop's thread.
actor Storage {
    let loop: EventLoop
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    private var lines: [String] = []

    init(loop: EventLoop) { self.loop = loop }

    func append(_ line: String) -> Int {
        lines.append(line)
        return lines.count
    }
}

@MainActor
func readmeDaemonScenario() throws {
    let storageLoops = try EventLoopGroup(loopCount: 1)   // a loop on a thread of its own
    let storage = Storage(loop: storageLoops.loops[0])
    let service = Service()

    let reader = try EventLoop.main.readLines(from: 0) { event in
        switch event {
        case .line(let line):
            service.pending += 1
            Task { @MainActor in                          // runs on EventLoop.main
                let reply = service.reply(to: line)
                let stored = await storage.append(line)   // hops to the storage loop and back
                print("\(reply) (\(stored) stored)")
                service.pending -= 1
                service.stopWhenIdle()
            }
        case .endOfFile, .error:
            service.inputEnded = true
            service.stopWhenIdle()
        case .tooLong, .invalidUTF8:
            break
        }
    }
    let terminate = try EventLoop.main.onSignal(SIGTERM) { EventLoop.main.stop() }
    DispatchQueue.main.asyncAfter(deadline: .now() + 3600) { print("still up") }  // Dispatch works too

    try EventLoop.main.run()                              // the main thread is the loop's now
    print("handled \(service.handled) lines")
    reader.cancel()
    terminate.cancel()                                    // restores SIGTERM's default
}
