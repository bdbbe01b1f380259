import ExampleServices
import Foundation
import MainspringCore
import Testing

#if canImport(Glibc)
import Glibc
import MainspringTestSupport
#endif

// mainspring-daemon under a service manager, in subprocesses (they need their own environment
// and descriptors from 3 on): notifications to a fake notify socket, socket activation through
// systemd's own systemd-socket-activate, bad environments, journal priorities, and the unit
// files through systemd-analyze. The tools come from Debian's systemd package, which
// scripts/install-tools.sh installs when they are missing; where they cannot run, the tests
// that need them are skipped with a message.

/// A systemd tool that can run here: its absolute path, or nil.
private func systemdTool(_ name: String) -> String? {
    for directory in ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"] {
        let path = "\(directory)/\(name)"
        guard FileManager.default.isExecutableFile(atPath: path) else { continue }
        guard let child = try? startProgram(path, arguments: ["--version"]) else { return nil }
        return child.waitForExit(timeout: .seconds(30)).status == 0 ? path : nil
    }
    return nil
}

private let socketActivate = systemdTool("systemd-socket-activate")
private let analyze = systemdTool("systemd-analyze")

/// `-E NAME=value` for each sanitizer setting of this process: systemd-socket-activate gives the
/// program it starts a fresh environment, and a sanitized build needs its suppressions there too.
private let sanitizerSettings: [String] = ["ASAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"].flatMap { name in
    ProcessInfo.processInfo.environment[name].map { ["-E", "\(name)=\($0)"] } ?? []
}

/// The built daemon's path.
private func daemonPath() throws -> String { try executableURL("mainspring-daemon").path }

/// The port in the daemon's banner ("listening on 127.0.0.1:PORT …").
private func port(inBanner banner: String?) throws -> UInt16 {
    let line = try #require(banner, "the daemon printed no banner")
    let address = line.split(separator: " ").dropFirst(2).first ?? ""
    return try #require(address.split(separator: ":").last.flatMap { UInt16($0) }, "no port in '\(line)'")
}

/// Connects to `port`, retrying while nobody listens yet (a tool still starting).
private func connect(to port: UInt16, within timeout: Duration = .seconds(20)) throws -> TestClient {
    let deadline = ContinuousClock.now + timeout
    while true {
        do {
            return try TestClient(port: port)
        } catch {
            if ContinuousClock.now > deadline { throw error }
            usleep(20_000)
        }
    }
}

/// Starts systemd-socket-activate listening on 127.0.0.1 at `count` ports of `subprocessPorts`
/// (outside the ephemeral range: nobody is given them by a port-0 bind or a connect), then
/// `arguments(ports)` (its other options, the program and the program's arguments); returns
/// once it says it listens on every one. A port another explicit pick took between our check
/// and its bind makes it exit with "Address already in use": then again with new ports, up to
/// five attempts.
private func startActivator(_ tool: String, ports count: Int, _ arguments: ([UInt16]) throws -> [String])
    throws -> (ChildProcess, [UInt16])
{
    var failures: [String] = []
    for _ in 1...5 {
        let ports = try subprocessPorts(count)
        let activator = try startProgram(tool, arguments: ports.flatMap { ["-l", "127.0.0.1:\($0)"] } + (try arguments(ports)))
        if activator.waitForStderr(timeout: .seconds(30), { text in
            ports.allSatisfy { text.contains("Listening on 127.0.0.1:\($0) as ") }
        }) {
            return (activator, ports)
        }
        if !activator.hasExited { activator.send(SIGKILL) }
        let result = activator.waitForExit(timeout: .seconds(30))
        failures.append("ports \(ports): \(result.summary)")
        guard result.stderr.contains("Address already in use") else { break }
    }
    throw ActivatorFailure(attempts: failures)
}

private struct ActivatorFailure: Error, CustomStringConvertible {
    let attempts: [String]
    var description: String { "systemd-socket-activate never listened: \(attempts.joined(separator: " | "))" }
}

/// Runs `script` with /bin/sh, the daemon's path as `$0` and `arguments` as `$@`: for setting
/// up descriptors and `LISTEN_PID=$$` (the shell's pid, which `exec` keeps) before `exec "$0"`.
private func startDaemonThroughShell(_ script: String, arguments: [String], environment: [String: String] = [:])
    throws -> ChildProcess
{
    try startProgram("/bin/sh", arguments: ["-c", script, try daemonPath()] + arguments, environment: environment)
}

