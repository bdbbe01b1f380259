import Dispatch
import Foundation
import Mainspring
import Synchronization

/// The classic recipe for feeding long work to the main queue on plain Dispatch, in a child
/// process because `dispatchMain()` never returns:
///
///     dispatch_async(feederQueue, ^{ dispatch_sync(dispatch_get_main_queue(), block); });
///
/// for every chunk, with input arriving through a `DispatchSource` on the main queue from a pipe
/// that a writer thread fills with timestamped records (as `InputSimulator` does).
///
/// The main queue is drained by `dispatchMain()` (`dispatch-feeder`) or by `RunLoop.main.run()`
/// (`dispatch-feeder-runloop`). The difference matters on Linux: `dispatchMain()` ends the main
/// thread and worker threads serve the main queue, so `main.sync` runs each chunk inline on the
/// feeder queue's thread — no thread hop at all, and not on the main thread (checked: the child
/// reports `on_main_thread`). Only `RunLoop.main` keeps the chunks on the main thread, at the
/// price of a real hop per chunk.
///
/// `mainspring-bench --child dispatch-feeder <chunks> <chunk ns> <input every ns, 0 = none>
/// <dispatch-main | runloop>` reports `{"seconds", "chunk_seconds", "on_main_thread",
/// "latencies_ns"}`: from the first submission to the end of the last chunk, the chunks' own
/// time, the fraction of chunks that ran on the main thread, and each input record's
/// write-to-handler latency.
let dispatchFeederChild = ChildEntryPoint(name: "dispatch-feeder") { arguments in
    guard arguments.count == 4, let chunks = Int(arguments[0]), let chunkNs = UInt64(arguments[1]),
          let everyNs = UInt64(arguments[2]), ["dispatch-main", "runloop"].contains(arguments[3])
    else { throw BenchError.usage("dispatch-feeder <chunks> <chunk ns> <input every ns> <dispatch-main|runloop>") }
    let mainThread = pthread_self()

    /// Touched only on the main queue.
    final class State: @unchecked Sendable {
        var remaining = 0
        var start: UInt64 = 0
        var chunkNanoseconds: UInt64 = 0
        var onMainThread = 0
        var latencies: [Double] = []
        var carry: [UInt8] = []
    }
    let state = State()
    state.remaining = chunks
    state.latencies.reserveCapacity(4_096)
    let stopWriter = Atomic<Bool>(false)

    var fds: [Int32] = [-1, -1]
    guard pipe(&fds) == 0 else { throw BenchError.usage("pipe failed") }
    let (readFD, writeFD) = (fds[0], fds[1])
    _ = fcntl(readFD, F_SETFL, O_NONBLOCK)

    let source = DispatchSource.makeReadSource(fileDescriptor: readFD, queue: .main)
    source.setEventHandler {
        var buffer = [UInt8](repeating: 0, count: 4_096)
        let n = buffer.withUnsafeMutableBytes { read(readFD, $0.baseAddress, $0.count) }
        guard n > 0 else { return }
        state.carry += buffer[0..<n]
        let whole = state.carry.count / 16
        state.carry.withUnsafeBytes { raw in
            for i in 0..<whole {
                let stamp = raw.loadUnaligned(fromByteOffset: i * 16 + 8, as: UInt64.self)
                let now = nowNanoseconds()
                state.latencies.append(Double(now > stamp ? now - stamp : 0))
            }
        }
        state.carry.removeFirst(whole * 16)
    }
    source.resume()

    if everyNs > 0 {
        let writer = Thread {
            let start = nowNanoseconds()
            var sequence: UInt64 = 0
            while !stopWriter.load(ordering: .relaxed) {
                let next = start + (sequence + 1) * everyNs
                var ts = timespec(tv_sec: Int(next / 1_000_000_000), tv_nsec: Int(next % 1_000_000_000))
                _ = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil)
                var record = (sequence, nowNanoseconds())
                _ = withUnsafeBytes(of: &record) { write(writeFD, $0.baseAddress, 16) }
                sequence += 1
            }
        }
        writer.start()
    }

    let feederQueue = DispatchQueue(label: "com.mentalfaculty.feederqueue")
    DispatchQueue.main.async {
        state.start = nowNanoseconds()
        for _ in 0..<chunks {
            feederQueue.async {
                DispatchQueue.main.sync {
                    let chunkStart = nowNanoseconds()
                    burnCPU(nanoseconds: chunkNs)
                    let end = nowNanoseconds()
                    state.chunkNanoseconds += end - chunkStart
                    if pthread_equal(pthread_self(), mainThread) != 0 { state.onMainThread += 1 }
                    state.remaining -= 1
                    if state.remaining == 0 {
                        stopWriter.store(true, ordering: .relaxed)
                        childReportJSON([
                            "seconds": Double(end - state.start) / 1e9,
                            "chunk_seconds": Double(state.chunkNanoseconds) / 1e9,
                            "on_main_thread": Double(state.onMainThread) / Double(chunks),
                            "latencies_ns": state.latencies,
                        ])
                    }
                }
            }
        }
    }
    if arguments[3] == "runloop" {
        while true { RunLoop.main.run() }
    }
    dispatchMain()
}

/// What one feeding run measured.
struct FeedRun {
    /// From the first submission to the end of the last chunk.
    var seconds: Double
    /// The chunks' own time, summed (each chunk timed where it runs).
    var chunkSeconds: Double
    var latencies: LatencyHistogram
    /// `elapsed` beyond the chunks' own time, as a percentage of it.
    var overheadPercent: Double { (seconds - chunkSeconds) / chunkSeconds * 100 }
}

/// Runs the Dispatch feeding recipe in a child (`runLoop`: the main queue drained by `RunLoop.main`).
func dispatchFeeder(chunks: Int, chunkNanoseconds: UInt64, inputEveryNanoseconds: UInt64, runLoop: Bool) throws
    -> FeedRun
{
    let object = try runChildJSON(["dispatch-feeder", "\(chunks)", "\(chunkNanoseconds)", "\(inputEveryNanoseconds)",
                                   runLoop ? "runloop" : "dispatch-main"])
    guard let seconds = object["seconds"] as? Double, let chunkSeconds = object["chunk_seconds"] as? Double,
          let raw = object["latencies_ns"] as? [Double]
    else {
        throw BenchError.childFailed("dispatch-feeder: bad report", 0)
    }
    var latencies = LatencyHistogram()
    for ns in raw { latencies.record(.nanoseconds(Int64(ns))) }
    return FeedRun(seconds: seconds, chunkSeconds: chunkSeconds, latencies: latencies)
}
