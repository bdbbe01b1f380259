import Foundation
import Synchronization

/// One figure of one variant of one scenario, summarised over several runs.
struct BenchRecord: Codable {
    let scenario: String
    let variant: String
    let metric: String
    let min: Double
    let median: Double
    let max: Double
    let runs: Int
}

/// A named benchmark scenario. `run` measures every variant side by side, `runs` times each
/// (interleaved: variant A, B, C, then A, B, C again…), and summarises.
struct Scenario: Sendable {
    let name: String
    let summary: String
    let run: @Sendable (_ runs: Int) throws -> [BenchRecord]
}

/// A variant that must run in a process of its own: `mainspring-bench --child <name> …`
/// calls `body` with the remaining arguments; it prints its figures with `childReport`.
struct ChildEntryPoint: Sendable {
    let name: String
    let body: @Sendable ([String]) throws -> Never
}

/// Whether `variant` should run: all do unless `MAINSPRING_BENCH_VARIANTS` (a comma-separated
/// list) names some — handy under a profiler.
func variantEnabled(_ variant: String) -> Bool {
    guard let list = ProcessInfo.processInfo.environment["MAINSPRING_BENCH_VARIANTS"], !list.isEmpty else {
        return true
    }
    return list.split(separator: ",").contains { $0 == variant }
}

/// A smoke run (`--smoke`): every scenario once, its durations and counts scaled down (a tenth
/// of a second where it measured seconds, hundreds of items where it counted millions, one
/// seed) — enough to run its code and print every record it has, not a measurement.
let smokeRun = Atomic<Bool>(false)

/// `full`, or `smoke` in a smoke run (`--smoke`): the size of a scenario's run.
func sized<T>(_ full: T, smoke: T) -> T {
    smokeRun.load(ordering: .relaxed) ? smoke : full
}

/// Collects samples per (variant, metric) and summarises them as min / median / max.
struct Samples {
    private var values: [String: [String: [Double]]] = [:]
    private var order: [(String, String)] = []

    /// Adds one run's `value` of `metric`. A figure that does not exist in a run (NaN or
    /// infinite: a p99 of nothing shed, a rate of a tool that did not run) is left out, so that
    /// a record is the median of the runs that had one — and no record at all when none had.
    mutating func add(_ variant: String, _ metric: String, _ value: @autoclosure () -> Double) {
        guard variantEnabled(variant) else { return }
        let value = value()
        guard value.isFinite else { return }
        if values[variant]?[metric] == nil { order.append((variant, metric)) }
        values[variant, default: [:]][metric, default: []].append(value)
    }

    mutating func add(_ variant: String, _ figures: @autoclosure () throws -> [(String, Double)]) rethrows {
        guard variantEnabled(variant) else { return }
        for (metric, value) in try figures() { add(variant, metric, value) }
    }

    func records(scenario: String) -> [BenchRecord] {
        order.map { variant, metric in
            let sorted = values[variant]![metric]!.sorted()
            return BenchRecord(scenario: scenario, variant: variant, metric: metric, min: sorted.first!,
                               median: median(of: sorted), max: sorted.last!, runs: sorted.count)
        }
    }
}

/// The records as `--json` prints them: one JSON array, keys sorted. A record whose figures are
/// not all finite numbers (JSON has none for NaN or infinity) is left out — `Samples` never
/// makes one, and a figure that does not exist must not fail the whole run.
func jsonText(_ records: [BenchRecord]) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    let finite = records.filter { $0.min.isFinite && $0.median.isFinite && $0.max.isFinite }
    return String(decoding: try encoder.encode(finite), as: UTF8.self)
}

func median(of sorted: [Double]) -> Double {
    guard !sorted.isEmpty else { return .nan }
    let mid = sorted.count / 2
    return sorted.count % 2 == 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2
}

/// Runs `body` on a fresh thread (with its own `EventLoop.current`) and waits for its result.
private final class ResultBox<T>: @unchecked Sendable {
    var value: T?
    let done = DispatchSemaphore(value: 0)
}

func onFreshThread<T>(_ body: @escaping @Sendable () -> T) -> T {
    let box = ResultBox<T>()
    let thread = Thread {
        box.value = body()
        box.done.signal()
    }
    thread.stackSize = 8 << 20
    thread.start()
    box.done.wait()
    return box.value!
}

/// Runs this executable again as a child (`--child <args>`) and returns the figures it prints
/// as a JSON object on its last stdout line. For variants that need a process of their own
/// (the process main thread, `dispatchMain()` that never returns).
func runChild(_ arguments: [String]) throws -> [String: Double] {
    let object = try runChildJSON(arguments)
    return object.compactMapValues { $0 as? Double }
}

/// Prints a child's figures as one JSON line and exits.
func childReport(_ figures: [String: Double]) -> Never {
    childReportJSON(figures)
}

enum BenchError: Error, CustomStringConvertible {
    case childFailed(String, Int32)
    case unknownScenario(String)
    case usage(String)
    /// A variant could not be measured (a peer or a load tool failed); the text says which and why.
    case variantFailed(String)