@Suite("mainspring-daemon under a service manager (subprocess)", .serialized)
struct DaemonSystemdTests {
    @Test("READY=1 once it listens, STATUS= with its counters, WATCHDOG=1 every 100 ms for WATCHDOG_USEC=200000, RELOADING=1 … READY=1 on SIGHUP, STOPPING=1 on SIGTERM, exit 0")
    func notifications() async throws {
        let fake = try FakeNotifySocket()
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--loops", "2", "--status-interval", "200"],
                                         environment: ["NOTIFY_SOCKET": fake.address, "WATCHDOG_USEC": "200000"])
        let port = try await port(inBanner: daemon.readLine(timeout: .seconds(30)))
        // READY=1 carries the bound port: it was sent after the socket listened.
        let ready = try #require(await fake.waitFor { $0.contains("READY=1") }, "no READY=1: \(fake.messages)")
        #expect(ready.value(of: "STATUS")?.hasPrefix("serving 127.0.0.1:\(port) on 2 loop(s): connections=0") == true, "\(ready)")
        let readyIndex = try #require(fake.messages.firstIndex { $0.contains("READY=1") })

        // A request, then a periodic STATUS= that counts it.
        let client = try TestClient(port: port)
        client.send("ECHO under systemd\n")
        #expect(client.readLine() == "under systemd")
        let counted = await fake.waitFor(after: readyIndex + 1) { message in
            message.assignments.count == 1 && message.value(of: "STATUS")?.contains("requests=1 ") == true
        }
        #expect(counted != nil, "no STATUS= with the request counted: \(fake.messages.suffix(5))")
        #expect(counted?.value(of: "STATUS")?.hasSuffix("; watchdog: healthy") == true, "\(String(describing: counted))")

        // The watchdog: pings every half interval.
        _ = await fake.waitFor(after: readyIndex) { _ in
            fake.messages.dropFirst(readyIndex).filter { $0.text == "WATCHDOG=1" }.count >= 12
        }
        let pings = fake.messages.dropFirst(readyIndex).filter { $0.text == "WATCHDOG=1" }
        try #require(pings.count >= 12, "\(fake.messages)")
        let gaps = zip(pings.dropFirst(), pings).map { Double($0.arrival - $1.arrival) / 1e6 }.sorted()
        #expect(gaps[gaps.count / 2] > 60 && gaps[gaps.count / 2] < 200, "gaps between pings (ms): \(gaps)")

        // SIGHUP: RELOADING=1 with the monotonic time, then READY=1 again.
        let beforeReload = fake.messages.count
        let sentAt = monotonicNanoseconds() / 1_000
        daemon.send(SIGHUP)
        let reloading = try #require(await fake.waitFor(after: beforeReload) { $0.contains("RELOADING=1") })
        let stamp = try #require(reloading.value(of: "MONOTONIC_USEC").flatMap { UInt64($0) }, "\(reloading)")
        #expect(stamp >= sentAt && stamp <= monotonicNanoseconds() / 1_000)
        let reloadIndex = try #require(fake.messages.firstIndex { $0.contains("RELOADING=1") })
        #expect(await fake.waitFor(after: reloadIndex + 1) { $0.contains("READY=1") } != nil, "no READY=1 after the reload")

