import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Running the package's executables as subprocesses, for tests of behaviour that needs a
/// process of its own: the process main thread (`EventLoop.main`, `DispatchQueue.main`,
/// `@MainActor`), stdin, exit status, signals.
///
/// ```swift
/// let result = try await runFixture("interleave")
/// #expect(result.status == 0, "\(result.stderr)")
/// #expect(result["dispatch-steps"] == "50")
/// ```
///
/// `runFixture(_:)` starts `mainspring-fixture <scenario>` (Tests/Fixture); `runExecutable` starts
/// any other product of the package by name (an example, say). Executables are found next to
/// the test bundle (the directory of `CommandLine.arguments[0]` under `swift test`, which builds
/// every executable target first), then in `.build/debug/`; `MAINSPRING_BIN_DIR` overrides both.
///
/// The child runs with its own stdin (the given text, or `/dev/null`), stdout and stderr are
/// collected in full, and a child still running at the timeout is killed (`SIGKILL`) and reported
/// with `timedOut`. The waiting happens on a dedicated thread, not the test's cooperative pool.
struct FixtureResult: Sendable {
    /// The exit status, or the signal number when `crashedBySignal`.
    let status: Int32
    /// Whether the child was ended by a signal (a crash, a precondition, the timeout's SIGKILL).
    let crashedBySignal: Bool
    /// Whether the child was killed because it outlived the timeout.
    let timedOut: Bool
    let stdout: String
    let stderr: String

    /// Stdout, line by line.
    var lines: [Substring] { stdout.split(separator: "\n") }

    /// The value of the last `key=value` line for `key`, if any.
    subscript(key: String) -> String? {
        let prefix = key + "="
        return lines.last { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
    }

    /// `self[key]` as an integer, if it parses.
    func int(_ key: String) -> Int? { self[key].flatMap { Int($0) } }

    /// A one-line summary for failure messages.
    var summary: String {
        "status \(status)\(crashedBySignal ? " (signal)" : "")\(timedOut ? " (timed out)" : ""); stdout: \(stdout); stderr: \(stderr.prefix(2_000))"
    }
}

enum FixtureLaunchError: Error, CustomStringConvertible {
    case executableNotFound(String, searched: [String])

    var description: String {
        switch self {
        case .executableNotFound(let name, let searched):
            return "cannot find the executable '\(name)' (searched \(searched.joined(separator: ", "))); run `swift build` first"
        }
    }
}

/// Runs `mainspring-fixture <scenario> [arguments…]`. See `FixtureResult`.
func runFixture(_ scenario: String, arguments: [String] = [], stdin: String? = nil,
                timeout: Duration = .seconds(60)) async throws -> FixtureResult
{
    try await runExecutable("mainspring-fixture", arguments: [scenario] + arguments, stdin: stdin, timeout: timeout)
}

/// Runs the package executable `name` with `arguments`, feeding it `stdin` (or `/dev/null`), and
/// returns its status and output once it exits — or kills it after `timeout`.
func runExecutable(_ name: String, arguments: [String] = [], stdin: String? = nil,
                   environment: [String: String]? = nil, timeout: Duration = .seconds(60)) async throws -> FixtureResult
{
    let url = try executableURL(name)
    return try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do {
                continuation.resume(returning: try runBlocking(url, arguments, stdin, environment, timeout))
            } catch {
                continuation.resume(throwing: error)
            }
        }
        thread.start()
    }
}

/// Where the package's executables are.
func executableURL(_ name: String) throws -> URL {
    var directories: [URL] = []
    if let override = ProcessInfo.processInfo.environment["MAINSPRING_BIN_DIR"] {
        directories.append(URL(fileURLWithPath: override))
    }
    directories.append(URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent())
    // The package root, from this file's path: Tests/MainspringTests/Fixture.swift.
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    directories.append(root.appendingPathComponent(".build/debug"))
    for directory in directories {
        let candidate = directory.appendingPathComponent(name)
        if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
    }
    throw FixtureLaunchError.executableNotFound(name, searched: directories.map(\.path))
}

private func runBlocking(_ url: URL, _ arguments: [String], _ stdin: String?, _ environment: [String: String]?,
                         _ timeout: Duration) throws -> FixtureResult
{
    let process = Process()
    process.executableURL = url
    process.arguments = arguments
    if let environment {
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    }
    let output = Foundation.Pipe()
    let errors = Foundation.Pipe()
    let input = Foundation.Pipe()
    process.standardOutput = output
    process.standardError = errors
    process.standardInput = stdin == nil ? FileHandle.nullDevice : input
    let exited = DispatchSemaphore(value: 0)
    process.terminationHandler = { _ in exited.signal() }
    try process.run()

    // Drain both pipes concurrently, so that a chatty child never blocks on a full pipe.
    let stdoutData = Locked(Data())
    let stderrData = Locked(Data())
    let drained = DispatchGroup()
    for (pipe, sink) in [(output, stdoutData), (errors, stderrData)] {
        drained.enter()
        Thread.detachNewThread {
            let data = pipe.fileHandleForReading.readDataToEndOfFile()
            sink.withLock { $0 = data }
            drained.leave()
        }
    }
    if let stdin {
        input.fileHandleForWriting.write(Data(stdin.utf8))
        try? input.fileHandleForWriting.close()
    }

    let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
    var timedOut = false
    if exited.wait(timeout: .now() + seconds) == .timedOut {
        timedOut = true
        kill(process.processIdentifier, SIGKILL)
        exited.wait()
    }
    drained.wait()
    return FixtureResult(
        status: process.terminationStatus,
        crashedBySignal: process.terminationReason == .uncaughtSignal,
        timedOut: timedOut,
        stdout: String(decoding: stdoutData.withLock { $0 }, as: UTF8.self),
        stderr: String(decoding: stderrData.withLock { $0 }, as: UTF8.self))
}
