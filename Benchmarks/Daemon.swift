import CBaselines
import ExampleServices
import Foundation
import Mainspring

/// daemon: the daemon's line service on one loop — with callbacks (`mainspring`, `LineService`)
/// and with async/await (`mainspring-async`, `AsyncLineService`, the core of `mainspring-daemon`)
/// — vs a plain-C bufferevent service, under the same in-process loopback load: 32 connections,
/// each sending windows of 16 pipelined `ECHO` requests and waiting for the 16 replies. Plus ECHO
/// latency while another client keeps `WORK` running on the loop's feeder.
let daemonScenario = Scenario(
    name: "daemon",
    summary: "line service vs C bufferevent echo: 32 loopback clients, pipelined; ECHO p99 under WORK"
) { runs in
    var samples = Samples()
    let duration = Duration.milliseconds(sized(1_500, smoke: 100))
    for _ in 0..<runs {
        samples.add("mainspring", {
            let group = try! EventLoopGroup(loopCount: 1)
            let service = try! LineService(group: group, options: .init(idleTimeout: nil))
            let plain = loadTest(port: service.port, duration: duration)
            let busy = loadTest(port: service.port, duration: duration, workClient: true)
            service.shutdown(gracePeriod: .seconds(1))
            return [("requests_per_s", plain.rate), ("p99_ms", plain.p99), ("cpu_us_per_request", plain.cpuPerRequest),
                    ("busy_echo_p99_ms", busy.p99)]
        }())
        samples.add("mainspring-async", {
            // The daemon's async core (AsyncLineService: a task per connection on its loop).
            let group = try! EventLoopGroup(loopCount: 1)
            let service = blockingAwait { try! await AsyncLineService(group: group, options: .init(idleTimeout: nil)) }
            let plain = loadTest(port: service.port, duration: duration)
            let busy = loadTest(port: service.port, duration: duration, workClient: true)
            blockingAwait { await service.shutdown(gracePeriod: .seconds(1)) }
            return [("requests_per_s", plain.rate), ("p99_ms", plain.p99), ("cpu_us_per_request", plain.cpuPerRequest),
                    ("busy_echo_p99_ms", busy.p99)]
        }())
        samples.add("libevent-c", {
            var port: UInt16 = 0
            let handle = ms_baseline_echo_start(&port)
            let plain = loadTest(port: port, duration: duration)
            ms_baseline_echo_stop(handle)
            return [("requests_per_s", plain.rate), ("p99_ms", plain.p99), ("cpu_us_per_request", plain.cpuPerRequest)]
        }())
    }
    return samples.records(scenario: "daemon")
}

struct LoadResult {
    let rate: Double
    let p99: Double
    /// Process CPU time (all threads: clients and server) per request, in microseconds.
    let cpuPerRequest: Double
}

private func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// 32 client threads, one connection each, for `duration`; with `workClient`, one more client
/// sends `WORK 200` (about 10 ms of fed work) back to back.
private func loadTest(port: UInt16, duration: Duration, connections: Int = 32, window: Int = 16,
                      workClient: Bool = false) -> LoadResult
{
    loadTest(connect: { BenchClient(port: port) }, duration: duration, connections: connections, window: window,
             workClient: workClient)
}

/// The daemon's load over any stream socket: `connect` makes each client's connection (TCP
/// loopback, a Unix socket).
func loadTest(connect: @escaping @Sendable () -> BenchClient?, duration: Duration, connections: Int = 32,
              window: Int = 16, workClient: Bool = false) -> LoadResult
{
    let results = Guarded<(count: Int, latencies: [Double])>((0, []))
    let cpuBefore = processCPUSeconds()
    let deadline = nowNanoseconds() + UInt64(duration.components.seconds) * 1_000_000_000
        + UInt64(duration.components.attoseconds / 1_000_000_000)
    let finished = DispatchGroup()
    let stopWork = Guarded(false)
    if workClient {
        finished.enter()
        Thread {
            defer { finished.leave() }
            guard let client = connect() else { return }
            while !stopWork.withLock({ $0 }) {
                client.send("WORK 200\n")
                guard client.readLine() != nil else { return }
            }
        }.start()
        usleep(20_000)
    }
    let echoes = DispatchGroup()
    for c in 0..<connections {
        echoes.enter()
        Thread {
            defer { echoes.leave() }
            guard let client = connect() else { return }
            var latencies: [Double] = []
            var count = 0
            var sequence = 0
            while nowNanoseconds() < deadline {
                var request = ""
                for _ in 0..<window {
                    request += "ECHO c\(c) \(sequence)\n"
                    sequence += 1
                }
                let sent = nowNanoseconds()
                client.send(request)
                for _ in 0..<window {
                    guard client.readLine() != nil else { return }
                    latencies.append(Double(nowNanoseconds() - sent) / 1e6)
                    count += 1
                }
            }
            results.withLock {
                $0.count += count
                $0.latencies += latencies
            }
        }.start()
    }
    echoes.wait()
    stopWork.withLock { $0 = true }
    finished.wait()
    let (count, latencies) = results.withLock { $0 }
    let cpu = processCPUSeconds() - cpuBefore
    let seconds = Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    return LoadResult(rate: Double(count) / seconds, p99: percentile(latencies, 0.99),
                      cpuPerRequest: cpu / Double(max(count, 1)) * 1e6)
}

/// A blocking TCP socket connected to 127.0.0.1:`port`, with Nagle's algorithm off (the
/// benchmarks' clients: `BenchClient`, the KV scenario's RESP client); nil when it cannot connect.
func connectLoopback(port: UInt16) -> Int32? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard rc == 0 else {
        close(fd)
        return nil
    }
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    return fd
}

/// A blocking loopback client.
final class BenchClient {
    let fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0

    init?(port: UInt16) {
        guard let fd = connectLoopback(port: port) else { return nil }
        self.fd = fd
    }

    /// A blocking client of the Unix stream socket at `path`.
    init?(unixPath path: String) {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(fd)
            return nil
        }
        withUnsafeMutableBytes(of: &address.sun_path) { sunPath in
            for (index, byte) in bytes.enumerated() { sunPath[index] = byte }
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        if rc != 0 {
            close(fd)
            return nil
        }
    }

    deinit { close(fd) }

    func send(_ text: String) {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            bytes = bytes.dropFirst(n)
        }
    }

    /// Reads and drops exactly `count` bytes (after what `readLine` buffered); false at EOF.
    func readBytes(_ count: Int) -> Bool {
        var needed = count
        let buffered = buffer.count - start
        let taken = min(buffered, needed)
        start += taken
        needed -= taken
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        while needed > 0 {
            var chunk = [UInt8](repeating: 0, count: 16_384)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return false }
            if n > needed {
                buffer += chunk[needed..<n]
                needed = 0
            } else {
                needed -= n
            }
        }
        return true
    }

    func readLine() -> Substring? {
        while true {
            if let newline = buffer[start...].firstIndex(of: 0x0A) {
                let line = Substring(decoding: buffer[start..<newline], as: UTF8.self)
                start = newline + 1
                if start == buffer.count {
                    buffer.removeAll(keepingCapacity: true)
                    start = 0
                }
                return line
            }
            var chunk = [UInt8](repeating: 0, count: 16_384)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return nil }
            buffer += chunk[0..<n]
        }
    }
}
