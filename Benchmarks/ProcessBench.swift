import CBaselines
import Foundation
import Mainspring

/// spawn: children of `/bin/true` started and reaped one after the other for a fixed time
/// (stdin and stdout `/dev/null`, stderr inherited), three ways:
///
/// - `mainspring`: `Subprocess.spawn` on a loop, the next spawn made from the previous child's
///   `onExit` (callbacks: `spawns_per_s`), and the same with `await Subprocess.spawn` and
///   `await child.exit` from a task that prefers the loop (`async_spawns_per_s`). Both are
///   one child at a time.
/// - `foundation-process`: Foundation's `Process`, `run()` then `waitUntilExit()`.
/// - `libevent-c`: a plain-C `posix_spawn` + `waitpid` loop (`ms_baseline_spawn`; it needs no
///   libevent, the name is the scenario family's).
let spawnScenario = Scenario(
    name: "spawn",
    summary: "spawn + wait of /bin/true, one at a time: Subprocess (callbacks, async) vs Foundation Process vs C posix_spawn"
) { runs in
    var samples = Samples()
    let milliseconds = sized(2_000, smoke: 50)
    let nanoseconds = UInt64(milliseconds) * 1_000_000
    for _ in 0..<runs {
        samples.add("mainspring", [
            ("spawns_per_s", spawnWithCallbacks(for: nanoseconds)),
            ("async_spawns_per_s", spawnWithAsync(for: nanoseconds)),
        ])
        samples.add("foundation-process", "spawns_per_s", spawnWithFoundation(for: nanoseconds))
        samples.add("libevent-c", "spawns_per_s", {
            var seconds = 0.0
            let count = ms_baseline_spawn(trueProgram, Int64(milliseconds), &seconds)
            return count > 0 ? Double(count) / seconds : .nan
        }())
    }
    return samples.records(scenario: "spawn")
}

private let trueProgram = "/bin/true"
private let spawnConfiguration = Subprocess.Configuration(executable: trueProgram, standardOutput: .null)

/// Spawns per second on a fresh loop thread, the next spawn from the last one's `onExit`.
private func spawnWithCallbacks(for nanoseconds: UInt64) -> Double {
    onFreshThread {
        let loop = EventLoop.current
        final class State: @unchecked Sendable {
            var count = 0
            var failed = false
            var end: UInt64 = 0
        }
        let state = State()
        let start = nowNanoseconds()
        let deadline = start + nanoseconds
        func spawnNext() {
            do {
                let child = try Subprocess.launch(spawnConfiguration, on: loop)
                child.onExit { status in
                    if status != .exited(0) { state.failed = true }
                    state.count += 1
                    let now = nowNanoseconds()
                    if now >= deadline || state.failed { state.end = now } else { spawnNext() }
                }
            } catch {
                state.failed = true
                state.end = nowNanoseconds()
            }
        }
        spawnNext()
        loop.spin(until: { state.end != 0 })
        return state.failed ? .nan : Double(state.count) / (Double(state.end - start) / 1e9)
    }
}

/// Spawns per second from a task that prefers a loop: `await spawn`, then `await exit`.
private func spawnWithAsync(for nanoseconds: UInt64) -> Double {
    let group = try! EventLoopGroup(loopCount: 1)
    defer { group.shutdownBlocking(gracePeriod: .seconds(2)) }
    let loop = group.loops[0]
    return blockingAwait {
        await withTaskExecutorPreference(loop) {
            let start = nowNanoseconds()
            let deadline = start + nanoseconds
            var count = 0
            var now = start
            while now < deadline {
                guard let child = try? await Subprocess.launch(spawnConfiguration, on: loop),
                      await child.exit == .exited(0)
                else { return .nan }
                count += 1
                now = nowNanoseconds()
            }
            return Double(count) / (Double(now - start) / 1e9)
        }
    }
}

/// Spawns per second with Foundation's `Process`.
private func spawnWithFoundation(for nanoseconds: UInt64) -> Double {
    let start = nowNanoseconds()
    let deadline = start + nanoseconds
    var count = 0
    var now = start
    while now < deadline {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: trueProgram)
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return .nan }
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else { return .nan }
        count += 1
        now = nowNanoseconds()
    }
    return Double(count) / (Double(now - start) / 1e9)
}

/// child-output: `yes` with a 99-byte argument (100-byte lines) read as lines until
/// `childOutputVolume` bytes have arrived, then the child is terminated. From the spawn to the
/// last line, three ways; every line is made into a string.
///
/// - `mainspring`: the stdout `Connection`'s `readLines` callback on a fresh loop
///   (`bytes_per_s`) while an `InputSimulator` writes a record every millisecond into the same
///   loop (`input_p99_ms`: from its write to its handling, under the flood); then the async
///   `lines` from a task that prefers a loop (`async_bytes_per_s`, `async_input_p99_ms`).
/// - `foundation-process`: `Process` with a `Pipe`, `availableData` read in a loop and split
///   into lines (a `String` each) by the benchmark.
/// - `libevent-c`: a bufferevent on the pipe and `evbuffer_readln` (`ms_baseline_child_output`).
let childOutputScenario = Scenario(
    name: "child-output",
    summary: "lines read from yes (100-byte lines): Subprocess lines vs Foundation Pipe vs C bufferevent; input p99 meanwhile"
) { runs in
    var samples = Samples()
    for _ in 0..<runs {
        if variantEnabled("mainspring") {
            let callbacks = childOutputWithCallbacks()
            let async = childOutputWithAsyncLines()
            samples.add("mainspring", [
                ("bytes_per_s", callbacks.rate), ("input_p99_ms", callbacks.inputP99),
                ("async_bytes_per_s", async.rate), ("async_input_p99_ms", async.inputP99),
            ])
        }
        samples.add("foundation-process", "bytes_per_s", childOutputWithFoundation())
        samples.add("libevent-c", "bytes_per_s", {
            var lines: Int64 = 0
            let seconds = ms_baseline_child_output(yesProgram, yesLine, Int64(childOutputVolume), &lines)
            return seconds > 0 && lines >= Int64(childOutputVolume / 100) ? Double(childOutputVolume) / seconds : .nan
        }())
    }
    return samples.records(scenario: "child-output")
}

