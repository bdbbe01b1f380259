import Foundation
import Testing
import MainspringTestSupport

/// `mainspring-demo` run as a subprocess (the build under test: debug, or release under
/// `make test-release`; small limits): scripted stdin, junk, end of input, `quit`, simulated
/// input with `--json`, and bad command lines.
///
/// Nothing here depends on timing beyond "it answers": the scripts start with `pause` where the
/// job must still be running when later commands arrive (a paused job cannot finish), and the
/// timeouts are generous for a loaded 2-core machine.
@Suite("mainspring-demo (subprocess)")
struct DemoTests {
    /// π(2,000,000), the job of most tests: 20 chunks of 100,000 numbers.
    static let primesBelow2M = "148,933 primes below 2,000,000"

    /// Stdout lines, and the index of the first line containing `text` (after `from`).
    private static func index(of text: String, in lines: [Substring], from start: Int = 0) -> Int? {
        lines.indices.first { $0 >= start && lines[$0].contains(text) }
    }

    @Test("scripted stdin: every command answered in order, junk reported in one line each, EOF lets the job finish")
    func scriptedSession() async throws {
        var input = Array("""
            pause
            status
            chunk 50000
            stats
            help
            frobnicate

            """.utf8)
        input += [0x01, 0x02, 0x7F, 0x0A]                           // control bytes (valid UTF-8)
        input += Array("sta".utf8) + [0x00] + Array("tus\n".utf8)   // a NUL inside a word
        input += [0xC3, 0x28, 0xFF, 0xFE, 0x0A]                     // invalid UTF-8
        input += [UInt8](repeating: UInt8(ascii: "x"), count: 5_000_000) + [0x0A]  // a 5 MB line
        input += Array("chunk\nresume\nstatus\n".utf8)
        let result = try await runExecutable(
            "mainspring-demo", arguments: ["--interactive", "--limit", "2000000"], stdinBytes: input,
            timeout: .seconds(120))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        // Nothing from the demo on stderr (a sanitizer runtime may add its own report there).
        #expect(!result.stderr.contains("mainspring-demo"), "\(result.stderr)")
        let lines = result.lines
        // Each reply, in the order the commands came.
        let expected = [
            "paused at ",
            "status: paused, ",
            "chunk size: 50,000 numbers (was 100,000), from the next chunk on",
            "fairness so far",
            "commands:",
            "error: unknown command 'frobnicate' (type 'help' for the commands)",
            "error: unknown command '\\u{1}\\u{2}\\u{7F}' (type 'help' for the commands)",
            "error: unknown command 'sta\\0tus' (type 'help' for the commands)",
            "error: ignored a line of 4 bytes that is not valid UTF-8",
            "error: ignored a line of 5,000,000 bytes (commands are at most 4,096 bytes)",
            "error: 'chunk' needs a number, e.g. 'chunk 50000' (type 'help' for the commands)",
            "resumed at ",
            "status: running, ",
            "50,000 numbers per chunk",
            "end of input: letting the job finish",
            "result: \(Self.primesBelow2M) (completed)",
            "job: ",
        ]
        var position = 0
        for text in expected {
            let found = Self.index(of: text, in: lines, from: position)
            #expect(found != nil, "missing, or out of order: \(text)\n\(result.stdout)")
            position = (found ?? position) + 1
        }
        // The stats table and the help text are complete.
        for row in ["input events", "input p99", "work chunks", "work share", "longest starvation", "overhead"] {
            #expect(result.stdout.contains("  \(row)"), "stats row \(row)")
        }
        for command in ["status", "pause", "resume", "cancel", "chunk <n>", "stats", "help", "quit"] {
            #expect(lines.contains { $0.hasPrefix("  \(command) ") }, "help line for \(command)")
        }
        // The status while paused says so and shows the chunk size then in force.
        let pausedStatus = Self.index(of: "status: paused, ", in: lines)
        #expect(pausedStatus.map { lines[$0 + 1].contains("100,000 numbers per chunk") } == true, "\(result.stdout)")
        // No raw control byte reaches the output.
        #expect(!result.stdout.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" })
        // The summary: result, fairness, progress timer.
        #expect(result.stdout.contains("fairness: input p50 "))
        #expect(result.stdout.contains("progress timer: asked every 100 ms"))
    }

    @Test("--cancel-on-eof: end of input cancels a long job, then the summary, exit 0")
    func cancelOnEndOfInput() async throws {
        // 10⁹ would take minutes in a debug build: only the cancel can end it in time.
        let result = try await runExecutable(
            "mainspring-demo", arguments: ["--interactive", "--cancel-on-eof", "--limit", "1000000000"],
            stdin: "status\n", timeout: .seconds(120))
        #expect(result.status == 0 && !result.timedOut, "\(result.summary)")
        #expect(result.stdout.contains("status: running, "), "\(result.stdout)")
        #expect(result.stdout.contains(" chunks so far, 100,000 numbers per chunk"), "\(result.stdout)")
        #expect(result.stdout.contains("end of input (--cancel-on-eof): cancelling the job at "), "\(result.stdout)")
        #expect(result.stdout.contains("(cancelled at "), "\(result.stdout)")
        #expect(!result.stdout.contains("(completed"), "\(result.stdout)")
    }

    @Test("quit cancels the job and exits 0 at once; input after it is not read")
    func quit() async throws {
        let result = try await runExecutable(
            "mainspring-demo", arguments: ["--interactive", "--limit", "1000000000"],
            stdin: "quit\nstatus\n", timeout: .seconds(120))
        #expect(result.status == 0 && !result.timedOut, "\(result.summary)")
        #expect(result.stdout.contains("quit: cancelling the job at "), "\(result.stdout)")
        #expect(result.stdout.contains("(cancelled at "), "\(result.stdout)")
        #expect(!result.stdout.contains("status:"), "\(result.stdout)")
    }

