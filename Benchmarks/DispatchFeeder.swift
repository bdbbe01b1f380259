import Dispatch
import Foundation
import Synchronization

/// The article's recipe on plain Dispatch ("Feeding the main queue"), in a child process because
/// `dispatchMain()` never returns:
///
///     dispatch_async(feederQueue, ^{ dispatch_sync(dispatch_get_main_queue(), block); });
///
/// for every chunk, with input arriving through a `DispatchSource` on the main queue from a pipe
/// that a writer thread fills with timestamped records (as `InputSimulator` does).
///
/// `mainspring-bench --child dispatch-feeder <chunks> <chunk ns> <input every ns, 0 = none>`
/// reports `{"seconds": …, "latencies_ns": […]}`: from the first submission to the end of the
/// last chunk, and each input record's write-to-handler latency.
let dispatchFeederChild = ChildEntryPoint(name: "dispatch-feeder") { arguments in
    guard arguments.count == 3, let chunks = Int(arguments[0]), let chunkNs = UInt64(arguments[1]),
          let everyNs = UInt64(arguments[2])
    else { throw BenchError.usage("dispatch-feeder <chunks> <chunk ns> <input every ns>") }

    /// Touched only on the main queue.
    final class State: @unchecked Sendable {
        var remaining = 0
        var start: UInt64 = 0
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
                    burnCPU(nanoseconds: chunkNs)
                    state.remaining -= 1
                    if state.remaining == 0 {
                        let seconds = Double(nowNanoseconds() - state.start) / 1e9
                        stopWriter.store(true, ordering: .relaxed)
                        childReportJSON(["seconds": seconds, "latencies_ns": state.latencies])
                    }
                }
            }
        }
    }
    dispatchMain()
}

/// Runs the article's recipe in a child; returns (seconds, latencies in ns).
func dispatchFeeder(chunks: Int, chunkNanoseconds: UInt64, inputEveryNanoseconds: UInt64) throws -> (Double, [Double]) {
    let object = try runChildJSON(["dispatch-feeder", "\(chunks)", "\(chunkNanoseconds)", "\(inputEveryNanoseconds)"])
    guard let seconds = object["seconds"] as? Double, let latencies = object["latencies_ns"] as? [Double] else {
        throw BenchError.childFailed("dispatch-feeder: bad report", 0)
    }
    return (seconds, latencies)
}
