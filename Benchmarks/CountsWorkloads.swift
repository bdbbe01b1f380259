import CBaselines
import CTLSBaselines
import Dispatch
import ExampleServices
import Foundation
import Mainspring
import MainspringTLS

// The counted workloads (`mainspring-bench --counts`, Counts.swift): each runs in the child under
// callgrind, its items inside `countedRegion`.

/// `mainspring-bench --child counts <scenario> <variant> <items>`: one counted run.
let countsChild = ChildEntryPoint(name: "counts") { arguments in
    guard arguments.count == 3, let items = Int(arguments[2]), items > 0,
          let entry = countedVariants.first(where: { $0.scenario == arguments[0] && $0.variant == arguments[1] })
    else { throw BenchError.usage("counts <scenario> <variant> <items>") }
    var figures = try entry.body(items)
    figures["items"] = Double(items)
    childReport(figures)
}

/// The items of post-remote's counted runs: a global, so the posted closure captures nothing.
final class CountedTarget: @unchecked Sendable { var value = 0 }
let countedTarget = CountedTarget()

/// post-remote on a fresh loop thread: two uncounted rounds of `warmup` items (so the queue's
/// and the loop's arrays, swapped on every take, have their capacity), then `items` items, with
/// the producer thread's posts and the loop's spin each inside the counted region. With
/// `producerFirst` the producer finishes before the loop looks. Returns the counted wake-ups.
func countedPostRemote(_ items: Int, warmup: Int, producerFirst: Bool) -> Int {
    onFreshThread {
        let loop = try! EventLoop(configuration: countsConfiguration)
        loop.runOnce(blocking: false)  // binds the loop to this thread
        let work: @Sendable () -> Void = { countedTarget.value += 1 }
        var wakeups = 0
        for round in 0..<3 {
            let counted = round == 2
            let count = counted ? items : warmup
            countedTarget.value = 0
            let before = loop.metrics.wakeups
            let produced = DispatchSemaphore(value: 0)
            let producer = Thread {
                let post = { for _ in 0..<count { loop.execute(work) } }
                if counted { countedRegion(post) } else { post() }
                produced.signal()
            }
            producer.start()
            if producerFirst { produced.wait() }
            let drain = { _ = loop.spin(until: { countedTarget.value == count }) }
            if counted { countedRegion(drain) } else { drain() }
            if !producerFirst { produced.wait() }
            wakeups = loop.metrics.wakeups - before
        }
        return wakeups
    }
}

/// The request of the daemon runs (a fixed length, so every request costs the same).
let echoRequest = "ECHO c0 1234567\n"
let echoWarmup = 200

/// Sends `count` requests one at a time, checking each reply.
func echoRequests(_ client: BenchClient, _ count: Int, window: Int = 1) throws {
    try echoRequests(send: { client.send($0) }, readLine: { client.readLine() }, count, window: window)
}

/// Sends `count` requests in windows of `window` (each window one `send`), checking each reply.
func echoRequests(send: (String) -> Void, readLine: () -> Substring?, _ count: Int, window: Int = 1) throws {
    let requests = String(repeating: echoRequest, count: window)
    for _ in 0..<(count / window) {
        send(requests)
        for _ in 0..<window {
            guard readLine() == "c0 1234567" else { throw BenchError.usage("daemon counts: bad or no reply") }
        }
    }
}

/// Requests per write in `daemon-pipelined` (the timed `daemon` scenario's window).
let pipelineWindow = 16

/// The daemon's `LineService` (as the `daemon` scenario runs it: one loop, no idle timeout),
/// one client: warm-up requests, then `items` requests while the loop spins inside the counted
/// region (a nested spin in a posted closure: only the loop's thread is counted, not the client).
func countedEchoMainspring(_ items: Int, window: Int = 1) throws -> [String: Double] {
    let group = try EventLoopGroup(loopCount: 1)
    let service = try LineService(group: group, options: .init(idleTimeout: nil))
    defer { service.shutdown(gracePeriod: .seconds(5)) }
    return try countedEcho(items, window: window, port: service.port, loop: group.loops[0])
}

/// The same with the daemon's async core (`AsyncLineService`: the connection's task and actor
/// run as jobs on the loop, inside the counted spin).
func countedEchoMainspringAsync(_ items: Int, window: Int = 1) throws -> [String: Double] {
    let group = try EventLoopGroup(loopCount: 1)
    let service = blockingAwait { try! await AsyncLineService(group: group, options: .init(idleTimeout: nil)) }
    defer { _ = blockingAwait { await service.shutdown(gracePeriod: .seconds(5)) } }
    return try countedEcho(items, window: window, port: service.port, loop: group.loops[0])
}

/// One client of a Mainspring line service on `loop`: warm-up requests, then `items` requests
/// while the loop spins inside the counted region.
func countedEcho(_ items: Int, window: Int, port: UInt16, loop: EventLoop) throws -> [String: Double] {
    guard let client = BenchClient(port: port) else { throw BenchError.usage("daemon counts: no connection") }
    return try countedEcho(items, window: window, send: { client.send($0) }, readLine: { client.readLine() }, loop: loop)
}

