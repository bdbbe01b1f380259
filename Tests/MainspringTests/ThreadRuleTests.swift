import Foundation
import Mainspring
import MainspringTestSupport
import Synchronization
import Testing

/// The library's rule for which thread may call what, on the handles that are `Sendable`:
/// what takes no callback works from any thread (posted to the loop when called elsewhere);
/// what registers a callback on a connection or child, or reads a handle's loop-owned state, is
/// for the loop's thread — and the compiler refuses it in async code, where the call would be off
/// the loop (a task) rather than trap at run time.
@Suite("Thread rules", .serialized)
struct ThreadRuleTests {
    @Test("write, writeLine and stopReading from a plain thread and from a task: posted to the loop, in order, no trap")
    func actionsFromAnyThread() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let (writer, reader) = try await Connection.makePair(on: loop)
        // A plain thread: before, each of these stopped the program ("must be called on the
        // loop's own thread").
        await onPlainThread {
            #expect(!loop.isCurrent)
            for index in 0..<50 {
                switch index % 4 {
                case 0: writer.writeLine("line \(index)")
                case 1: writer.write("line \(index)\n")
                case 2: writer.write(Array("line \(index)\n".utf8))
                default: writer.writeLine("line \(index) and more".prefix(5 + String(index).count))
                }
            }
        }
        // A task off the loop.
        for index in 50..<100 { writer.writeLine("line \(index)") }
        for index in 0..<100 {
            #expect(try await reader.readLine() == .line("line \(index)"))
        }
        // stopReading from another thread ends a callback reader; what comes next waits for the
        // next reader, byte for byte.
        let seen = Mutex<[String]>([])
        try await loop.submit {
            reader.readLines { event in if case .line(let text) = event { seen.withLock { $0.append(text) } } }
        }
        try await writer.send(line: "to the callback")
        #expect(await eventually(timeout: .seconds(60)) { seen.withLock { $0 } == ["to the callback"] })
        await onPlainThread { reader.stopReading() }
        try await loop.submit {}  // the posted stop has run
        try await writer.send(line: "to the next reader")
        #expect(try await reader.readLine() == .line("to the next reader"))
        #expect(seen.withLock { $0 } == ["to the callback"])
        writer.close()
        reader.close()
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("a plain thread's writeLine, close(), writeLine keep their order on the loop: the peer reads the first line, then end of input")
    func closeKeepsItsPlaceAmongPostedWrites() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let (writer, reader) = try await Connection.makePair(on: loop)
        // The loop is held while the three calls are posted, so that all of them wait in its
        // queue together and only their priorities could reorder them.
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        loop.execute(priority: .input) {
            holding.signal()
            release.wait()
        }
        await onPlainThread {
            holding.wait()
            writer.writeLine("before the close")
            writer.close()
            writer.writeLine("after the close")
            release.signal()
        }
        #expect(try await reader.readLine() == .line("before the close"))
        #expect(try await reader.readLine() == .endOfFile, "the line written after close() was sent")
        reader.close()
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("DatagramSocket.close() from a plain thread: posted, the socket closes and its port is free")
    func datagramCloseFromAnyThread() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        // A port below the kernel's ephemeral range: no other test's port-0 socket can take it
        // between the close and the bind again (a port freed from that range could be).
        let free = try await loop.submit { try DatagramTests.unusedPortBelowEphemeralRange(on: loop) }
        let port = free.port
        let socket = try await bindSoonAfterAClose(port: port, on: loop)
        await onPlainThread { socket.close() }
        #expect(try await loop.submit { socket.isClosed })
        // The port is free again: a new socket binds it.
        let again = try await bindSoonAfterAClose(port: port, on: loop)
        await again.close()
        await group.shutdown(gracePeriod: .seconds(5))
    }

    /// Binds `port`, which a socket of this process has just closed. The kernel frees a port
    /// when the last reference to its socket goes, and a child another test is spawning right
    /// then holds a copy of every descriptor from its fork until its exec closes the
    /// close-on-exec ones (seen once in CI: EADDRINUSE just after the close). So EADDRINUSE is
    /// retried for up to 10 s; a socket that really stayed open keeps the port the whole time
    /// and fails the test.
    private func bindSoonAfterAClose(port: UInt16, on loop: EventLoop) async throws -> DatagramSocket {
        var result: Result<DatagramSocket, DatagramError>?
        _ = await eventuallyAsync(timeout: .seconds(10)) {
            do throws(DatagramError) {
                result = .success(try await DatagramSocket.bind(to: "127.0.0.1", port: port, on: loop))
            } catch {
                result = .failure(error)
            }
            if case .failure(.system(_, EADDRINUSE)) = result { return false }
            return true
        }
        return try result!.get()
    }

    @Test("execute(after:), execute(every:) and Feeder.enqueue from a plain thread and a task: run on the loop's thread, never early, cancellable there")
    func timersAndFeederJobsFromAnyThread() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let runs = Locked<[String]>([])
        // A plain thread: before, schedule(after:) and feed stopped the program here.
        let (cancelled, ticker) = await onPlainThread { () -> (ScheduledTimer, ScheduledTimer) in
            let start = ContinuousClock.now
            loop.execute(after: .milliseconds(20)) {
                let early = ContinuousClock.now - start < .milliseconds(20)
                runs.withLock { $0.append("once on loop: \(loop.isCurrent), early: \(early)") }
            }
            let cancelled = loop.execute(after: .milliseconds(5)) { runs.withLock { $0.append("cancelled ran") } }
            cancelled.cancel()
            let ticker = loop.execute(every: .milliseconds(2)) { _ in
                runs.withLock { $0.append("tick on loop: \(loop.isCurrent)") }
            }
            return (cancelled, ticker)
        }
        #expect(await eventually(timeout: .seconds(60)) {
            runs.value.contains { $0.hasPrefix("once") } && runs.value.filter { $0.hasPrefix("tick") }.count >= 3
        })
        await onPlainThread { ticker.cancel() }
        try await loop.submit {}  // the posted cancel has run
        let ticks = runs.value.filter { $0.hasPrefix("tick") }.count
        try await loop.sleep(for: .milliseconds(30))
        #expect(runs.value.filter { $0.hasPrefix("tick") }.count == ticks)
        #expect(runs.value.filter { !$0.hasPrefix("tick") } == ["once on loop: true, early: false"])
        #expect(runs.value.allSatisfy { !$0.hasPrefix("tick") || $0 == "tick on loop: true" })
        #expect(cancelled.isCancelled && ticker.isCancelled)

        // A task off the loop: a feeder job, its chunks in order on the loop's thread.
        let feeder = Feeder(loop: loop)
        let chunks = Locked<[Int]>([])
        let job = feeder.enqueue(chunks: 200) { index in
            if loop.isCurrent { chunks.withLock { $0.append(index) } }
        }
        #expect(await job.outcome == .completed)
        #expect(chunks.value == Array(0..<200))
        await group.shutdown(gracePeriod: .seconds(5))
    }

    @Test("a timer scheduled with execute(every:) or execute(after:) does not keep its loop alive once the loop is dropped")
    func anyThreadTimersDoNotKeepTheirLoopAlive() async throws {
        let freed = try await onPlainThread { () throws -> Bool in
            weak var dropped: EventLoop?
            var handles: [ScheduledTimer] = []
            do {
                let loop = try EventLoop()
                dropped = loop
                handles.append(loop.execute(every: .seconds(3600)) { _ in })
                handles.append(loop.execute(after: .seconds(3600)) {})
                loop.runOnce(blocking: false)  // the posts run: both timers are armed
            }
            handles.removeAll()
            return dropped == nil
        }
        #expect(freed, "a pending any-thread timer kept its loop (and its descriptors) alive")
    }

    /// The compiler's half of the rule, checked with the compiler: the library's module as
    /// built for this test run, a file that calls loop-only members from async code (each one
    /// refused, with the async way in the message), and a file that makes the same calls from
    /// synchronous code and the any-thread ones from async code (accepted), and
    /// a file whose any-thread calls share a non-`Sendable` value with their caller (refused).
    @Test("the compiler refuses loop-only members in async code and accepts them in synchronous code")
    func compilerRefusesLoopOnlyCallsInAsyncCode() async throws {
        let misuse = """
        import Foundation
        import Mainspring
        func misuse(_ connection: Connection, _ child: Subprocess, _ feeder: Feeder, _ socket: DatagramSocket,
                    _ queue: OperationQueue, _ loop: EventLoop) async {
            connection.readLines { _ in }
            connection.readBytes { _ in }
            connection.readBytes(exactly: 4) { _ in }
            connection.onClose { _ in }
            connection.onWritable {}
            _ = connection.bufferedOutputBytes
            _ = connection.isReadingPaused
            child.onExit { _ in }
            _ = feeder.oldestPendingJobWait
            _ = socket.statistics
            _ = socket.queuedDatagrams
            _ = socket.connectedPeer
            _ = socket.isClosed
            _ = queue.waitUntilAllOperationsAreFinished(spinning: loop)
            // One rule: every loop-only call, each naming its twin.
            let handle = loop.schedule(after: .seconds(1)) {}
            handle.cancel()
            _ = loop.schedule(every: .seconds(1)) { _ in }
            let job = feeder.feed(chunks: 3) { _ in }
            job.onCompletion { _ in }
            _ = feeder.feed([1, 2, 3]) { _ in }
            _ = try? loop.watch(0, for: .read) { _ in }
            _ = try? loop.readLines(from: 0) { _ in }
            _ = try? loop.onSignal(SIGUSR1) {}
            _ = try? loop.observeFile(at: "/tmp") { _ in }
            _ = loop.spin(until: { true })
            _ = loop.runOnce(blocking: false)
            _ = loop.animate(eachStepDuration: .seconds(1), steps: { _ in })
            let timeline = Timeline(loop: loop)
            timeline.start { _ in }
        }
        """
        let refused = try await typecheck(misuse)
        let lines = refused.split(separator: "\n").filter { $0.contains(": error:") }
        #expect(lines.count == 28, "\(refused)")
        #expect(lines.allSatisfy { $0.contains("unavailable from asynchronous contexts") }, "\(refused)")
        #expect(refused.contains("in async code await `closed`"), "\(refused)")
        #expect(refused.contains("in async code await `exit`"), "\(refused)")
        for twin in ["`execute(after:_:)`", "`execute(every:_:)`", "`enqueue(chunks:_:)`", "`enqueue(_:_:)`", "`await job.outcome`",
                     "`ScheduledTimer`", "`lines(from:)`", "`signals(_:)`", "`fileChanges(at:)`", "`await timeline.run()`"]
        {
            #expect(refused.contains(twin), "no error names \(twin)")
        }

        let fine = """
        import Mainspring
        func onTheLoop(_ connection: Connection, _ loop: EventLoop, _ child: Subprocess) {
            _ = loop.schedule(after: .seconds(1)) {}
            connection.readLines { _ in }
            connection.onClose { _ in }
            child.onExit { _ in }
            _ = connection.bufferedOutputBytes
        }
        func fromATask(_ connection: Connection, _ loop: EventLoop, _ socket: DatagramSocket) async throws {
            connection.writeLine("any thread")
            connection.write([1, 2, 3])
            connection.stopReading()
            _ = try await loop.submit { connection.bufferedOutputBytes }
            await socket.close()
            _ = EventLoop.current
            // The any-thread forms: what async code, a simulation's body included, uses.
            let timer = loop.execute(after: .seconds(1)) {}
            timer.cancel()
            _ = loop.execute(every: .seconds(1)) { $0.cancel() }
            let feeder = Feeder(loop: loop)
            _ = feeder.enqueue(chunks: 3) { _ in }
            _ = await feeder.enqueue([1, 2, 3]) { _ in }.outcome
        }
        """
        let accepted = try await typecheck(fine)
        #expect(!accepted.contains("error:"), "\(accepted)")

        // What the any-thread forms refuse: work that shares unsynchronized state with its caller.
        let racy = """
        import Mainspring
        final class Tally { var count = 0 }
        func fromATask(_ loop: EventLoop, _ feeder: Feeder) async {
            let tally = Tally()
            loop.execute(after: .seconds(1)) { tally.count += 1 }
            feeder.enqueue(chunks: 3) { _ in tally.count += 1 }
            print(tally.count)
        }
        """
        let refusedRace = try await typecheck(racy)
        let raceErrors = refusedRace.split(separator: "\n").filter { $0.contains(": error:") }
        #expect(raceErrors.count == 2 && raceErrors.allSatisfy { $0.contains("non-Sendable") }, "\(refusedRace)")
    }
}