    var description: String {
        switch self {
        case .childFailed(let args, let status): return "child `\(args)` failed (status \(status))"
        case .unknownScenario(let name): return "unknown scenario '\(name)'"
        case .usage(let message): return message
        case .variantFailed(let message): return message
        }
    }
}

/// Nanoseconds on the monotonic clock.
@inline(__always)
func nowNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Busy-waits (real CPU work) for `nanoseconds`.
@inline(never)
func burnCPU(nanoseconds: UInt64) {
    let end = nowNanoseconds() + nanoseconds
    var x: UInt64 = 0
    while nowNanoseconds() < end {
        for i in 0..<64 { x = x &* 6364136223846793005 &+ UInt64(i) }
    }
    blackHole(x)
}

@inline(never)
func blackHole<T>(_ value: T) { _ = value }

/// The p-th percentile (0...1) of unsorted values.
func percentile(_ values: [Double], _ p: Double) -> Double {
    guard !values.isEmpty else { return .nan }
    let sorted = values.sorted()
    let rank = Swift.max(1, Int((p * Double(sorted.count)).rounded(.up)))
    return sorted[Swift.min(rank, sorted.count) - 1]
}

/// Formats records as an aligned table.
func table(_ records: [BenchRecord]) -> String {
    let header = ["scenario", "variant", "metric", "median", "min", "max", "runs"]
    var rows = [header]
    for r in records {
        rows.append([r.scenario, r.variant, r.metric, format(r.median), format(r.min), format(r.max), "\(r.runs)"])
    }
    let widths = header.indices.map { column in rows.map { $0[column].count }.max()! }
    return rows.map { row in
        row.enumerated().map { column, cell in
            column < 3 ? cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                : String(repeating: " ", count: widths[column] - cell.count) + cell
        }.joined(separator: "  ")
    }.joined(separator: "\n")
}

func format(_ value: Double) -> String {
    if value.isNaN { return "-" }
    let magnitude = abs(value)
    if magnitude < 0.0005 { return "0.000" }  // not "-0.000"
    if magnitude >= 1e6 { return String(format: "%.3gM", value / 1e6) }
    if magnitude >= 1e4 { return String(format: "%.0f", value) }
    if magnitude >= 100 { return String(format: "%.1f", value) }
    if magnitude >= 1 { return String(format: "%.2f", value) }
    return String(format: "%.3f", value)
}

// MARK: Children that report series, and plots

/// Runs this executable again as a child (`--child <args>`) and returns the JSON object it
/// prints on its last stdout line (numbers, and arrays of numbers for series). `wrapper`, when
/// given, is a command (from the PATH) that runs the child: `["valgrind", "--tool=callgrind"]`.
func runChildJSON(_ arguments: [String], wrappedIn wrapper: [String] = []) throws -> [String: Any] {
    let process = Process()
    let executable = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    if wrapper.isEmpty {
        process.executableURL = executable
        process.arguments = ["--child"] + arguments
    } else {
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = wrapper + [executable.path, "--child"] + arguments
    }
    let output = Foundation.Pipe()
    process.standardOutput = output
    process.standardInput = FileHandle.nullDevice
    try process.run()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0,
          let line = String(decoding: data, as: UTF8.self).split(separator: "\n").last,
          let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
    else {
        throw BenchError.childFailed(arguments.joined(separator: " "), process.terminationStatus)
    }
    return object
}

/// Prints a child's result (figures and series) as one JSON line and exits. A figure that is
/// not a finite number is left out (the parent reads it as missing), and so is such a value in
/// a series: JSON has no NaN, and the child must still report the rest.
func childReportJSON(_ object: [String: Any]) -> Never {
    let finite = object.compactMapValues { value -> Any? in
        switch value {
        case let number as Double: return number.isFinite ? number : nil
        case let series as [Double]: return series.filter(\.isFinite)
        default: return value
        }
    }
    let data = try! JSONSerialization.data(withJSONObject: finite, options: [.sortedKeys])
    FileHandle.standardOutput.write(Data((String(decoding: data, as: UTF8.self) + "\n").utf8))
    exit(0)
}

/// Where scenarios that draw a plot write it (`--svg DIR`); nil: no plot.
let plotDirectory = Mutex<String?>(nil)

/// Runs `body` in a task and blocks the calling (plain) thread until it returns.
@discardableResult
func blockingAwait<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
    let box = ResultBox<T>()
    Task {
        box.value = await body()
        box.done.signal()
    }
    box.done.wait()
    return box.value!
}

/// What the tool at `path` writes to its standard output when run with `arguments` (its
/// standard error thrown away), read to the end and the tool waited for; nil when it cannot be
/// started. For the outside tools the scenarios read figures from: `nm`, `wrk`, `redis-benchmark`.
func standardOutput(of path: String, _ arguments: [String]) -> String? {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    let output = Foundation.Pipe()
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    guard (try? process.run()) != nil else { return nil }
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return String(decoding: data, as: UTF8.self)
}