        // SIGTERM during a request that takes 800 ms: STOPPING=1, the reply, then a clean exit.
        // The idle loop is done draining long before the busy one.
        // SIGTERM once the daemon has the request: a periodic STATUS= counts it (the ECHO was 1).
        let beforeSleep = fake.messages.count
        client.send("SLEEP 800\n")
        let sleeping = await fake.waitFor(after: beforeSleep) { $0.value(of: "STATUS")?.contains("requests=2 ") == true }
        #expect(sleeping != nil, "no STATUS= with the SLEEP counted: \(fake.messages.suffix(5))")
        daemon.send(SIGTERM)
        #expect(client.readLine() == "SLEPT 800")
        let result = await daemon.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        let stopping = await fake.waitFor(timeout: .seconds(5)) { $0.contains("STOPPING=1") }
        #expect(stopping?.value(of: "STATUS")?.hasPrefix("SIGTERM: draining") == true, "\(fake.messages.suffix(3))")
        #expect(result.stderr.contains("stats: connections=1"), "SIGHUP's reload prints the counters: \(result.stderr)")
        #expect(!result.stderr.contains("<6>"), "stderr is not the journal: no priority prefixes")
        // The watchdog stops with STOPPING=1: the drain stops the loops one by one, which is no
        // stuck loop.
        let stoppingIndex = fake.messages.firstIndex { $0.contains("STOPPING=1") } ?? fake.messages.count
        #expect(!fake.messages.dropFirst(stoppingIndex).contains { $0.text == "WATCHDOG=1" }, "\(fake.messages.suffix(3))")
        #expect(!result.stderr.contains("watchdog:"), "\(result.stderr)")
    }

    @Test("an abstract-namespace NOTIFY_SOCKET (@name): READY=1, STOPPING=1")
    func abstractNotifySocket() async throws {
        let fake = try FakeNotifySocket(abstract: true)
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--loops", "1"],
                                         environment: ["NOTIFY_SOCKET": fake.address])
        _ = try await port(inBanner: daemon.readLine(timeout: .seconds(30)))
        #expect(await fake.waitFor { $0.contains("READY=1") } != nil, "\(fake.messages)")
        daemon.send(SIGTERM)
        let result = await daemon.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        #expect(await fake.waitFor(timeout: .seconds(5)) { $0.contains("STOPPING=1") } != nil, "\(fake.messages)")
        #expect(!fake.messages.contains { $0.text == "WATCHDOG=1" }, "no WATCHDOG_USEC, no pings")
    }

    @Test("bad environment: WATCHDOG_USEC=abc and a malformed NOTIFY_SOCKET are warnings (no pings, no notifications), WATCHDOG_PID of another process means no watchdog; the daemon serves")
    func badWatchdogEnvironment() async throws {
        let fake = try FakeNotifySocket()
        for (environment, warning) in [
            (["WATCHDOG_USEC": "abc"], "mainspring-daemon: no watchdog: WATCHDOG_USEC='abc' cannot be used: expected a whole number of microseconds"),
            (["WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"], nil),
        ] {
            let before = fake.messages.count
            let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--loops", "1", "--status-interval", "100"],
                                             environment: environment.merging(["NOTIFY_SOCKET": fake.address]) { $1 })
            let port = try await port(inBanner: daemon.readLine(timeout: .seconds(30)))
            #expect(await fake.waitFor(after: before) { $0.contains("READY=1") } != nil)
            // Five status periods (500 ms): a watchdog would have pinged five times.
            _ = await fake.waitFor(after: before) { _ in fake.messages.dropFirst(before).filter { $0.text.hasPrefix("STATUS=") }.count >= 5 }
            #expect(!fake.messages.dropFirst(before).contains { $0.text == "WATCHDOG=1" }, "\(environment): \(fake.messages)")
            let client = try TestClient(port: port)
            client.send("ECHO still serving\n")
            #expect(client.readLine() == "still serving")
            daemon.send(SIGTERM)
            let result = await daemon.waitForExit(timeout: .seconds(60))
            #expect(result.status == 0, "\(result.summary)")
            if let warning {
                #expect(result.stderr.contains(warning), "\(result.stderr)")
            } else {
                #expect(!result.stderr.contains("watchdog"), "\(result.stderr)")
            }
        }
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--loops", "1"],
                                         environment: ["NOTIFY_SOCKET": "relative/notify.sock", "WATCHDOG_USEC": "200000"])
        let port = try await port(inBanner: daemon.readLine(timeout: .seconds(30)))
        let client = try TestClient(port: port)
        client.send("ECHO ok\n")
        #expect(client.readLine() == "ok")
        daemon.send(SIGTERM)
        let result = await daemon.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stderr.contains("mainspring-daemon: not notifying the service manager: NOTIFY_SOCKET='relative/notify.sock' cannot be used"),
                "\(result.stderr)")
    }

    @Test("stderr to the journal (JOURNAL_STREAM names it): <6>, <4>, <3> priority prefixes; no prefixes when it names another file")
    func journalPriorities() async throws {
        // The shell sets JOURNAL_STREAM to its stderr's device and inode, as systemd would.
        let script = #"JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) exec "$0" "$@""#
        let daemon = try startDaemonThroughShell(script, arguments: ["--port", "0", "--loops", "1"],
                                                 environment: ["NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "abc"])
        _ = try await port(inBanner: daemon.readLine(timeout: .seconds(30)))
        daemon.send(SIGTERM)
        let result = await daemon.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        let lines = result.stderr.split(separator: "\n")
        #expect(lines.contains { $0.hasPrefix("<4>mainspring-daemon: no watchdog: WATCHDOG_USEC='abc'") }, "\(result.stderr)")
        #expect(lines.contains { $0.hasPrefix("<6>SIGTERM: draining") }, "\(result.stderr)")
        #expect(lines.contains { $0.hasPrefix("<6>stopped: ") }, "\(result.stderr)")
        #expect(lines.allSatisfy { $0.hasPrefix("<") }, "every line has a priority: \(result.stderr)")

        let failing = try startDaemonThroughShell(script, arguments: ["--port", "0", "--socket-name", "line"])
        let failed = await failing.waitForExit(timeout: .seconds(60))
        #expect(failed.status == 78, "\(failed.summary)")
        #expect(failed.stderr.hasPrefix("<3>mainspring-daemon: --socket-name line: the service manager passed no sockets"), "\(failed.stderr)")

        let elsewhere = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--loops", "1"],
                                            environment: ["JOURNAL_STREAM": "1:1"])
        _ = try await port(inBanner: elsewhere.readLine(timeout: .seconds(30)))
        elsewhere.send(SIGTERM)
        let plain = await elsewhere.waitForExit(timeout: .seconds(60))
        #expect(plain.status == 0 && plain.stderr.hasPrefix("SIGTERM: draining"), "\(plain.summary)")
    }

    @Test("socket activation through systemd-socket-activate -l 127.0.0.1:PORT: ECHO over the passed socket, READY=1, SIGTERM exits 0",
          .enabled(if: socketActivate != nil, "systemd-socket-activate is not installed or cannot run (Debian: apt-get install systemd)"))
    func socketActivation() async throws {
        let tool = try #require(socketActivate)
        let fake = try FakeNotifySocket()
        let (activator, ports) = try startActivator(tool, ports: 1) { _ in
            ["-E", "NOTIFY_SOCKET=\(fake.address)"] + sanitizerSettings + [try daemonPath(), "--loops", "1"]
        }
        let port = ports[0]
        // systemd-socket-activate listens, and execs the daemon (same pid) at the first connection.
        let client = try connect(to: port)
        client.send("ECHO activated\n")
        #expect(client.readLine() == "activated")
        let banner = await activator.readLine(timeout: .seconds(30))
        #expect(banner == "listening on 127.0.0.1:\(port) (socket activation: descriptor 3) with 1 loop(s)")
        let ready = await fake.waitFor { $0.contains("READY=1") }
        #expect(ready?.value(of: "STATUS")?.hasPrefix("serving 127.0.0.1:\(port)") == true, "\(fake.messages)")
        activator.send(SIGTERM)
        let result = await activator.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stderr.contains("Execing "), "\(result.stderr)")
        #expect(await fake.waitFor(timeout: .seconds(5)) { $0.contains("STOPPING=1") } != nil)
    }

    @Test("systemd-socket-activate --fdname: the daemon serves on the socket named by --socket-name; an unknown name is exit status 78",
          .enabled(if: socketActivate != nil, "systemd-socket-activate is not installed or cannot run (Debian: apt-get install systemd)"))
    func namedSockets() async throws {
        let tool = try #require(socketActivate)
        for socketName in ["line", "nope"] {
            let (activator, ports) = try startActivator(tool, ports: 2) { _ in
                ["--fdname=other:line"] + sanitizerSettings + [try daemonPath(), "--loops", "1", "--socket-name", socketName]
            }
            let second = ports[1]
            let client = try connect(to: second)
            if socketName == "nope" {
                let result = await activator.waitForExit(timeout: .seconds(60))
                #expect(result.status == 78, "\(result.summary)")
                #expect(result.stderr.contains("--socket-name nope: no passed socket has that name (LISTEN_FDNAMES: 'other', 'line')"),
                        "\(result.stderr)")
                #expect(client.readLine() == nil)
                continue
            }
            client.send("ECHO by name\n")
            #expect(client.readLine() == "by name")
            #expect(await activator.readLine(timeout: .seconds(30))
                == "listening on 127.0.0.1:\(second) (socket activation: descriptor 4 named 'line') with 1 loop(s)")
            activator.send(SIGTERM)
            let result = await activator.waitForExit(timeout: .seconds(60))
            #expect(result.status == 0, "\(result.summary)")
        }
    }

    @Test("the README's systemd example runs under systemd-socket-activate: READY=1 with the passed socket, echo, WATCHDOG=1, STOPPING=1",
          .enabled(if: socketActivate != nil, "systemd-socket-activate is not installed or cannot run (Debian: apt-get install systemd)"))
    func readmeExample() async throws {
        let tool = try #require(socketActivate)
        let fake = try FakeNotifySocket()
        let (example, ports) = try startActivator(tool, ports: 1) { _ in
            ["--fdname=line", "-E", "NOTIFY_SOCKET=\(fake.address)", "-E", "WATCHDOG_USEC=200000"]
                + sanitizerSettings + [try executableURL("mainspring-fixture").path, "readme-systemd"]
        }
        let port = ports[0]
        let client = try connect(to: port)
        client.send("ECHO from the README\n")
        #expect(client.readLine() == "ECHO from the README")
        let ready = await fake.waitFor { $0.contains("READY=1") }
        #expect(ready?.value(of: "STATUS") == "accepting on 127.0.0.1:\(port)", "\(fake.messages)")
        #expect(await fake.waitFor { _ in fake.messages.filter { $0.text == "WATCHDOG=1" }.count >= 3 } != nil, "\(fake.messages)")
        example.send(SIGTERM)
        let result = await example.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        #expect(await fake.waitFor(timeout: .seconds(5)) { $0.text == "STOPPING=1" } != nil, "\(fake.messages)")
    }

    @Test("LISTEN_FDS passing a descriptor that is not a socket: a clear error and exit status 78")
    func notASocket() async throws {
        let daemon = try startDaemonThroughShell(#"exec 3</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#,
                                                 arguments: ["--loops", "1"])
        let result = await daemon.waitForExit(timeout: .seconds(60))
        #expect(result.status == 78, "\(result.summary)")
        #expect(result.stderr.contains(
            "mainspring-daemon: cannot serve on the activated descriptor 3: descriptor 3 is not a listening stream socket: it is a character device, not a socket"),
            "\(result.stderr)")
        #expect(result.stdout.isEmpty)
    }

    @Test("bad LISTEN_* environment: LISTEN_FDS=999 is exit status 78 naming the missing descriptor; LISTEN_PID of another process is a warning, and --port is used")
    func badListenEnvironment() async throws {
        // Descriptors from 3 on are closed in the child (the test closes any it might have).
        let tooMany = try startDaemonThroughShell(#"exec 3<&- 4<&-; LISTEN_PID=$$ LISTEN_FDS=999 exec "$0" "$@""#,
                                                  arguments: ["--loops", "1"])
        let failed = await tooMany.waitForExit(timeout: .seconds(60))
        #expect(failed.status == 78, "\(failed.summary)")
        #expect(failed.stderr.contains("mainspring-daemon: socket activation: LISTEN_FDS=999 says descriptors 3…1001 were passed, but descriptor"),
                "\(failed.stderr)")
        #expect(failed.stderr.contains("is not open"))

        let junk = try startExecutable("mainspring-daemon", arguments: ["--loops", "1"],
                                       environment: ["LISTEN_PID": "self", "LISTEN_FDS": "1"])
        let junkResult = await junk.waitForExit(timeout: .seconds(60))
        #expect(junkResult.status == 78 && junkResult.stderr.contains("LISTEN_PID='self' cannot be used"), "\(junkResult.summary)")

        let other = try startExecutable("mainspring-daemon", arguments: ["--port", "0", "--loops", "1"],
                                        environment: ["LISTEN_PID": "1", "LISTEN_FDS": "1"])
        let port = try await port(inBanner: other.readLine(timeout: .seconds(30)))
        let client = try TestClient(port: port)
        client.send("ECHO fallback\n")
        #expect(client.readLine() == "fallback")
        other.send(SIGTERM)
        let result = await other.waitForExit(timeout: .seconds(60))
        #expect(result.status == 0, "\(result.summary)")
        #expect(result.stderr.contains("mainspring-daemon: socket activation: LISTEN_PID=1 names another process"), "\(result.stderr)")
    }
}

