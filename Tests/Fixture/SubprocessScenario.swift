import Foundation
import Mainspring
import Synchronization

// MARK: thousand-children

/// 1,000 short-lived children in parallel — half `/bin/true`, half `echo`ing their index through
/// a stdout pipe that is read to its end — in a process of its own, so that the descriptor
/// counts see only this scenario's: in the test process, other suites' children hold pipes of
/// their own for longer than any wait. Reports the children that exited 0, the outputs that
/// matched, the pidfds and pipes before and after (waiting up to 20 s for the counts to come
/// back), and the zombies left.
@MainActor
func thousandChildrenScenario() throws {
    let group = try EventLoopGroup(loopCount: 1)
    let loop = group.loops[0]
    Task { @MainActor in
        // Counted once both loops run: each loop holds descriptors of its own, pipes among them.
        let before = descriptorKinds()
        do {
            let results = try await withThrowingTaskGroup(of: (Bool, Bool).self) { tasks in
                for index in 0..<1_000 {
                    tasks.addTask {
                        let echoes = index % 2 == 1
                        let configuration = echoes
                            ? Subprocess.Configuration(executable: "/bin/sh", arguments: ["-c", "echo \(index)"])
                            : Subprocess.Configuration(executable: "/bin/true")
                        let child = try await Subprocess.launch(configuration, on: loop)
                        var lines: [String] = []
                        if echoes, let output = child.standardOutput {
                            for try await event in output.lines {
                                if case .line(let text) = event { lines.append(text) }
                            }
                        }
                        let exit = await child.exit
                        return (exit.isSuccess, !echoes || lines == ["\(index)"])
                    }
                }
                var results: [(Bool, Bool)] = []
                for try await result in tasks { results.append(result) }
                return results
            }
            await group.shutdown(gracePeriod: .seconds(2))
            report("succeeded", results.filter(\.0).count)
            report("outputs-matched", results.filter(\.1).count)
            let deadline = ContinuousClock.now + .seconds(20)
            var after = descriptorKinds()
            while (after.pidfds > before.pidfds || after.pipes > before.pipes) && ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(10))  // a cancelled sleep only polls sooner
                after = descriptorKinds()
            }
            report("pidfds-before", before.pidfds)
            report("pidfds-after", after.pidfds)
            report("pipes-before", before.pipes)
            report("pipes-after", after.pipes)
            var zombies = zombieChildren()
            while !zombies.isEmpty && ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(10))
                zombies = zombieChildren()
            }
            report("zombies", zombies.count)
        } catch {
            fail("thousand-children threw \(error)")
        }
        EventLoop.main.stop()
    }
    try EventLoop.main.run()
}

// MARK: foundation-process-beside

/// Foundation's `Process` beside `Subprocess`: ten children of each at once, Foundation's run on
/// a plain thread, ours on a loop. Reports each side's exit statuses (sorted) and whether
/// SIGCHLD's disposition is what it was before. In a process of its own: Foundation's `run()`
/// on Linux reads past a buffer while it lists `/proc/self/fd`, which crashed the test process
/// once, with its many descriptors (swift-corelibs-foundation#5472); here there are a few.
@MainActor
func foundationProcessBesideScenario() throws {
    let before = sigchldDispositionBytes()
    let group = try EventLoopGroup(loopCount: 1)
    let loop = group.loops[0]
    let theirs = Mutex<[Int32]?>(nil)
    let thread = Thread {
        var statuses: [Int32] = []
        for code in 20..<30 {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", "sleep 0.02; exit \(code)"]
            let pipe = Pipe()
            process.standardOutput = pipe
            do { try process.run() } catch { fail("Foundation's Process.run threw \(error)") }
            _ = pipe.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            statuses.append(process.terminationStatus)
        }
        theirs.withLock { $0 = statuses }
    }
    thread.start()
    Task { @MainActor in
        do {
            let ours = try await withThrowingTaskGroup(of: Subprocess.ExitStatus.self) { tasks in
                for code in 0..<10 {
                    tasks.addTask {
                        try await Subprocess.launch(.init(executable: "/bin/sh", arguments: ["-c", "sleep 0.05; exit \(code)"]),
                                                   on: loop).exit
                    }
                }
                var statuses: [Subprocess.ExitStatus] = []
                for try await status in tasks { statuses.append(status) }
                return statuses
            }
            let deadline = ContinuousClock.now + .seconds(60)
            while theirs.withLock({ $0 }) == nil && ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(10))
            }
            await group.shutdown(gracePeriod: .seconds(2))
            report("ours", ours.map { "\($0)" }.sorted().joined(separator: ","))
            report("theirs", (theirs.withLock { $0 } ?? []).sorted().map(String.init).joined(separator: ","))
            report("sigchld-unchanged", sigchldDispositionBytes() == before)
        } catch {
            fail("foundation-process-beside threw \(error)")
        }
        EventLoop.main.stop()
    }
    try EventLoop.main.run()
}

/// SIGCHLD's handler and flags, as bytes to compare.
private func sigchldDispositionBytes() -> [UInt8] {
    var action = sigaction()
    sigaction(SIGCHLD, nil, &action)
    return withUnsafeBytes(of: &action.__sigaction_handler) { Array($0) } + withUnsafeBytes(of: &action.sa_flags) { Array($0) }
}

/// How many of this process's descriptors are pidfds and pipes (`/proc/self/fd` links).
private func descriptorKinds() -> (pidfds: Int, pipes: Int) {
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return (0, 0) }
    var pidfds = 0
    var pipes = 0
    for entry in entries {
        guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(entry)") else {
            continue
        }
        if target == "anon_inode:[pidfd]" { pidfds += 1 } else if target.hasPrefix("pipe:") { pipes += 1 }
    }
    return (pidfds, pipes)
}

/// This process's children that are zombies (exited, not reaped), from `/proc`.
private func zombieChildren() -> [Int32] {
    let me = getpid()
    guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
    return entries.compactMap { entry -> Int32? in
        guard let pid = Int32(entry),
              let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // "pid (comm) S ppid …"
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 1, fields[0] == "Z", Int32(fields[1]) == me else { return nil }
        return pid
    }
}
