import CBaselines
import CTLSBaselines
import Dispatch
import ExampleServices
import Foundation
import Mainspring
import MainspringTLS

// mainspring-bench --counts [scenario …] [--runs N] [--json] [--callers] [--keep DIR]
//
// Deterministic per-item costs: instructions, reference-counting calls and heap allocations,
// counted by valgrind's callgrind rather than timed. Each variant runs in a child process
// (`--child counts <scenario> <variant> <items>`) under callgrind twice, with N1 and N2 items;
// only code inside `ms_counted_region` (Sources/CBaselines) is counted, per thread, and
//
//     per item = (count with N2 items − count with N1 items) / (N2 − N1)
//
// so that what the region costs once (its first post, the last wake-up, growing a buffer the
// first time) cancels out. `--runs N` repeats each pair N times (default 2) to show the spread.

// MARK: What is counted

/// The functions whose calls are counted, grouped into the reported metrics.
private enum Counted {
    /// Every retain/release entry point of the Swift runtime that compiled code calls.
    static let retains = ["swift_retain", "swift_retain_n", "swift_nonatomic_retain", "swift_nonatomic_retain_n",
                          "swift_bridgeObjectRetain", "swift_bridgeObjectRetain_n",
                          "swift_unknownObjectRetain", "swift_unknownObjectRetain_n"]
    static let releases = ["swift_release", "swift_release_n", "swift_nonatomic_release", "swift_nonatomic_release_n",
                           "swift_bridgeObjectRelease", "swift_bridgeObjectRelease_n",
                           "swift_unknownObjectRelease", "swift_unknownObjectRelease_n"]
    /// libc's allocation entry points (glibc's internal aliases too): a heap allocation is one
    /// call to any of them, whoever calls it — a Swift object (`swift_allocObject` →
    /// `swift_slowAlloc` → `malloc`) counts once, as a C `malloc` does. `realloc` counts as an
    /// allocation even when it grows a block in place.
    static let allocators = ["malloc", "__libc_malloc", "calloc", "__libc_calloc", "realloc", "__libc_realloc",
                             "posix_memalign", "__posix_memalign", "aligned_alloc", "memalign", "__libc_memalign",
                             "valloc", "__libc_valloc", "pvalloc", "__libc_pvalloc"]
    static let frees = ["free", "__libc_free", "cfree"]
    static let swiftObjects = ["swift_allocObject"]
    /// The runtime's dynamic exclusivity check (a class property or global accessed where the
    /// compiler cannot prove exclusive access statically).
    static let accessChecks = ["swift_beginAccess"]

    static let all = retains + releases + allocators + frees + swiftObjects + accessChecks
    private static let allSet = Set(all)
    static func isCounted(_ name: String) -> Bool { allSet.contains(name) }
}

// MARK: The workloads (run in the child, under callgrind)

/// Runs `body` inside `ms_counted_region`: the only code callgrind counts (on this thread).
func countedRegion(_ body: () -> Void) {
    withoutActuallyEscaping(body) { body in
        var work = body
        withUnsafeMutablePointer(to: &work) { pointer in
            ms_counted_region({ context in
                context!.assumingMemoryBound(to: (() -> Void).self).pointee()
            }, pointer)
        }
    }
}

/// The loop configuration of the counted post and feeder runs: the defaults, except a poll
/// interval of one hour. Under callgrind (~50× slower) the loop would poll every 2 ms of *wall*
/// time, every few hundred items instead of every ~50,000, at points that depend on timing; with
/// this interval the counted region never polls for the interval's sake, so the counts are
/// deterministic. The clock read after every callback (the price of the poll-interval rule) is
/// still counted.
private let countsConfiguration = EventLoop.Configuration(pollInterval: .seconds(3_600))

/// The same for libevent's `max_dispatch_interval` in the polling C loop (1,000 s).
private let countsMaxDispatchMicroseconds: Int32 = 1_000_000_000

/// post-remote's warm-up rounds post this many items (the larger size), so that neither counted
/// run grows an array.
private let remoteWarmup = 70_000

/// One variant of a counted scenario: what the child runs with `items` items, and the two sizes.
private struct CountedVariant: Sendable {
    let scenario: String
    let variant: String
    let small: Int
    let large: Int
    /// Runs the workload with `items` items; returns figures to check the run by (wake-ups…).
    let body: @Sendable (_ items: Int) throws -> [String: Double]
}

/// What an item is, per scenario (for the table's legend).
private let countedScenarios: [(name: String, item: String)] = [
    ("post-local", "one closure posted on the loop's own thread and run (a chain: each item posts the next)"),
    ("post-remote", "one closure posted from another thread and run (the producer posts all before the loop drains; -interleaved: both at once)"),
    ("daemon", "one `ECHO` request read, parsed and answered over loopback TCP (one client, one request at a time)"),
    ("daemon-pipelined", "one `ECHO` request, as `daemon`, sent in windows of 16 (one write of 16 requests, then the 16 replies), as the timed scenario's clients send them"),
    ("tls-pipelined", "one `ECHO` request, as `daemon-pipelined`, over TLS 1.3 (one established connection, RSA-2048 certificate; the handshake and the warm-up requests are not counted)"),
    ("http", "one keep-alive `GET /hello` read, routed and answered over loopback TCP (one client, one request at a time)"),
    ("http-client", "one keep-alive `GET /hello` sent and its response read by the client, against the C evhttp server of `http` (one connection, one request at a time; only the client's thread counted)"),
    ("feeder", "one chunk of a `Feeder.feed(chunks:)` job (the chunk adds its index to a sum; no C baseline)"),
]