@Suite("systemd unit files and the README")
struct UnitFileTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    static let unitDirectory = root.appendingPathComponent("Examples/Daemon/systemd")

    private func unit(_ name: String) throws -> String {
        try String(contentsOf: Self.unitDirectory.appendingPathComponent(name), encoding: .utf8)
    }

    @Test("the service is Type=notify with a watchdog, restarts on failure, is hardened; the socket names what the service serves")
    func contents() throws {
        let service = try unit("mainspring-daemon.service")
        let lines = Set(service.split(separator: "\n").map(String.init))
        for required in ["Type=notify", "Restart=on-failure", "RestartPreventExitStatus=78", "DynamicUser=yes",
                         "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes",
                         "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "ExecReload=/bin/kill -HUP $MAINPID"] {
            #expect(lines.contains(required), "\(required) missing")
        }
        #expect(lines.contains { $0.hasPrefix("WatchdogSec=") })
        let socket = try unit("mainspring-daemon.socket")
        #expect(socket.contains("ListenStream=127.0.0.1:7000\n"))
        #expect(socket.contains("FileDescriptorName=line\n") && service.contains("--socket-name line"))
    }

    @Test("systemd-analyze verify accepts both units, without a warning; the service's exposure is at most 2.0",
          .enabled(if: analyze != nil, "systemd-analyze is not installed or cannot run (Debian: apt-get install systemd)"))
    func verify() async throws {
        let tool = try #require(analyze)
        // A copy whose ExecStart names the built daemon (verify checks that it exists).
        let directory = URL(fileURLWithPath: uniqueTestPath("units"))
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let service = try unit("mainspring-daemon.service")
        let executable = "ExecStart=/usr/local/bin/mainspring-daemon "
        #expect(service.contains(executable))
        try service.replacingOccurrences(of: executable, with: "ExecStart=\(try daemonPath()) ")
            .write(to: directory.appendingPathComponent("mainspring-daemon.service"), atomically: true, encoding: .utf8)
        try unit("mainspring-daemon.socket")
            .write(to: directory.appendingPathComponent("mainspring-daemon.socket"), atomically: true, encoding: .utf8)
        let units = ["mainspring-daemon.service", "mainspring-daemon.socket"].map { directory.appendingPathComponent($0).path }
        let verify = try await startProgram(tool, arguments: ["verify", "--man=no"] + units).waitForExit(timeout: .seconds(120))
        #expect(verify.status == 0 && verify.stderr.isEmpty && verify.stdout.isEmpty, "\(verify.summary)")

        // It does catch mistakes: an unknown directive is a warning.
        let broken = directory.appendingPathComponent("broken.service")
        try service.replacingOccurrences(of: executable, with: "ExecStart=\(try daemonPath()) ")
            .replacingOccurrences(of: "[Install]", with: "WatchdogSecs=5\n\n[Install]")
            .write(to: broken, atomically: true, encoding: .utf8)
        let caught = try await startProgram(tool, arguments: ["verify", "--man=no", broken.path]).waitForExit(timeout: .seconds(120))
        #expect(caught.stderr.contains("Unknown key 'WatchdogSecs'"), "\(caught.summary)")

        let security = try await startProgram(tool, arguments: ["security", "--offline=yes", "--threshold=20", units[0]])
            .waitForExit(timeout: .seconds(120))
        #expect(security.status == 0, "exposure over 2.0: \(security.stdout.split(separator: "\n").suffix(2))")
    }

    @Test("the README shows both unit files as they are, and its example is the fixture's readme-systemd scenario")
    func readmeShowsUnits() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let section = try #require(readme.range(of: "## Running under systemd"))
        let scenario = try String(contentsOf: Self.root.appendingPathComponent("Tests/Fixture/ReadmeSystemdScenario.swift"),
                                  encoding: .utf8)
        let begin = try #require(scenario.range(of: "    // README begin\n"))
        let end = try #require(scenario.range(of: "    // README end\n"))
        let example = scenario[begin.upperBound..<end.lowerBound].split(separator: "\n", omittingEmptySubsequences: false)
            .map { $0.hasPrefix("    ") ? $0.dropFirst(4) : $0 }.joined(separator: "\n")
        #expect(readme[section.upperBound...].contains("```swift\n\(example)```\n"),
                "README's example differs from Tests/Fixture/ReadmeSystemdScenario.swift")
        for name in ["mainspring-daemon.service", "mainspring-daemon.socket"] {
            let text = try unit(name)
            #expect(readme[section.upperBound...].contains("```ini\n\(text)```\n"),
                    "README's \(name) differs from Examples/Daemon/systemd/\(name)")
        }
    }
}
