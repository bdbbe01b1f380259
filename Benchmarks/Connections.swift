import CBaselines
import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP

/// connections: what an idle connection costs a server in resident memory. The server runs in a
/// process of its own — the callback `LineService` (`mainspring`: this executable as a child,
/// `line-service`, one loop), `mainspring-daemon` (`mainspring-async`: the async service, the
/// release build next to this executable, one loop: each connection also holds its suspended
/// task), or the plain-C bufferevent line service (`libevent-c`: this executable as a child,
/// `echo-c`) — and
/// this process opens `CONNECTIONS` (10,000) loopback connections to it, each sending one `ECHO`
/// and reading the reply, then leaves them open. The metric is the server's RSS growth
/// (`/proc/<pid>/status`, VmRSS) from one warm connection to all of them, per connection.
/// The `http-` variants do the same with keep-alive HTTP connections that each made one
/// `GET /hello`: `HTTPServer` on one loop (`http-mainspring`: this executable as a child,
/// `http-server`) and the plain-C evhttp server of the http scenario (`http-libevent-c`,
/// `http-c`).
///
/// Descriptors: each side needs one per connection; both processes raise their soft limit (the
/// hard limit here is 20,000, so 10,000 fits with room for the rest).
let connectionsScenario = Scenario(
    name: "connections",
    summary: "server RSS per idle connection (10,000, one ECHO or GET each): line services and HTTPServer vs C bufferevent and evhttp"
) { runs in
    let count = Int(ProcessInfo.processInfo.environment["CONNECTIONS"] ?? "") ?? sized(10_000, smoke: 100)
    raiseDescriptorLimit(to: count + 1_000)
    var samples = Samples()
    let selfURL = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    let servers: [(variant: String, executable: URL, arguments: [String])] = [
        ("mainspring", selfURL, ["--child", "line-service", "\(count + 1_000)"]),
        ("mainspring-async", siblingExecutable("mainspring-daemon"),
         ["--port", "0", "--loops", "1", "--fd-limit", "\(count + 1_000)"]),
        ("libevent-c", selfURL, ["--child", "echo-c", "\(count + 1_000)"]),
        ("http-mainspring", selfURL, ["--child", "http-server", "\(count + 1_000)"]),
        ("http-libevent-c", selfURL, ["--child", "http-c", "\(count + 1_000)"]),
    ]
    let missing = servers.filter { !FileManager.default.isExecutableFile(atPath: $0.executable.path) }
    for server in missing where variantEnabled(server.variant) {
        let name = server.executable.lastPathComponent
        FileHandle.standardError.write(Data(
            "connections: \(name) is not built next to mainspring-bench: \(server.variant) is skipped\n".utf8))
    }
    for _ in 0..<runs {
        for server in servers where variantEnabled(server.variant) && !missing.contains(where: { $0.variant == server.variant }) {
            let bytes = try bytesPerConnection(count: count, http: server.variant.hasPrefix("http-")) {
                let process = Process()
                process.executableURL = server.executable
                process.arguments = server.arguments
                return process
            }
            samples.add(server.variant, "bytes_per_connection", bytes)
        }
    }
    return samples.records(scenario: "connections")
}

/// A plain-C server of the baselines in a process of its own: raises the descriptor limit to
/// its first argument, starts it with `start` (which sets the port), prints
/// `listening on 127.0.0.1:<port> (<label>)`, serves until its stdin is closed, then `stop`s it.
private func cServerChild(name: String, label: String, start: @escaping @Sendable (inout UInt16) -> UnsafeMutableRawPointer?,
                          stop: @escaping @Sendable (UnsafeMutableRawPointer?) -> Void) -> ChildEntryPoint
{
    ChildEntryPoint(name: name) { arguments in
        raiseDescriptorLimit(to: arguments.first.flatMap(Int.init) ?? 1_024)
        var port: UInt16 = 0
        let handle = start(&port)
        FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(port) (\(label))\n".utf8))
        _ = FileHandle.standardInput.readDataToEndOfFile()
        stop(handle)
        exit(0)
    }
}

/// The C line service (`echo-c`).
let echoCChild = cServerChild(name: "echo-c", label: "plain C", start: { ms_baseline_echo_start(&$0) },
                              stop: { ms_baseline_echo_stop($0) })

/// The plain-C evhttp server of the http scenario (`http-c`).
let httpCChild = cServerChild(name: "http-c", label: "plain C evhttp", start: { ms_baseline_http_start(&$0) },
                              stop: { ms_baseline_http_stop($0) })