/// The compiler's diagnostics for `source` type-checked against the Mainspring module this test
/// bundle was built with (its `Modules` directory sits beside the bundle).
private func typecheck(_ source: String) async throws -> String {
    let bundleDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    var buildDirectory = bundleDirectory
    while !FileManager.default.fileExists(atPath: buildDirectory.appendingPathComponent("Modules/Mainspring.swiftmodule").path) {
        let parent = buildDirectory.deletingLastPathComponent()
        try #require(parent.path != buildDirectory.path, "no Modules/Mainspring.swiftmodule above \(bundleDirectory.path)")
        buildDirectory = parent
    }
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let file = FileManager.default.temporaryDirectory.appendingPathComponent("mainspring-typecheck-\(UUID().uuidString).swift")
    try source.write(to: file, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(at: file) }
    let arguments = [
        "swiftc", "-swift-version", "6", "-typecheck", "-diagnostic-style", "llvm", file.path,
        "-I", buildDirectory.appendingPathComponent("Modules").path,
        "-Xcc", "-fmodule-map-file=" + buildDirectory.appendingPathComponent("CMainspringSystem.build/module.modulemap").path,
        "-I", root.appendingPathComponent("CLibevent").path,
        "-I", root.appendingPathComponent("Sources/CMainspringSystem/include").path,
    ]
    return try await onPlainThread { () throws -> String in
        let result = try runProgramSynchronously("/usr/bin/env", arguments: arguments, timeout: .seconds(300))
        return result.stdout + result.stderr
    }
}