private let yesProgram = "/usr/bin/yes"
private let yesLine = String(repeating: "y", count: 99)
/// Bytes of lines each run reads (1 MiB in a smoke run).
private var childOutputVolume: Int { sized(256 << 20, smoke: 1 << 20) }

private struct OutputRun {
    var rate: Double
    var inputP99: Double
}

private let failedOutputRun = OutputRun(rate: .nan, inputP99: .nan)

/// `readLines` on a fresh loop thread, with input probes every millisecond meanwhile.
private func childOutputWithCallbacks() -> OutputRun {
    onFreshThread {
        let loop = EventLoop.current
        final class State: @unchecked Sendable {
            var bytes = 0
            var lines = 0
            var end: UInt64 = 0
            var failed = false
        }
        let state = State()
        let volume = childOutputVolume
        let probe = try! InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)))
        let start = nowNanoseconds()
        guard let child = try? Subprocess.launch(.init(executable: yesProgram, arguments: [yesLine]), on: loop),
              let output = child.standardOutput
        else { return failedOutputRun }
        probe.start()
        output.readLines { event in
            guard case .line(let text) = event else {
                if state.end == 0 {
                    state.failed = true
                    state.end = nowNanoseconds()
                }
                return
            }
            state.bytes += text.utf8.count + 1
            state.lines += 1
            if state.bytes >= volume && state.end == 0 {
                state.end = nowNanoseconds()
                output.stopReading()
            }
        }
        loop.spin(until: { state.end != 0 })
        probe.stop()
        output.close()
        child.startTerminating(grace: .seconds(2))
        loop.spin(until: { probe.isFinished && !child.isRunning }, timeout: .seconds(10))
        guard !state.failed else { return failedOutputRun }
        return OutputRun(rate: Double(state.bytes) / (Double(state.end - start) / 1e9),
                         inputP99: probe.latencies.percentile(0.99).inMilliseconds)
    }
}

/// `for try await … in lines` from a task that prefers a loop, with input probes on that loop.
private func childOutputWithAsyncLines() -> OutputRun {
    let group = try! EventLoopGroup(loopCount: 1)
    defer { group.shutdownBlocking(gracePeriod: .seconds(2)) }
    let loop = group.loops[0]
    return blockingAwait {
        await withTaskExecutorPreference(loop) {
            let volume = childOutputVolume
            let probe = try! InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(1)))
            let start = nowNanoseconds()
            guard let child = try? await Subprocess.launch(.init(executable: yesProgram, arguments: [yesLine]), on: loop),
                  let output = child.standardOutput
            else { return failedOutputRun }
            probe.start()
            var bytes = 0
            var end: UInt64 = 0
            do {
                for try await event in output.lines {
                    guard case .line(let text) = event else { break }
                    bytes += text.utf8.count + 1
                    if bytes >= volume {
                        end = nowNanoseconds()
                        break
                    }
                }
            } catch {}
            probe.stop()
            output.close()
            _ = await child.terminate(grace: .seconds(2))
            while !probe.isFinished { try? await loop.sleep(for: .milliseconds(1)) }
            guard end != 0 else { return failedOutputRun }
            return OutputRun(rate: Double(bytes) / (Double(end - start) / 1e9),
                             inputP99: probe.latencies.percentile(0.99).inMilliseconds)
        }
    }
}

/// Foundation: `Process` + `Pipe`, `availableData` split into a `String` per line.
private func childOutputWithFoundation() -> Double {
    let volume = childOutputVolume
    let process = Process()
    process.executableURL = URL(fileURLWithPath: yesProgram)
    process.arguments = [yesLine]
    process.standardInput = FileHandle.nullDevice
    let pipe = Foundation.Pipe()
    process.standardOutput = pipe
    let start = nowNanoseconds()
    guard (try? process.run()) != nil else { return .nan }
    let handle = pipe.fileHandleForReading
    var bytes = 0
    var partial: [UInt8] = []
    var lastLine = ""
    while bytes < volume {
        let data = handle.availableData
        if data.isEmpty { break }
        data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in
            let buffer = raw.bindMemory(to: UInt8.self)
            var lineStart = 0
            for index in buffer.indices where buffer[index] == 10 {
                let piece = UnsafeBufferPointer(rebasing: buffer[lineStart..<index])
                if partial.isEmpty {
                    lastLine = String(decoding: piece, as: UTF8.self)
                } else {
                    partial.append(contentsOf: piece)
                    lastLine = String(decoding: partial, as: UTF8.self)
                    partial.removeAll(keepingCapacity: true)
                }
                bytes += lastLine.utf8.count + 1
                lineStart = index + 1
            }
            partial.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[lineStart...]))
        }
    }
    let end = nowNanoseconds()
    blackHole(lastLine)
    process.terminate()
    try? handle.close()
    process.waitUntilExit()
    return bytes >= volume ? Double(bytes) / (Double(end - start) / 1e9) : .nan
}