/// `HTTPServer` on one loop, `GET /hello`, idle connections kept an hour, in a process of its
/// own: prints `listening on 127.0.0.1:<port>`, serves until its stdin is closed.
let httpServerChild = ChildEntryPoint(name: "http-server") { arguments in
    let count = arguments.first.flatMap(Int.init) ?? 1_024
    raiseDescriptorLimit(to: count)
    do {
        let group = try EventLoopGroup(loopCount: 1)
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        let server = try HTTPServer(group: group, configuration: .init(maxConnections: count, idleTimeout: .seconds(3_600)),
                                    routes: routes)
        FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(server.port) (HTTPServer)\n".utf8))
        _ = FileHandle.standardInput.readDataToEndOfFile()
        server.close()
        group.shutdownBlocking(gracePeriod: .zero)
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("http-server: \(error)\n".utf8))
        exit(1)
    }
}

/// The callback line service (`LineService`, one loop) in a process of its own: prints
/// `listening on 127.0.0.1:<port>`, serves until its stdin is closed.
let lineServiceChild = ChildEntryPoint(name: "line-service") { arguments in
    raiseDescriptorLimit(to: arguments.first.flatMap(Int.init) ?? 1_024)
    do {
        let group = try EventLoopGroup(loopCount: 1)
        let service = try LineService(group: group, options: .init(idleTimeout: nil))
        FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(service.port) (LineService)\n".utf8))
        _ = FileHandle.standardInput.readDataToEndOfFile()
        service.shutdown(gracePeriod: .zero)
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("line-service: \(error)\n".utf8))
        exit(1)
    }
}

/// The executable `name` next to this one (same build).
func siblingExecutable(_ name: String) -> URL {
    URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
        .appendingPathComponent(name)
}

/// Raises the soft descriptor limit to `wanted` (at most the hard limit).
func raiseDescriptorLimit(to wanted: Int) {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    limit.rlim_cur = min(limit.rlim_max, max(limit.rlim_cur, rlim_t(wanted)))
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

/// Starts the server `makeServer` describes, and returns its RSS growth per connection over
/// `count` idle connections that each made one `ECHO` request (`GET /hello` when `http`).
private func bytesPerConnection(count: Int, http: Bool = false, _ makeServer: () -> Process) throws -> Double {
    let server = makeServer()
    let output = Foundation.Pipe()
    let input = Foundation.Pipe()
    server.standardOutput = output
    server.standardInput = input
    server.standardError = FileHandle.nullDevice
    try server.run()
    defer {
        try? input.fileHandleForWriting.close()
        server.terminate()
        server.waitUntilExit()
    }
    let banner = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
    guard let port = banner.split(separator: " ").dropFirst(2).first?.split(separator: ":").last
        .flatMap({ UInt16($0.prefix { $0.isNumber }) })
    else {
        throw BenchError.usage("connections: the server printed no port: \(banner)")
    }
    func echo(_ client: BenchClient) throws {
        if http {
            client.send("GET /hello HTTP/1.1\r\nHost: bench\r\n\r\n")
            guard readHTTPResponse(client) else { throw BenchError.usage("connections: wrong or missing HTTP reply") }
            return
        }
        client.send("ECHO idle\n")
        guard client.readLine() == "idle" else { throw BenchError.usage("connections: wrong or missing reply") }
    }
    // One connection first, so that what every server allocates once (buffers, tables) is in
    // the baseline.
    guard let warm = BenchClient(port: port) else { throw BenchError.usage("connections: cannot connect") }
    try echo(warm)
    usleep(sized(100_000, smoke: 20_000))
    let before = residentBytes(of: server.processIdentifier)
    var clients: [BenchClient] = []
    clients.reserveCapacity(count)
    for _ in 0..<count {
        guard let client = BenchClient(port: port) else {
            throw BenchError.usage("connections: connection \(clients.count + 1) of \(count) refused (descriptor limit?)")
        }
        try echo(client)
        clients.append(client)
    }
    usleep(sized(200_000, smoke: 20_000))
    let after = residentBytes(of: server.processIdentifier)
    withExtendedLifetime((warm, clients)) {}
    return Double(after - before) / Double(count)
}

/// Resident memory of process `pid` in bytes (VmRSS), 0 if it cannot be read.
func residentBytes(of pid: Int32) -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kilobytes = Int(line.split(separator: " ").dropFirst().first ?? "")
    else { return 0 }
    return kilobytes * 1_024
}