private let countedVariants: [CountedVariant] = [
    // post-local: the chain of PostLocal.swift, and the C loop re-activating one event.
    CountedVariant(scenario: "post-local", variant: "mainspring", small: 20_000, large: 70_000) { items in
        _ = mainspringPostLocal(items, configuration: countsConfiguration, around: countedRegion)
        return [:]
    },
    CountedVariant(scenario: "post-local", variant: "mainspring-no-metrics", small: 20_000, large: 70_000) { items in
        _ = mainspringPostLocal(items, metrics: false, configuration: countsConfiguration, around: countedRegion)
        return [:]
    },
    CountedVariant(scenario: "post-local", variant: "libevent-c-polling", small: 20_000, large: 70_000) { items in
        ms_count_post_local(Int64(items), countsMaxDispatchMicroseconds)
        return [:]
    },
    CountedVariant(scenario: "post-local", variant: "libevent-c", small: 20_000, large: 70_000) { items in
        ms_count_post_local(Int64(items), 0)
        return [:]
    },
    // post-remote: non-capturing closures (PostRemote.swift) vs the C mutex + eventfd queue.
    CountedVariant(scenario: "post-remote", variant: "mainspring", small: 20_000, large: remoteWarmup) { items in
        ["wakeups": Double(countedPostRemote(items, warmup: remoteWarmup, producerFirst: true))]
    },
    CountedVariant(scenario: "post-remote", variant: "libevent-c", small: 20_000, large: remoteWarmup) { items in
        ["wakeups": Double(ms_count_post_remote(Int64(items), Int64(remoteWarmup), 1))]
    },
    // The same with the producer and the loop running at once, as in the timed scenario: how
    // the threads interleave (under valgrind: its thread scheduler) sets the wake-ups, so these
    // vary from run to run.
    CountedVariant(scenario: "post-remote", variant: "mainspring-interleaved", small: 20_000, large: remoteWarmup) { items in
        ["wakeups": Double(countedPostRemote(items, warmup: remoteWarmup, producerFirst: false))]
    },
    CountedVariant(scenario: "post-remote", variant: "libevent-c-interleaved", small: 20_000, large: remoteWarmup) { items in
        ["wakeups": Double(ms_count_post_remote(Int64(items), Int64(remoteWarmup), 0))]
    },
    // daemon: the line service the `daemon` scenario measures vs the C bufferevent service.
    CountedVariant(scenario: "daemon", variant: "mainspring", small: 1_000, large: 4_000) { items in
        try countedEchoMainspring(items)
    },
    CountedVariant(scenario: "daemon", variant: "mainspring-async", small: 1_000, large: 4_000) { items in
        try countedEchoMainspringAsync(items)
    },
    CountedVariant(scenario: "daemon", variant: "libevent-c", small: 1_000, large: 4_000) { items in
        try countedEchoC(items)
    },
    // daemon-pipelined: the same, with the timed scenario's windows of 16 requests.
    CountedVariant(scenario: "daemon-pipelined", variant: "mainspring", small: 1_024, large: 4_096) { items in
        try countedEchoMainspring(items, window: pipelineWindow)
    },
    CountedVariant(scenario: "daemon-pipelined", variant: "mainspring-async", small: 1_024, large: 4_096) { items in
        try countedEchoMainspringAsync(items, window: pipelineWindow)
    },
    CountedVariant(scenario: "daemon-pipelined", variant: "libevent-c", small: 1_024, large: 4_096) { items in
        try countedEchoC(items, window: pipelineWindow)
    },
    // tls-pipelined: the line service of the `tls` scenario (TLSBench.swift) vs the C
    // bufferevent_openssl service, windows of 16 requests as there.
    CountedVariant(scenario: "tls-pipelined", variant: "mainspring", small: 1_024, large: 4_096) { items in
        try countedTLSEchoMainspring(items, window: pipelineWindow)
    },
    CountedVariant(scenario: "tls-pipelined", variant: "libevent-c", small: 1_024, large: 4_096) { items in
        try countedTLSEchoC(items, window: pipelineWindow)
    },
    // http: the server of the `http` scenario vs the C evhttp server (HTTPBench.swift).
    CountedVariant(scenario: "http", variant: "mainspring", small: 1_000, large: 4_000) { items in
        try countedHTTPMainspring(items, configuration: countsConfiguration)
    },
    CountedVariant(scenario: "http", variant: "libevent-c", small: 1_000, large: 4_000) { items in
        try countedHTTPC(items)
    },
    // http-client: HTTPClient vs the C evhttp client (HTTPClientBench.swift), one C server.
    CountedVariant(scenario: "http-client", variant: "mainspring", small: 1_000, large: 4_000) { items in
        try countedHTTPClientMainspring(items, configuration: countsConfiguration)
    },
    CountedVariant(scenario: "http-client", variant: "libevent-c", small: 1_000, large: 4_000) { items in
        try countedHTTPClientC(items)
    },
    // feeder: a chunk within a turn (a budget that never runs out) and a turn per chunk.
    CountedVariant(scenario: "feeder", variant: "budget", small: 20_000, large: 70_000) { items in
        countedFeeder(items, pacing: .budget(.seconds(3_600)))
    },
    CountedVariant(scenario: "feeder", variant: "one-chunk", small: 5_000, large: 20_000) { items in
        countedFeeder(items, pacing: .oneChunkPerTurn)
    },
]

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
private final class CountedTarget: @unchecked Sendable { var value = 0 }
private let countedTarget = CountedTarget()

