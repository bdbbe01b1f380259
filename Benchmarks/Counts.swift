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
// only code inside `ms_counted_region` (Benchmarks/CBaselines) is counted, per thread, and
//
//     per item = (count with N2 items − count with N1 items) / (N2 − N1)
//
// so that what the region costs once (its first post, the last wake-up, growing a buffer the
// first time) cancels out. `--runs N` repeats each pair N times (default 2) to show the spread.

// MARK: What is counted

/// The functions whose calls are counted, grouped into the reported metrics.
enum Counted {
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
let countsConfiguration = EventLoop.Configuration(pollInterval: .seconds(3_600))

/// The same for libevent's `max_dispatch_interval` in the polling C loop (1,000 s).
let countsMaxDispatchMicroseconds: Int32 = 1_000_000_000

/// post-remote's warm-up rounds post this many items (the larger size), so that neither counted
/// run grows an array.
let remoteWarmup = 70_000

/// One variant of a counted scenario: what the child runs with `items` items, and the two sizes.
struct CountedVariant: Sendable {
    let scenario: String
    let variant: String
    let small: Int
    let large: Int
    /// Runs the workload with `items` items; returns figures to check the run by (wake-ups…).
    let body: @Sendable (_ items: Int) throws -> [String: Double]
}

/// What an item is, per scenario (for the table's legend).
let countedScenarios: [(name: String, item: String)] = [
    ("post-local", "one closure posted on the loop's own thread and run (a chain: each item posts the next)"),
    ("post-remote", "one closure posted from another thread and run (the producer posts all before the loop drains; -interleaved: both at once)"),
    ("daemon", "one `ECHO` request read, parsed and answered over loopback TCP (one client, one request at a time)"),
    ("daemon-pipelined", "one `ECHO` request, as `daemon`, sent in windows of 16 (one write of 16 requests, then the 16 replies), as the timed scenario's clients send them"),
    ("tls-pipelined", "one `ECHO` request, as `daemon-pipelined`, over TLS 1.3 (one established connection, RSA-2048 certificate; the handshake and the warm-up requests are not counted)"),
    ("http", "one keep-alive `GET /hello` read, routed and answered over loopback TCP (one client, one request at a time)"),
    ("http-client", "one keep-alive `GET /hello` sent and its response read by the client, against the C evhttp server of `http` (one connection, one request at a time; only the client's thread counted)"),
    ("feeder", "one chunk of a `Feeder.feed(chunks:)` job (the chunk adds its index to a sum; no C baseline)"),
]

let countedVariants: [CountedVariant] = [
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
struct PairResult {
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
        print(try jsonText(records))
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