    @Test("--simulate --json: one JSON object on stdout with the report and the job; stdin is not read")
    func simulateJSON() async throws {
        // `quit` on stdin would cancel the job if the demo read it.
        let result = try await runExecutable(
            "mainspring-demo", arguments: ["--simulate", "--json", "--limit", "2000000"], stdin: "quit\n",
            timeout: .seconds(120))
        #expect(result.status == 0, "\(result.summary)")
        let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        let report = try #require(object, "not a JSON object: \(result.stdout)")
        for key in ["input_events", "input_p50_ms", "input_p99_ms", "input_max_ms", "chunks", "elapsed_ms",
                    "work_share", "max_starvation_ms", "stalls", "overhead"] {
            #expect(report[key] is NSNumber, "\(key) in \(result.stdout)")
        }
        #expect((report["chunks"] as? Int) == 20)
        // Records come every 10 ms: a run that lasts (the debug build takes about half a second)
        // sees some of them; an optimised build may finish the 20 chunks before the first one.
        if let elapsed = report["elapsed_ms"] as? Double, elapsed >= 100 {
            #expect(((report["input_events"] as? Int) ?? 0) > 0, "\(result.stdout)")
        }
        let share = (report["work_share"] as? Double) ?? -1
        #expect(share > 0 && share <= 1)
        let job = try #require(report["job"] as? [String: Any], "\(result.stdout)")
        #expect((job["primes"] as? Int) == 148_933)
        #expect((job["limit"] as? Int) == 2_000_000)
        #expect((job["outcome"] as? String) == "completed")
        #expect((job["mode"] as? String) == "feeder")
        #expect((job["pacing"] as? String) == "budget")
    }

    @Test("stdin not a terminal: simulated input by default, progress lines and the report table")
    func simulateByDefault() async throws {
        let result = try await runExecutable(
            "mainspring-demo", arguments: ["--limit", "2000000", "--pacing", "one"], timeout: .seconds(120))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stdout.contains("Simulated input: "), "\(result.stdout)")
        #expect(result.stdout.contains("one chunk per turn"), "\(result.stdout)")
        #expect(result.stdout.contains("result: \(Self.primesBelow2M) (completed)\njob: 20 chunks in "),
                "\(result.stdout)")
        #expect(result.stdout.contains("fairness report"), "\(result.stdout)")
        for row in ["input events", "input p50", "input p99", "work share", "longest starvation", "stalls", "overhead"] {
            #expect(result.stdout.contains("  \(row) "), "row \(row): \(result.stdout)")
        }
        // Not a terminal: no bar, no escape sequences.
        #expect(!result.stdout.contains("\u{1B}"))
    }

    @Test("--naive: the posted chunks hold the progress timer back for the whole job; pause and chunk are refused")
    func naive() async throws {
        let simulated = try await runExecutable(
            "mainspring-demo", arguments: ["--naive", "--json", "--limit", "2000000"], timeout: .seconds(120))
        #expect(simulated.status == 0, "\(simulated.summary)")
        let object = try JSONSerialization.jsonObject(with: Data(simulated.stdout.utf8)) as? [String: Any]
        let job = try #require(object?["job"] as? [String: Any], "\(simulated.stdout)")
        #expect((job["mode"] as? String) == "naive")
        #expect((job["primes"] as? Int) == 148_933)
        // The timer (.normal) is queued behind every posted chunk: its first tick comes only
        // after the job, so the longest gap is the job's whole run.
        let gap = (job["longest_tick_gap_ms"] as? Double) ?? 0
        let elapsed = (job["elapsed_ms"] as? Double) ?? -1
        #expect(abs(gap - elapsed) < 0.001, "gap \(gap) ms, job \(elapsed) ms")

        let typed = try await runExecutable(
            "mainspring-demo", arguments: ["--naive", "--interactive", "--limit", "2000000"],
            stdin: "pause\nchunk 5000\nstatus\n", timeout: .seconds(120))
        #expect(typed.status == 0, "\(typed.summary)")
        #expect(typed.stdout.contains("pause: impossible with --naive"), "\(typed.stdout)")
        #expect(typed.stdout.contains("chunk: impossible with --naive"), "\(typed.stdout)")
        #expect(typed.stdout.contains("result: \(Self.primesBelow2M) (completed)\njob: 20 chunks in "),
                "\(typed.stdout)")
    }

    @Test("bad command lines: usage on stderr, exit 2; --help: usage on stdout, exit 0")
    func badFlags() async throws {
        let bad: [[String]] = [
            ["--bogus"], ["--limit"], ["--limit", "lots"], ["--limit", "1"], ["--chunk", "0"],
            ["--pacing", "fast"], ["--interactive", "--simulate"], ["--json", "--interactive"],
            ["--naive", "--pacing", "one"], ["status"],
        ]
        for arguments in bad {
            let result = try await runExecutable("mainspring-demo", arguments: arguments, timeout: .seconds(60))
            #expect(result.status == 2 && !result.crashedBySignal, "\(arguments): \(result.summary)")
            #expect(result.stderr.hasPrefix("mainspring-demo: "), "\(arguments): \(result.stderr)")
            #expect(result.stderr.contains("usage: mainspring-demo"), "\(arguments)")
            #expect(result.stdout.isEmpty, "\(arguments): \(result.stdout)")
        }
        let help = try await runExecutable("mainspring-demo", arguments: ["--help"], timeout: .seconds(60))
        #expect(help.status == 0)
        #expect(help.stdout.hasPrefix("usage: mainspring-demo"))
        #expect(!help.stderr.contains("mainspring-demo"))
    }
}
