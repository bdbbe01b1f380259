import CBaselines
import CTLSBaselines
import Dispatch
import ExampleServices
import Foundation
import Mainspring
import MainspringTLS

// MARK: Reading callgrind's output

/// What one callgrind run counted: instructions in all, each function's own instructions, and
/// every call edge (callee → caller → calls).
struct CallgrindCounts {
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
let alwaysReported: Set<String> = ["instructions", "swift_retain", "swift_release", "retain_release",
                                           "refcount_all", "heap_allocs", "swift_allocObject", "frees"]

// MARK: The callers report and symbol names

/// Per item, where the instructions go and which functions make the counted calls (from the
/// last pair of runs: the difference of the two runs' figures), demangled. Callers without a
/// symbol, outlined copies and thunks hide the real call site, so their own callers follow.
func callerReport(_ pairs: [(CountedVariant, PairResult)]) -> String {
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
func readableNames(_ symbols: [String]) -> [String: String] {
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
func symbolTable(_ object: String) -> [(address: UInt64, name: String)] {
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
func demangle(_ symbols: [String]) -> [String: String] {
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