/// post-remote on a fresh loop thread: two uncounted rounds of `warmup` items (so the queue's
/// and the loop's arrays, swapped on every take, have their capacity), then `items` items, with
/// the producer thread's posts and the loop's spin each inside the counted region. With
/// `producerFirst` the producer finishes before the loop looks. Returns the counted wake-ups.
private func countedPostRemote(_ items: Int, warmup: Int, producerFirst: Bool) -> Int {
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
private let echoRequest = "ECHO c0 1234567\n"
private let echoWarmup = 200

/// Sends `count` requests one at a time, checking each reply.
private func echoRequests(_ client: BenchClient, _ count: Int, window: Int = 1) throws {
    try echoRequests(send: { client.send($0) }, readLine: { client.readLine() }, count, window: window)
}

/// Sends `count` requests in windows of `window` (each window one `send`), checking each reply.
private func echoRequests(send: (String) -> Void, readLine: () -> Substring?, _ count: Int, window: Int = 1) throws {
    let requests = String(repeating: echoRequest, count: window)
    for _ in 0..<(count / window) {
        send(requests)
        for _ in 0..<window {
            guard readLine() == "c0 1234567" else { throw BenchError.usage("daemon counts: bad or no reply") }
        }
    }
}

/// Requests per write in `daemon-pipelined` (the timed `daemon` scenario's window).
private let pipelineWindow = 16

/// The daemon's `LineService` (as the `daemon` scenario runs it: one loop, no idle timeout),
/// one client: warm-up requests, then `items` requests while the loop spins inside the counted
/// region (a nested spin in a posted closure: only the loop's thread is counted, not the client).
private func countedEchoMainspring(_ items: Int, window: Int = 1) throws -> [String: Double] {
    let group = try EventLoopGroup(loopCount: 1)
    let service = try LineService(group: group, options: .init(idleTimeout: nil))
    defer { service.shutdown(gracePeriod: .seconds(5)) }
    return try countedEcho(items, window: window, port: service.port, loop: group.loops[0])
}

/// The same with the daemon's async core (`AsyncLineService`: the connection's task and actor
/// run as jobs on the loop, inside the counted spin).
private func countedEchoMainspringAsync(_ items: Int, window: Int = 1) throws -> [String: Double] {
    let group = try EventLoopGroup(loopCount: 1)
    let service = blockingAwait { try! await AsyncLineService(group: group, options: .init(idleTimeout: nil)) }
    defer { _ = blockingAwait { await service.shutdown(gracePeriod: .seconds(5)) } }
    return try countedEcho(items, window: window, port: service.port, loop: group.loops[0])
}

/// One client of a Mainspring line service on `loop`: warm-up requests, then `items` requests
/// while the loop spins inside the counted region.
private func countedEcho(_ items: Int, window: Int, port: UInt16, loop: EventLoop) throws -> [String: Double] {
    guard let client = BenchClient(port: port) else { throw BenchError.usage("daemon counts: no connection") }
    return try countedEcho(items, window: window, send: { client.send($0) }, readLine: { client.readLine() }, loop: loop)
}

/// The line service of the `tls` scenario (`LineService` with a `TLSServerContext`, one loop, no
/// idle timeout), one TLS client: the handshake and the warm-up requests, then `items`
/// requests while the loop spins inside the counted region.
private func countedTLSEchoMainspring(_ items: Int, window: Int) throws -> [String: Double] {
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
private func countedTLSEchoC(_ items: Int, window: Int) throws -> [String: Double] {
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
private func countedCertificate() throws -> BenchCertificate {
    guard let directory = ProcessInfo.processInfo.environment[countedCertificateVariable] else {
        throw BenchError.usage("tls counts: \(countedCertificateVariable) is not set (run them through --counts)")
    }
    return BenchCertificate(directory: directory)
}

private let countedCertificateVariable = "MAINSPRING_BENCH_TLS_DIRECTORY"

/// One client's requests against a Mainspring line service on `loop`: warm-up requests, then
/// `items` requests while the loop spins inside the counted region.
private func countedEcho(_ items: Int, window: Int, send: (String) -> Void, readLine: () -> Substring?,
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
private func countedEchoC(_ items: Int, window: Int = 1) throws -> [String: Double] {
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
private func countedFeeder(_ items: Int, pacing: Feeder.Pacing) -> [String: Double] {
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

// MARK: Reading callgrind's output

/// What one callgrind run counted: instructions in all, each function's own instructions, and
/// every call edge (callee → caller → calls).
private struct CallgrindCounts {
    var instructions: Double = 0
    var ownInstructions: [String: Double] = [:]
    var edges: [String: [String: Double]] = [:]
    /// The instructions inside each edge's calls (the callee and what it calls).
    var edgeInstructions: [String: [String: Double]] = [:]
    /// Each edge's calls by call site: `File.swift:line` from the debug info (inlined code has
    /// its own file and line), or `~File.swift:line`, the nearest line before it in the machine
    /// code, for a call without a line of its own (retains and releases the compiler inserted).
    var sites: [String: [String: [String: Double]]] = [:]

    /// Parses a callgrind.out file written with `--dump-line=yes --compress-strings=no
    /// --compress-pos=no`. Functions without a symbol (`0x…`) are named `0x… in <object file>`.
    init(file: String) throws {
        let text = try String(contentsOfFile: file, encoding: .utf8)
        var object = ""
        var calleeObject: String?
        var functionFile = ""
        var sourceFile = ""
        var function = ""
        var callee = ""
        var pendingCalls: Double?
        var lastSite: String?
        var totals: Double?
        var summary: Double?
        func qualified(_ name: Substring, _ object: String) -> String {
            name.hasPrefix("0x") ? "\(name) in \(object)" : String(name)
        }
        for line in text.split(separator: "\n", omittingEmptySubsequences: true) {
            guard let first = line.first else { continue }
            if first.isNumber {
                // "<source line> <instructions>": right after `calls=`, the call site and the
                // calls' inclusive cost; otherwise the current function's own.
                let fields = line.split(separator: " ")
                guard fields.count >= 2, let cost = Double(fields[fields.count - 1]) else { continue }
                let known = fields[0] != "0" && sourceFile != "???" && !sourceFile.hasSuffix("<compiler-generated>")
                let here = known ? "\(sourceFile.split(separator: "/").last ?? ""):\(fields[0])" : nil
                defer { if let here { lastSite = here } }
                if let count = pendingCalls {
                    pendingCalls = nil
                    edges[callee, default: [:]][function, default: 0] += count
                    edgeInstructions[callee, default: [:]][function, default: 0] += cost
                    if let site = here ?? lastSite.map({ "~" + $0 }) {
                        sites[callee, default: [:]][function, default: [:]][site, default: 0] += count
                    }
                } else {
                    ownInstructions[function, default: 0] += cost
                }
            } else if line.hasPrefix("ob=") {
                object = String(line.dropFirst(3))
            } else if line.hasPrefix("fl=") {
                functionFile = String(line.dropFirst(3))
                sourceFile = functionFile
            } else if line.hasPrefix("fi=") || line.hasPrefix("fe=") {
                sourceFile = String(line.dropFirst(3))
            } else if line.hasPrefix("fn=") {
                function = qualified(line.dropFirst(3), object)
                sourceFile = functionFile
                calleeObject = nil
                lastSite = nil
            } else if line.hasPrefix("cob=") {
                calleeObject = String(line.dropFirst(4))
            } else if line.hasPrefix("cfn=") {
                callee = qualified(line.dropFirst(4), calleeObject ?? object)
                calleeObject = nil
            } else if line.hasPrefix("calls=") {
                // "calls=<count> <target position>"
                pendingCalls = Double(line.dropFirst(6).split(separator: " ").first ?? "") ?? 0
            } else if line.hasPrefix("totals:") {
                totals = Double(line.dropFirst(7).split(separator: " ").first ?? "")
            } else if line.hasPrefix("summary:") {
                summary = Double(line.dropFirst(8).split(separator: " ").first ?? "")
            }
        }
        self.instructions = totals ?? summary ?? 0
    }

    /// The counts of one run written with `--separate-threads=yes` (`file-01`, `file-02`, … one
    /// per thread), added up. Per thread, because callgrind keeps one call graph for all threads
    /// otherwise: a call edge that a counted thread created is incremented by the same call on
    /// an uncounted thread too (cost 0, but a call), so a client thread's allocations would show
    /// up as the server's.
    init(threadFilesOf file: String) throws {
        let directory = (file as NSString).deletingLastPathComponent
        let prefix = (file as NSString).lastPathComponent
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
            .filter { $0 == prefix || $0.hasPrefix(prefix + "-") }
            .sorted()
        for name in names {
            let part = try CallgrindCounts(file: directory + "/" + name)
            guard part.instructions > 0 else { continue }
            instructions += part.instructions
            for (function, cost) in part.ownInstructions { ownInstructions[function, default: 0] += cost }
            for (callee, callers) in part.edges {
                for (caller, count) in callers { edges[callee, default: [:]][caller, default: 0] += count }
            }
            for (callee, callers) in part.edgeInstructions {
                for (caller, cost) in callers { edgeInstructions[callee, default: [:]][caller, default: 0] += cost }
            }
            for (callee, callers) in part.sites {
                for (caller, bySite) in callers {
                    for (site, count) in bySite { sites[callee, default: [:]][caller, default: [:]][site, default: 0] += count }
                }
            }
        }
        guard instructions > 0 else {
            throw BenchError.usage("\(file): nothing counted (no totals, or ms_counted_region never ran)")
        }
    }

    /// Calls to `names`, except those made by one of the `Counted` functions themselves (the
    /// runtime's `swift_bridgeObjectRetain` calls `swift_retain`, `realloc` may call `malloc`:
    /// each such operation counts once, as what compiled code called).
    func calls(to names: [String]) -> Double {
        names.reduce(0) { sum, name in
            sum + (edges[name] ?? [:]).reduce(0) { $0 + (Counted.isCounted($1.key) ? 0 : $1.value) }
        }
    }

    /// The metrics, as totals for the run (the per-item figure is a difference of two runs).
    var figures: [(String, Double)] {
        var figures: [(String, Double)] = [
            ("instructions", instructions),
            ("swift_retain", calls(to: ["swift_retain"])),
            ("swift_release", calls(to: ["swift_release"])),
            ("retain_release", calls(to: ["swift_retain", "swift_release"])),
        ]
        for name in Counted.retains + Counted.releases where !["swift_retain", "swift_release"].contains(name) {
            figures.append((name, calls(to: [name])))
        }
        figures += [
            ("refcount_all", calls(to: Counted.retains + Counted.releases)),
            ("heap_allocs", calls(to: Counted.allocators)),
            ("swift_allocObject", calls(to: Counted.swiftObjects)),
            ("frees", calls(to: Counted.frees)),
            ("swift_beginAccess", calls(to: Counted.accessChecks)),
        ]
        return figures
    }
}

/// Metrics reported even when zero; the other retain/release variants and the exclusivity
/// checks only where they occur.
private let alwaysReported: Set<String> = ["instructions", "swift_retain", "swift_release", "retain_release",
                                           "refcount_all", "heap_allocs", "swift_allocObject", "frees"]

// MARK: Running

/// The valgrind options of every counted run.
private let callgrindOptions = ["--tool=callgrind", "--collect-atstart=no", "--toggle-collect=ms_counted_region",
                                "--separate-threads=yes", "--dump-instr=no", "--dump-line=yes", "--compress-strings=no", "--compress-pos=no"]

/// Runs one child under callgrind and parses its output.
private func callgrind(_ variant: CountedVariant, items: Int, directory: String, tag: String) throws
    -> (CallgrindCounts, [String: Double])
{
    let name = "\(variant.scenario)-\(variant.variant)-\(items)-\(tag)"
    let outFile = "\(directory)/callgrind.out.\(name)"
    let logFile = "\(directory)/valgrind.\(name).log"
    let object: [String: Any]
    do {
        object = try runChildJSON(["counts", variant.scenario, variant.variant, "\(items)"],
                                  wrappedIn: ["valgrind"] + callgrindOptions
                                      + ["--callgrind-out-file=\(outFile)", "--log-file=\(logFile)"])
    } catch BenchError.childFailed(_, let status) {
        throw BenchError.childFailed("valgrind … --child counts \(variant.scenario) \(variant.variant) \(items) (see \(logFile))",
                                     status)
    }
    return (try CallgrindCounts(threadFilesOf: outFile), object.compactMapValues { $0 as? Double })
}

/// One pair of runs (N1, N2) of a variant: the per-item figures, and the two profiles.
private struct PairResult {
    let perItem: [(String, Double)]
    let small: CallgrindCounts
    let large: CallgrindCounts
    let checks: [String: (Double, Double)]
}

private func runPair(_ variant: CountedVariant, directory: String, run: Int) throws -> PairResult {
    let (small, smallChecks) = try callgrind(variant, items: variant.small, directory: directory, tag: "run\(run)")
    let (large, largeChecks) = try callgrind(variant, items: variant.large, directory: directory, tag: "run\(run)")
    let span = Double(variant.large - variant.small)
    let largeFigures = Dictionary(uniqueKeysWithValues: large.figures)
    let perItem = small.figures.map { metric, value in (metric, (largeFigures[metric]! - value) / span) }
    var checks: [String: (Double, Double)] = [:]
    for (key, value) in smallChecks where key != "items" { checks[key] = (value, largeChecks[key] ?? .nan) }
    return PairResult(perItem: perItem, small: small, large: large, checks: checks)
}

/// `mainspring-bench --counts …`: every counted variant (of the named scenarios), `runs` pairs
/// each; a table (or JSON records), the ratios to the C baselines, and with `callers` where the
/// counted calls come from.
func runCounts(names: [String], runs: Int, json: Bool, callers: Bool, keep: String?) throws {
    for name in names where !countedScenarios.contains(where: { $0.name == name }) {
        throw BenchError.usage("no counted scenario '\(name)' (they are: \(countedScenarios.map(\.name).joined(separator: ", ")))")
    }
    var selected = countedVariants.filter { (names.isEmpty || names.contains($0.scenario)) && variantEnabled($0.variant) }
    // TLS's certificate comes from the openssl command: without it, tls-pipelined is left out
    // (saying so) unless it was asked for by name.
    var certificate: BenchCertificate?
    if selected.contains(where: { $0.scenario == "tls-pipelined" }) {
        if let openssl = findExecutable("openssl") {
            certificate = try BenchCertificate(openssl: openssl)
            setenv(countedCertificateVariable, certificate!.directory, 1)
        } else if names.contains("tls-pipelined") {
            throw BenchError.usage("tls-pipelined needs the openssl command (apt-get install openssl)")
        } else {
            selected.removeAll { $0.scenario == "tls-pipelined" }
            FileHandle.standardError.write(Data("tls-pipelined left out: no openssl command to make its certificate\n".utf8))
        }
    }
    defer { certificate?.remove() }
    guard !selected.isEmpty else { throw BenchError.usage("no counted variant selected (MAINSPRING_BENCH_VARIANTS?)") }
    let check = Process()
    check.executableURL = URL(fileURLWithPath: "/bin/sh")
    check.arguments = ["-c", "command -v valgrind"]
    check.standardOutput = FileHandle.nullDevice
    try check.run()
    check.waitUntilExit()
    guard check.terminationStatus == 0 else {
        throw BenchError.usage("--counts needs valgrind (`make bench-counts` installs it; or apt-get install valgrind)")
    }
    let directory = keep ?? NSTemporaryDirectory() + "mainspring-counts-\(getpid())"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { if keep == nil { try? FileManager.default.removeItem(atPath: directory) } }

    var records: [BenchRecord] = []
    var lastPairs: [(CountedVariant, PairResult)] = []
    let started = nowNanoseconds()
    for variant in selected {
        if !json {
            FileHandle.standardError.write(Data("counting \(variant.scenario) \(variant.variant): \(runs) × (\(variant.small), \(variant.large)) items under callgrind…\n".utf8))
        }
        var samples = Samples()
        var pair: PairResult?
        var checks: [String: [(Double, Double)]] = [:]
        for run in 0..<runs {
            let result = try runPair(variant, directory: directory, run: run)
            samples.add(variant.variant, result.perItem.map { ("\($0.0)_per_item", $0.1) })
            for (key, value) in result.checks { checks[key, default: []].append(value) }
            pair = result
        }
        let variantRecords = samples.records(scenario: variant.scenario).filter { record in
            alwaysReported.contains(String(record.metric.dropLast("_per_item".count)))
                || record.min != 0 || record.max != 0
        }
        records += variantRecords
        if let pair { lastPairs.append((variant, pair)) }
        if !json && !checks.isEmpty {
            let text = checks.sorted { $0.key < $1.key }.map { key, values in
                "\(key) " + values.map { "\(format($0.0))/\(format($0.1))" }.joined(separator: ", ")
            }.joined(separator: "; ")
            FileHandle.standardError.write(Data("  (N1/N2 runs: \(text))\n".utf8))
        }
    }
    let seconds = Double(nowNanoseconds() - started) / 1e9

    if json {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        print(String(decoding: try encoder.encode(records), as: UTF8.self))
        return
    }
    print("$ mainspring-bench \(CommandLine.arguments.dropFirst().joined(separator: " "))")
    print("""
        per item = (count with N2 items − count with N1 items) / (N2 − N1), each run counted by
          valgrind \(callgrindOptions.joined(separator: " "))
        counted: the code inside ms_counted_region (per thread); heap_allocs: calls to malloc, calloc,
          realloc, posix_memalign, aligned_alloc, memalign, valloc (a Swift object's allocation counts once);
          refcount_all: every swift_*retain*/release* entry point (incl. _n, bridgeObject, unknownObject)
        """)
    for (name, item) in countedScenarios where selected.contains(where: { $0.scenario == name }) {
        let sizes = selected.filter { $0.scenario == name }.map { "\($0.variant) \($0.small)/\($0.large)" }
        print("  \(name): item = \(item); N1/N2: \(sizes.joined(separator: ", "))")
    }
    print("")
    print(countsTable(records, runs: runs))
    print("")
    print(ratios(records))
    print(String(format: "(%d valgrind runs in %.0f s)", selected.count * runs * 2, seconds))
    if callers {
        print("")
        print(callerReport(lastPairs))
    }
}

/// The records as one row per variant (medians; "[min–max]" where the runs differ), then the
/// retain/release variants that occur, per variant. (`--json` has every record.)
private func countsTable(_ records: [BenchRecord], runs: Int) -> String {
    let columns: [(metric: String, title: String)] = [
        ("instructions", "instructions"), ("swift_retain", "retain"), ("swift_release", "release"),
        ("retain_release", "retain+release"), ("refcount_all", "all refcount"), ("heap_allocs", "heap allocs"),
        ("swift_allocObject", "allocObject"), ("frees", "frees"), ("swift_beginAccess", "beginAccess"),
    ]
    func cell(_ record: BenchRecord?) -> String {
        guard let record else { return format(0) }
        let (value, low, high) = (format(record.median), format(record.min), format(record.max))
        return low == high ? value : "\(value) [\(low)–\(high)]"
    }
    var rows = [["scenario", "variant"] + columns.map(\.title)]
    var extras: [String] = []
    var seen = Set<String>()
    for record in records where seen.insert("\(record.scenario) \(record.variant)").inserted {
        let own = records.filter { $0.scenario == record.scenario && $0.variant == record.variant }
        func find(_ metric: String) -> BenchRecord? { own.first { $0.metric == "\(metric)_per_item" } }
        rows.append([record.scenario, record.variant] + columns.map { cell(find($0.metric)) })
        let others = own.filter { r in !columns.contains { "\($0.metric)_per_item" == r.metric } }
        if !others.isEmpty {
            extras.append("  \(record.scenario) \(record.variant): "
                + others.map { "\($0.metric.dropLast("_per_item".count)) \(cell($0))" }.joined(separator: ", "))
        }
    }
    let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max()! }
    var lines = ["per item (median of \(runs) runs; [min–max] where they differ):"]
    lines += rows.map { row in
        row.enumerated().map { column, text in
            column < 2 ? text.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                : String(repeating: " ", count: widths[column] - text.count) + text
        }.joined(separator: "  ")
    }
    if !extras.isEmpty {
        lines.append("other reference-counting entry points per item (included in all refcount):")
        lines += extras
    }
    return lines.joined(separator: "\n")
}

/// Mainspring's per-item figures against the C baseline of the same scenario (medians).
private func ratios(_ records: [BenchRecord]) -> String {
    var lines = ["ratios to the C baseline (medians; C: libevent-c-polling for post-local, libevent-c otherwise, "
        + "libevent-c-interleaved for -interleaved):"]
    for scenario in Set(records.map(\.scenario)).sorted() {
        func value(_ variant: String, _ metric: String) -> Double? {
            records.first { $0.scenario == scenario && $0.variant == variant && $0.metric == metric }?.median
        }
        for variant in Set(records.filter { $0.scenario == scenario && !$0.variant.hasPrefix("libevent") }.map(\.variant)).sorted() {
            let baselineName = (scenario == "post-local" ? "libevent-c-polling" : "libevent-c")
                + (variant.hasSuffix("-interleaved") ? "-interleaved" : "")
            guard let instructions = value(variant, "instructions_per_item"),
                  let cInstructions = value(baselineName, "instructions_per_item") else { continue }
            let heap = (value(variant, "heap_allocs_per_item") ?? .nan, value(baselineName, "heap_allocs_per_item") ?? .nan)
            let refcount = value(variant, "refcount_all_per_item") ?? .nan
            lines.append("  \(scenario) \(variant): \(String(format: "%.2f", instructions / cInstructions))× the instructions "
                + "(\(format(instructions)) vs \(format(cInstructions))), \(format(refcount)) retains/releases, "
                + "\(format(heap.0)) vs \(format(heap.1)) heap allocations per item")
        }
    }
    return lines.joined(separator: "\n")
}

/// Per item, where the instructions go and which functions make the counted calls (from the
/// last pair of runs: the difference of the two runs' figures), demangled. Callers without a
/// symbol, outlined copies and thunks hide the real call site, so their own callers follow.
private func callerReport(_ pairs: [(CountedVariant, PairResult)]) -> String {
    var names = Set<String>()
    for (_, pair) in pairs {
        for profile in [pair.small, pair.large] {
            names.formUnion(profile.ownInstructions.keys)
            for (callee, byCaller) in profile.edges {
                names.insert(callee)
                names.formUnion(byCaller.keys)
            }
        }
    }
    let readable = readableNames(Array(names))
    func name(_ symbol: String) -> String { readable[symbol] ?? symbol }
    func hidesCallSite(_ symbol: String) -> Bool {
        let text = name(symbol)
        return symbol.hasPrefix("0x") || text.hasPrefix("outlined ") || text.contains("thunk")
            || text.hasPrefix("partial apply")
    }
    func perItem(_ large: [String: Double]?, _ small: [String: Double]?, span: Double) -> [(String, Double)] {
        var difference = large ?? [:]
        for (key, value) in small ?? [:] { difference[key, default: 0] -= value }
        return difference.map { ($0.key, $0.value / span) }.filter { abs($0.1) >= 0.005 }
            .sorted { abs($0.1) == abs($1.1) ? $0.0 < $1.0 : abs($0.1) > abs($1.1) }
    }
    var lines = ["per item (difference of the N2 and N1 runs; counts under 0.005 per item left out):"]
    for (variant, pair) in pairs {
        let span = Double(variant.large - variant.small)
        lines.append("\(variant.scenario) \(variant.variant):")
        let own = perItem(pair.large.ownInstructions, pair.small.ownInstructions, span: span)
        lines.append("  own instructions, top functions (of \(format((pair.large.instructions - pair.small.instructions) / span))):")
        for (function, count) in own.prefix(12) {
            lines.append("    \(String(format: "%7.1f", count))  \(name(function))")
        }
        for function in Counted.all {
            let callers = perItem(pair.large.edges[function], pair.small.edges[function], span: span)
                .filter { !Counted.isCounted($0.0) }
            guard !callers.isEmpty else { continue }
            // Instructions per call, the callee's own included: a retain or release of an object
            // with a side table (one that was ever weakly referenced) takes the slow path.
            let inside = Dictionary(uniqueKeysWithValues: perItem(pair.large.edgeInstructions[function],
                                                                  pair.small.edgeInstructions[function], span: span))
            lines.append("  \(function): \(String(format: "%.3f", callers.reduce(0) { $0 + $1.1 })) calls "
                + "(instructions per call, callee included), from")
            /// " [File.swift:12, ~File.swift:14 ×2]": where `caller` calls `callee`.
            func sites(_ callee: String, _ caller: String, calls: Double) -> String {
                let list = perItem(pair.large.sites[callee]?[caller], pair.small.sites[callee]?[caller], span: span)
                    .map { $0.0 + (abs($0.1 - calls) < 0.0005 ? "" : " ×\(String(format: "%.3g", $0.1))") }
                return list.isEmpty ? "" : "  [\(list.joined(separator: ", "))]"
            }
            for (caller, count) in callers {
                let each = (inside[caller] ?? .nan) / count
                lines.append("    \(String(format: "%7.3f", count)) \(String(format: "%6.0f", each))  \(name(caller))"
                    + sites(function, caller, calls: count))
                guard hidesCallSite(caller) else { continue }
                for (outer, outerCount) in perItem(pair.large.edges[caller], pair.small.edges[caller], span: span)
                where outer != caller {
                    lines.append("                     \(String(format: "%7.3f", outerCount)) calls of it from \(name(outer))"
                        + sites(caller, outer, calls: outerCount))
                }
            }
        }
    }
    return lines.joined(separator: "\n")
}

/// Readable names: Swift symbols demangled by the toolchain's `swift demangle --simplified`
/// (unchanged when it is not there), and functions without a symbol (`0x… in <object>`) placed
/// after the nearest symbol before them (`nm`).
private func readableNames(_ symbols: [String]) -> [String: String] {
    var placed: [String: (symbol: String, offset: UInt64, object: String)] = [:]
    let unnamed = symbols.filter { $0.hasPrefix("0x") }
    for (object, members) in Dictionary(grouping: unnamed, by: { String($0.split(separator: " ").last ?? "") }) {
        let table = symbolTable(object)
        guard !table.isEmpty else { continue }
        for member in members {
            guard let address = UInt64(member.dropFirst(2).prefix { $0 != " " }, radix: 16) else { continue }
            var low = 0, high = table.count  // the last symbol at or below `address`
            while low < high {
                let mid = (low + high) / 2
                if table[mid].address <= address { low = mid + 1 } else { high = mid }
            }
            if low > 0 {
                let below = table[low - 1]
                placed[member] = (below.name, address - below.address, object)
            }
        }
    }
    let demangled = demangle(symbols + placed.values.map(\.symbol))
    var names: [String: String] = [:]
    for symbol in symbols {
        if let place = placed[symbol] {
            let file = URL(fileURLWithPath: place.object).lastPathComponent
            names[symbol] = "<no symbol: \(file) at \(symbol.split(separator: " ").first ?? ""), "
                + "\(place.offset) bytes after \(demangled[place.symbol] ?? place.symbol)>"
        } else {
            names[symbol] = demangled[symbol] ?? symbol
            if symbol.hasPrefix("0x"), let address = symbol.split(separator: " ").first,
               let object = symbol.split(separator: "/").last
            {
                names[symbol] = "<no symbol: \(object) at \(address)>"
            }
        }
    }
    return names
}

/// The function symbols of an object file, sorted by address (`nm`; empty when unavailable).
private func symbolTable(_ object: String) -> [(address: UInt64, name: String)] {
    guard let text = standardOutput(of: "/usr/bin/env", ["nm", "--defined-only", object]) else { return [] }
    var table: [(address: UInt64, name: String)] = []
    for line in text.split(separator: "\n") {
        let fields = line.split(separator: " ", maxSplits: 2)
        guard fields.count == 3, "tTwW".contains(fields[1]), let address = UInt64(fields[0], radix: 16) else { continue }
        table.append((address, String(fields[2])))
    }
    return table.sorted { $0.address < $1.address }
}

/// Demangles Swift symbols with the toolchain's `swift demangle --simplified` (names unchanged
/// when it is not there).
private func demangle(_ symbols: [String]) -> [String: String] {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["swift-demangle", "--simplified"]
    let input = Foundation.Pipe()
    let output = Foundation.Pipe()
    process.standardInput = input
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    guard (try? process.run()) != nil else { return [:] }
    let writer = Thread {
        input.fileHandleForWriting.write(Data((symbols.joined(separator: "\n") + "\n").utf8))
        try? input.fileHandleForWriting.close()
    }
    writer.start()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    let lines = String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
    guard process.terminationStatus == 0, lines.count >= symbols.count else { return [:] }
    var names: [String: String] = [:]
    for (symbol, line) in zip(symbols, lines) { names[symbol] = String(line) }
    return names
}
