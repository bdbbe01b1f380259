import ExampleServices
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
import MainspringTestSupport
#endif

/// A Python client on a Unix stream socket: sends `ECHO u<i>` for i in 0..<count, with a
/// `SLEEP 2` and a `WORK 2` among them, pipelined in one write, and prints the replies one a
/// line (then "EOF" when the daemon closes the connection after `QUIT`).
private let pythonUnixClient = """
    import socket, sys
    path, count = sys.argv[1], int(sys.argv[2])
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect(path)
    lines = []
    for i in range(count):
        lines.append("SLEEP 2" if i == 5 else "WORK 2" if i == 7 else "ECHO u%d" % i)
    s.sendall(("\\n".join(lines) + "\\nQUIT\\n").encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    sys.stdout.write(data.decode())
    print("EOF")
    """

/// What `pythonUnixClient` should print for `count` requests.
private func expectedUnixReplies(_ count: Int) -> [String] {
    (0..<count).map { i in i == 5 ? "SLEPT 2" : i == 7 ? "DONE 2 \(WorkUnit.checksum(chunks: 2))" : "u\(i)" }
}

/// The lines a daemon prints at start: one "listening on …" per line endpoint, then one
/// "http listening on …" per HTTP endpoint.
private func readBanner(_ daemon: ChildProcess, lines: Int) throws -> [String] {
    var banner: [String] = []
    for _ in 0..<lines {
        banner.append(try #require(daemon.readLine(timeout: .seconds(30)), "the daemon printed only \(banner)"))
    }
    return banner
}

@Suite("mainspring-daemon on Unix sockets (subprocess)", .serialized)
struct DaemonUnixTests {
    @Test("--unix alone: the line protocol on a Unix socket only (Python client, pipelined); the file goes at exit")
    func unixOnly() async throws {
        let path = uniqueTestPath("daemon.sock")
        let daemon = try startExecutable("mainspring-daemon", arguments: ["--unix", path, "--loops", "2"])
        let banner = try readBanner(daemon, lines: 1)
        #expect(banner == ["listening on \(path) with 2 loop(s)"])
        var status = stat()
        #expect(lstat(path, &status) == 0 && status.st_mode & S_IFMT == S_IFSOCK)
        // Two clients at once, each with its replies in request order.
        async let first = runProgram("python3", arguments: ["-c", pythonUnixClient, path, "300"])
        async let second = runProgram("python3", arguments: ["-c", pythonUnixClient, path, "300"])
        for result in try await [first, second] {
            #expect(result.status == 0, "\(result.summary)")
            #expect(result.stdout.split(separator: "\n").map(String.init) == expectedUnixReplies(300) + ["BYE", "EOF"],
                    "\(result.stdout.prefix(300))")
        }
        daemon.send(SIGTERM)
        let result = await daemon.waitForExit(timeout: .seconds(30))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(!result.stdout.contains("127.0.0.1"), "a TCP listener too: \(result.stdout)")
        #expect(result.stderr.contains("connections=2 "), "\(result.stderr)")
        #expect(access(path, F_OK) != 0, "the socket file outlived the daemon")
    }

    @Test("--port and --unix, --http-port and --http-unix: all four answer; both files go at exit")
    func besideTCP() async throws {
        let path = uniqueTestPath("daemon-both.sock")
        let httpPath = uniqueTestPath("daemon-http.sock")
        let daemon = try startExecutable("mainspring-daemon", arguments: [
            "--port", "0", "--unix", path, "--http-port", "0", "--http-unix", httpPath, "--loops", "2",
        ])
        let banner = try readBanner(daemon, lines: 4)
        // "listening on 127.0.0.1:PORT with 2 loop(s)", "listening on PATH with 2 loop(s)",
        // "http listening on 127.0.0.1:PORT", "http listening on PATH"
        let tcpAddress = banner[0].split(separator: " ").dropFirst(2).first ?? ""
        let port = try #require(tcpAddress.split(separator: ":").last.flatMap { UInt16($0) }, "\(banner)")
        #expect(banner[1] == "listening on \(path) with 2 loop(s)", "\(banner)")
        let httpPort = try #require(banner[2].split(separator: ":").last.flatMap { UInt16($0) }, "\(banner)")
        #expect(banner[3] == "http listening on \(httpPath)", "\(banner)")

        let tcp = try TestClient(port: port)
        tcp.send("ECHO over tcp\n")
        #expect(tcp.readLine() == "over tcp")
        let unix = try await runProgram("python3", arguments: ["-c", pythonUnixClient, path, "20"])
        #expect(unix.stdout.split(separator: "\n").map(String.init) == expectedUnixReplies(20) + ["BYE", "EOF"],
                "\(unix.summary)")

        let health = try await runProgram("curl", arguments: ["-sS", "--unix-socket", httpPath, "http://localhost/healthz"])
        #expect(health.status == 0 && health.stdout == "ok\n", "\(health.summary)")
        let echoed = try await runProgram("curl", arguments: [
            "-sS", "--unix-socket", httpPath, "-d", "posted over unix", "http://localhost/echo",
        ])
        #expect(echoed.status == 0 && echoed.stdout == "posted over unix", "\(echoed.summary)")
        let metrics = try await runProgram("curl", arguments: ["-sS", "--unix-socket", httpPath, "http://localhost/metrics"])
        #expect(metrics.stdout.contains("mainspring_loop"), "\(metrics.stdout.prefix(300))")
        let overTCP = try await runProgram("curl", arguments: ["-sS", "http://127.0.0.1:\(httpPort)/healthz"])
        #expect(overTCP.stdout == "ok\n", "\(overTCP.summary)")

        tcp.send("QUIT\n")
        daemon.send(SIGTERM)
        let result = await daemon.waitForExit(timeout: .seconds(30))
        #expect(result.status == 0 && !result.crashedBySignal, "\(result.summary)")
        #expect(access(path, F_OK) != 0, "the line socket's file outlived the daemon")
        #expect(access(httpPath, F_OK) != 0, "the HTTP socket's file outlived the daemon")
    }

    @Test("a live socket is not taken over (exit 1), a stale one left by a killed daemon is; --unix with TLS is a usage error")
    func staleAndLive() async throws {
        let path = uniqueTestPath("daemon-stale.sock")
        let first = try startExecutable("mainspring-daemon", arguments: ["--unix", path, "--loops", "1"])
        _ = try readBanner(first, lines: 1)
        // A second daemon on the same path: the first one is alive, so it is refused.
        let second = try await runExecutable("mainspring-daemon", arguments: ["--unix", path, "--loops", "1"])
        #expect(second.status == 1, "\(second.summary)")
        #expect(second.stderr.contains(path) && second.stderr.contains("listening"), "\(second.stderr)")
        let alive = try await runProgram("python3", arguments: ["-c", pythonUnixClient, path, "3"])
        #expect(alive.stdout.hasPrefix("u0\nu1\nu2\n"), "the first daemon lost its socket: \(alive.summary)")
        // Killed: its file stays behind, stale. The next daemon replaces it.
        first.send(SIGKILL)
        _ = await first.waitForExit(timeout: .seconds(30))
        #expect(access(path, F_OK) == 0)
        let third = try startExecutable("mainspring-daemon", arguments: ["--unix", path, "--loops", "1"])
        #expect(try readBanner(third, lines: 1) == ["listening on \(path) with 1 loop(s)"])
        let served = try await runProgram("python3", arguments: ["-c", pythonUnixClient, path, "3"])
        #expect(served.stdout.hasPrefix("u0\nu1\nu2\n"), "\(served.summary)")
        third.send(SIGTERM)
        #expect(await third.waitForExit(timeout: .seconds(30)).status == 0)
        #expect(access(path, F_OK) != 0)

        // A regular file at --http-unix's path: exit 1, the file untouched, and the line
        // protocol's socket, which was listening by then, removed.
        let regular = uniqueTestPath("not-a-socket")
        try "keep".write(toFile: regular, atomically: false, encoding: .utf8)
        let refused = try await runExecutable("mainspring-daemon", arguments: ["--unix", path, "--http-unix", regular, "--loops", "1"])
        #expect(refused.status == 1 && refused.stderr.contains("regular file"), "\(refused.summary)")
        #expect(refused.stdout.contains("listening on \(path)"), "the line socket was up first: \(refused.summary)")
        #expect(try String(contentsOfFile: regular, encoding: .utf8) == "keep")
        #expect(access(path, F_OK) != 0, "--unix's socket file is gone")

        let tls = try await runExecutable("mainspring-daemon", arguments: [
            "--unix", path, "--tls-certificate", "/nonexistent.pem", "--tls-key", "/nonexistent.key",
        ])
        #expect(tls.status == 2 && tls.stderr.contains("plaintext only"), "\(tls.summary)")
    }
}