/// The line service of the `tls` scenario (`LineService` with a `TLSServerContext`, one loop, no
/// idle timeout), one TLS client: the handshake and the warm-up requests, then `items`
/// requests while the loop spins inside the counted region.
func countedTLSEchoMainspring(_ items: Int, window: Int) throws -> [String: Double] {
    let files = try countedCertificate()
    let context = try TLSServerContext(configuration: .init(certificateFile: files.certificate, keyFile: files.key))
    let group = try EventLoopGroup(loopCount: 1)
    let service = try LineService(group: group, options: .init(idleTimeout: nil), tls: context)
    defer { service.shutdown(gracePeriod: .seconds(5)) }
    guard let client = TLSBenchClient(port: service.port, caFile: files.certificate) else {
        throw BenchError.usage("tls counts: no connection")
    }
    return try countedEcho(items, window: window, send: { _ = client.send($0) }, readLine: { client.readLineText() },
                           loop: group.loops[0])
}

/// The C bufferevent_openssl line service, one TLS client: the handshake and the warm-up
/// requests, then `items` requests while the server's thread dispatches inside the counted
/// region (until it stops: the client's close is counted with either size, and cancels out).
func countedTLSEchoC(_ items: Int, window: Int) throws -> [String: Double] {
    let files = try countedCertificate()
    var port: UInt16 = 0
    guard let handle = ms_tls_count_echo_start(files.certificate, files.key, &port) else {
        throw BenchError.usage("tls counts: the C server cannot load the certificate")
    }
    defer { ms_tls_server_stop(handle) }
    try {
        guard let client = TLSBenchClient(port: port, caFile: files.certificate) else {
            throw BenchError.usage("tls counts: no connection")
        }
        let send: (String) -> Void = { _ = client.send($0) }
        try echoRequests(send: send, readLine: { client.readLineText() }, echoWarmup)
        ms_tls_count_begin(handle)
        try echoRequests(send: send, readLine: { client.readLineText() }, items, window: window)
    }()  // the client closes before the server stops
    return [:]
}

/// The certificate of the counted TLS runs: made once by `runCounts` (the openssl command cannot
/// be started under valgrind, which holds descriptors of its own) and named to the children in
/// the environment (`MAINSPRING_BENCH_TLS_DIRECTORY`).
func countedCertificate() throws -> BenchCertificate {
    guard let directory = ProcessInfo.processInfo.environment[countedCertificateVariable] else {
        throw BenchError.usage("tls counts: \(countedCertificateVariable) is not set (run them through --counts)")
    }
    return BenchCertificate(directory: directory)
}

let countedCertificateVariable = "MAINSPRING_BENCH_TLS_DIRECTORY"

/// One client's requests against a Mainspring line service on `loop`: warm-up requests, then
/// `items` requests while the loop spins inside the counted region.
func countedEcho(_ items: Int, window: Int, send: (String) -> Void, readLine: () -> Substring?,
                         loop: EventLoop) throws -> [String: Double]
{
    try echoRequests(send: send, readLine: readLine, echoWarmup)
    final class Flag: @unchecked Sendable { var done = false }
    let flag = Flag()
    let started = DispatchSemaphore(value: 0)
    let finished = DispatchSemaphore(value: 0)
    let pollsBefore = Guarded(0)
    let polls = Guarded(0)
    loop.execute {
        pollsBefore.withLock { $0 = loop.metrics.polls }
        countedRegion {
            started.signal()
            loop.spin(until: { flag.done })
        }
        polls.withLock { $0 = loop.metrics.polls }
        finished.signal()
    }
    started.wait()
    try echoRequests(send: send, readLine: readLine, items, window: window)
    loop.execute { flag.done = true }
    finished.wait()
    return ["polls": Double(polls.withLock { $0 } - pollsBefore.withLock { $0 })]
}

/// The C bufferevent line service, one client; its thread's whole dispatch is counted (the
/// connection's set-up and the warm-up cost the same with either size, so they cancel out).
func countedEchoC(_ items: Int, window: Int = 1) throws -> [String: Double] {
    var port: UInt16 = 0
    let handle = ms_count_echo_start(&port)
    defer { ms_baseline_echo_stop(handle) }
    guard let client = BenchClient(port: port) else { throw BenchError.usage("daemon counts: no connection") }
    try echoRequests(client, echoWarmup)
    try echoRequests(client, items, window: window)
    return [:]
}

/// A `Feeder` job of `items` chunks on a fresh loop thread, after an uncounted warm-up job;
/// feeding and spinning until it finishes are counted.
func countedFeeder(_ items: Int, pacing: Feeder.Pacing) -> [String: Double] {
    onFreshThread {
        let loop = try! EventLoop(configuration: countsConfiguration)
        let feeder = Feeder(loop: loop, pacing: pacing)
        final class Sum { var value = 0 }
        let sum = Sum()
        let warmup = feeder.feed(chunks: 1_000) { sum.value &+= $0 }
        loop.spin(until: { warmup.isFinished })
        let pollsBefore = loop.metrics.polls
        countedRegion {
            let job = feeder.feed(chunks: items) { sum.value &+= $0 }
            loop.spin(until: { job.isFinished })
        }
        blackHole(sum.value)
        return ["polls": Double(loop.metrics.polls - pollsBefore)]
    }
}
