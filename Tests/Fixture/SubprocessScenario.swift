import Foundation
import Mainspring

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
                        let child = try await Subprocess.spawn(configuration, on: loop)
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
