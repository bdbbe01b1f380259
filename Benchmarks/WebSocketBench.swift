import CBaselines
import Foundation
import Mainspring
import MainspringHTTP

/// websocket: what WebSocket framing costs on top of the library's own line echo — the same
/// payloads, the same load, one server loop each — and what permessage-deflate gives and costs.
///
/// The servers, each on an `EventLoopGroup` of one loop:
/// - `mainspring`, `mainspring-binary`: an `HTTPServer` whose one route is the daemon's
///   `/ws/echo` (`routes.webSocket`, every message sent back from `for await message in
///   socket.messages`; permessage-deflate accepted when offered, which the C client does not).
///   `mainspring` is driven with text messages — UTF-8 checked and made a `String`, as the line
///   echo does with its lines —, `mainspring-binary` with binary ones.
/// - `line-echo`: a `Listener` on the loop, a task per connection on it (the async line
///   service's shape: a throwing discarding task group) echoing each line of
///   `connection.lines` with `send(line:)`.
///
/// Echo rate (`messages_per_s`: 64-byte messages, `messages_per_s_16kib`: 16 KiB): one C client
/// (`ms_echo_client_run`) on this thread, one epoll set, 32 connections, each keeping one
/// message in flight — a line (the payload and "\n"), or after the opening handshake one masked
/// frame with the payload (the masking key fixed) — sending the next as soon as its echo has
/// arrived and compared equal byte for byte; the echoes completed in 2 s after a 300 ms warm-up.
/// The payload is printable ASCII without a newline, the same bytes for both protocols.
/// `server_busy_pct` (`_16kib`): the server loop thread's CPU time over the whole run (warm-up
/// included) — near 100 the server is the limit; `client_busy_pct` (`_16kib`): the C client
/// thread's. The three servers run back to back for each size in each run;
/// `line_echo_ratio` (`_16kib`): a WebSocket variant's rate over the line echo's of the same run.
///
/// Memory (`bytes_per_connection`): as the `connections` scenario, the server in a process of its
/// own (this executable, `--child ws-echo-server` or `line-echo-server`, the servers above): its
/// RSS growth (VmRSS) from one warm connection to `CONNECTIONS` (10,000) more, per connection.
/// Each connection is opened by the C client (a WebSocket with its opening handshake), makes
/// one echo of 4 bytes and stays open, idle.
///
/// Compression (`json-deflate`, `json-uncompressed`): a stream of 10,000 JSON messages like
/// `{"id":17,"name":"sensor-17","value":26.29,"status":"ok"}` sent as text to the WebSocket echo
/// server by the library's own `WebSocket` client (the C client does not deflate), offering
/// permessage-deflate (context takeover, 15-bit windows) or not. `compression_ratio`: one
/// client sends the whole stream, one message in flight, through a relay that counts the bytes
/// after the HTTP heads (`ms_counting_relay_start`): frame bytes client → server over the
/// messages' bytes (the client's compressor; frame headers and the close frame included);
/// `compression_ratio_echo` the same server → client (the server's compressor).
/// `messages_per_s`: 32 client WebSockets on a loop of their own (the client side compresses and
/// inflates too), each cycling through the stream with one message in flight, echoes compared;
/// 2 s after a 300 ms warm-up; `server_busy_pct` and `client_busy_pct` the two loop threads'
/// CPU shares meanwhile (warm-up included), `server_cpu_us_per_message` the server's share
/// over the rate: its CPU time per echoed message.
let webSocketScenario = Scenario(
    name: "websocket",
    summary: "WebSocket echo vs the library's line echo: messages/s (64 B, 16 KiB; 32 C clients, one loop), bytes per idle connection, permessage-deflate ratio and cost"
) { runs in
    let idleCount = Int(ProcessInfo.processInfo.environment["CONNECTIONS"] ?? "") ?? sized(10_000, smoke: 100)
    raiseDescriptorLimit(to: idleCount + 1_000)
    let small = echoPayload(64)
    let large = echoPayload(16_384)
    let stream = jsonStream(count: sized(10_000, smoke: 200))
    let echoVariants: [(variant: String, kind: Int32)] = [
        ("mainspring", Int32(MS_ECHO_WS_TEXT)),
        ("mainspring-binary", Int32(MS_ECHO_WS_BINARY)),
        ("line-echo", Int32(MS_ECHO_LINE)),
    ]
    var samples = Samples()
    for _ in 0..<runs {
        for (payload, suffix) in [(small, ""), (large, "_16kib")] {
            // The three servers back to back, and their ratio within this run: the VM's speed
            // drifts between runs more than these ratios do.
            var rates: [String: Double] = [:]
            for (variant, kind) in echoVariants where variantEnabled(variant) {
                let figures = echoFigures(kind: kind, payload: payload, suffix: suffix)
                samples.add(variant, figures)
                rates[variant] = figures[0].1
            }
            if let lineRate = rates["line-echo"] {
                for variant in ["mainspring", "mainspring-binary"] {
                    if let rate = rates[variant] { samples.add(variant, "line_echo_ratio\(suffix)", rate / lineRate) }
                }
            }
        }
        for (variant, kind, child) in [("mainspring", Int32(MS_ECHO_WS_TEXT), "ws-echo-server"),
                                       ("line-echo", Int32(MS_ECHO_LINE), "line-echo-server")] where variantEnabled(variant)
        {
            let bytes = try idleBytesPerConnection(child: child, kind: kind, count: idleCount)
            samples.add(variant, "bytes_per_connection", bytes)
        }
        samples.add("json-deflate", compressionFigures(stream: stream, compress: true))
        samples.add("json-uncompressed", compressionFigures(stream: stream, compress: false))
    }
    return samples.records(scenario: "websocket")
}

private let echoClients: Int32 = 32
// A smoke run: 20 ms of warm-up, 100 ms measured.
private var warmupMilliseconds: Int32 { sized(300, smoke: 20) }
private var measuredMilliseconds: Int32 { sized(2_000, smoke: 100) }
private let webSocketPath = "/ws/echo"

/// `count` bytes of printable ASCII (no newline, valid UTF-8).
private func echoPayload(_ count: Int) -> [UInt8] {
    (0..<count).map { UInt8(0x21 + ($0 * 7) % 94) }
}

/// The repetitive JSON stream of the compression figures.
private func jsonStream(count: Int) -> [String] {
    (0..<count).map { id in
        let centi = 2_000 + (id * 37) % 1_000
        return "{\"id\":\(id),\"name\":\"sensor-\(id)\",\"value\":\(centi / 100).\(centi % 100 < 10 ? "0" : "")\(centi % 100),\"status\":\"ok\"}"
    }
}

// MARK: The servers

/// A server of the scenario on a group of one loop of its own.
private struct EchoServer {
    let port: UInt16
    let loop: EventLoop
    let stop: () -> Void
}

/// The daemon's `/ws/echo` on an `HTTPServer` (permessage-deflate accepted when offered).
private func startWebSocketEcho() -> EchoServer {
    let group = try! EventLoopGroup(loopCount: 1)
    var routes = HTTPRoutes()
    routes.webSocket(webSocketPath, configuration: .init(compression: .init())) { socket in
        for await message in socket.messages { try await socket.send(message) }
    }
    let server = try! HTTPServer(group: group, routes: routes)
    return EchoServer(port: server.port, loop: group.loops[0]) {
        server.close()
        group.shutdownBlocking(gracePeriod: .seconds(2))
    }
}

/// A `Listener` and a task per connection echoing its lines.
private func startLineEcho() -> EchoServer {
    let group = try! EventLoopGroup(loopCount: 1)
    let loop = group.loops[0]
    let listener = blockingAwait { try! await Listener(.tcp(), on: loop, group: group) }
    let serving = Task(executorPreference: loop) {
        try? await withThrowingDiscardingTaskGroup { tasks in
            do {
                for try await connection in listener.connections {
                    tasks.addTask(executorPreference: connection.loop) { () async throws in
                        await echoLines(connection)
                    }
                }
            } catch {
                // Cancelled: the listener is closed; the connections finish on their own.
            }
        }
    }
    return EchoServer(port: listener.port, loop: loop) {
        listener.close()
        group.shutdownBlocking(gracePeriod: .seconds(2))
        blockingAwait { await serving.value }
    }
}

private func echoLines(_ connection: Connection) async {
    do {
        for try await event in connection.lines {
            guard case .line(let text) = event else { continue }
            try await connection.send(line: text)
        }
    } catch {
        // Closed: nothing to answer.
    }
    connection.close()
}

/// The WebSocket echo server in a process of its own (for `bytes_per_connection`): prints
/// `listening on 127.0.0.1:<port>`, serves until its stdin is closed.
let webSocketEchoChild = ChildEntryPoint(name: "ws-echo-server") { arguments in
    raiseDescriptorLimit(to: arguments.first.flatMap(Int.init) ?? 1_024)
    serveUntilStdinCloses(startWebSocketEcho())
}

/// The line echo server in a process of its own, as `ws-echo-server`.
let lineEchoChild = ChildEntryPoint(name: "line-echo-server") { arguments in
    raiseDescriptorLimit(to: arguments.first.flatMap(Int.init) ?? 1_024)
    serveUntilStdinCloses(startLineEcho())
}

private func serveUntilStdinCloses(_ server: EchoServer) -> Never {
    FileHandle.standardOutput.write(Data("listening on 127.0.0.1:\(server.port)\n".utf8))
    _ = FileHandle.standardInput.readDataToEndOfFile()
    exit(0)
}

// MARK: Echo rate

/// The C client against a fresh server of `kind`'s protocol: messages per second (nan if a
/// connection failed) and both threads' CPU shares, each metric's name ending in `suffix`.
private func echoFigures(kind: Int32, payload: [UInt8], suffix: String) -> [(String, Double)] {
    let server = kind == Int32(MS_ECHO_LINE) ? startLineEcho() : startWebSocketEcho()
    defer { server.stop() }
    let serverBefore = threadCPUNanoseconds(of: server.loop)
    let clientBefore = currentThreadCPUNanoseconds()
    let started = nowNanoseconds()
    var seconds = 0.0
    var failures: Int64 = 0
    let echoes = payload.withUnsafeBufferPointer {
        ms_echo_client_run(server.port, kind, webSocketPath, $0.baseAddress, Int32($0.count), echoClients,
                           warmupMilliseconds, measuredMilliseconds, &seconds, &failures)
    }
    let elapsed = Double(nowNanoseconds() - started)
    let clientBusy = Double(currentThreadCPUNanoseconds() - clientBefore) / elapsed * 100
    let serverBusy = Double(threadCPUNanoseconds(of: server.loop) - serverBefore) / elapsed * 100
    if failures != 0 {
        FileHandle.standardError.write(Data("websocket: \(failures) connection(s) failed (kind \(kind), \(payload.count) bytes)\n".utf8))
    }
    return [("messages_per_s\(suffix)", failures == 0 && echoes > 0 ? Double(echoes) / seconds : .nan),
            ("server_busy_pct\(suffix)", serverBusy), ("client_busy_pct\(suffix)", clientBusy)]
}

private func currentThreadCPUNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

// MARK: Memory of an idle connection

/// Starts `child` (this executable) and returns its RSS growth per connection over `count`
/// idle connections of `kind` that each made one echo.
private func idleBytesPerConnection(child: String, kind: Int32, count: Int) throws -> Double {
    let server = Process()
    server.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    server.arguments = ["--child", child, "\(count + 1_000)"]
    let output = Foundation.Pipe()
    let input = Foundation.Pipe()
    server.standardOutput = output
    server.standardInput = input
    server.standardError = FileHandle.nullDevice
    try server.run()
    var descriptors: [Int32] = []
    defer {
        try? input.fileHandleForWriting.close()
        server.terminate()
        server.waitUntilExit()
        for fd in descriptors { close(fd) }
    }
    let banner = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
    guard let port = banner.split(separator: ":").last.flatMap({ UInt16($0.prefix { $0.isNumber }) }) else {
        throw BenchError.usage("websocket: the \(child) child printed no port: \(banner)")
    }
    let probe = Array("idle".utf8)
    func open() throws {
        let fd = ms_echo_client_open(port, kind, webSocketPath)
        guard fd >= 0 else {
            throw BenchError.usage("websocket: connection \(descriptors.count + 1) to \(child) refused (descriptor limit?)")
        }
        descriptors.append(fd)
        guard ms_echo_client_roundtrip(fd, kind, probe, Int32(probe.count)) == 0 else {
            throw BenchError.usage("websocket: \(child) gave a wrong or no echo")
        }
    }
    // One connection first, so that what the server allocates once is in the baseline.
    try open()
    usleep(sized(100_000, smoke: 20_000))
    let before = residentBytes(of: server.processIdentifier)
    descriptors.reserveCapacity(count + 1)
    for _ in 0..<count { try open() }
    usleep(sized(200_000, smoke: 20_000))
    let after = residentBytes(of: server.processIdentifier)
    return Double(after - before) / Double(count)
}

// MARK: Compression

/// The JSON stream with and without permessage-deflate: the wire ratios (one client through the
/// counting relay) and the echo rate of 32 client WebSockets; nan when an echo was wrong or
/// compression was not agreed as asked.
private func compressionFigures(stream: [String], compress: Bool) -> [(String, Double)] {
    let server = startWebSocketEcho()
    defer { server.stop() }
    let clientGroup = try! EventLoopGroup(loopCount: 1)
    defer { clientGroup.shutdownBlocking(gracePeriod: .seconds(2)) }
    let clientLoop = clientGroup.loops[0]
    let configuration = WebSocket.Configuration(compression: compress ? .init() : nil)
    let port = server.port

    // The ratio: the whole stream once, through the relay.
    var relayPort: UInt16 = 0
    let relay = ms_counting_relay_start(port, &relayPort)
    let relayed = relayPort
    let streamOK = blockingAwait { () async -> Bool in
        do {
            let socket = try await WebSocket.connect(host: "127.0.0.1", port: relayed, path: webSocketPath, on: clientLoop,
                                                     configuration: configuration)
            guard socket.isCompressed == compress else { return false }
            for text in stream {
                try await socket.send(text: text)
                guard case .text(let echo)? = await socket.receive(), echo == text else { return false }
            }
            _ = await socket.closeAndWait()
            return true
        } catch {
            return false
        }
    }
    var upstream: Int64 = 0
    var downstream: Int64 = 0
    ms_counting_relay_stop(relay, &upstream, &downstream)
    let payloadBytes = Double(stream.reduce(0) { $0 + $1.utf8.count })

    // The rate: 32 clients, one message in flight each.
    let serverBefore = threadCPUNanoseconds(of: server.loop)
    let clientBefore = threadCPUNanoseconds(of: clientLoop)
    let started = nowNanoseconds()
    let measuredFrom = started + UInt64(warmupMilliseconds) * 1_000_000
    let end = measuredFrom + UInt64(measuredMilliseconds) * 1_000_000
    let (echoes, failed) = blockingAwait {
        await withTaskGroup(of: (Int, Int).self) { tasks in
            for client in 0..<Int(echoClients) {
                tasks.addTask(executorPreference: clientLoop) {
                    do {
                        let socket = try await WebSocket.connect(host: "127.0.0.1", port: port, path: webSocketPath,
                                                                 on: clientLoop, configuration: configuration)
                        guard socket.isCompressed == compress else { return (0, 1) }
                        var index = client
                        var echoes = 0
                        while true {
                            let text = stream[index % stream.count]
                            index += Int(echoClients)
                            try await socket.send(text: text)
                            guard case .text(let echo)? = await socket.receive(), echo == text else { return (echoes, 1) }
                            let now = nowNanoseconds()
                            if now >= end { break }
                            if now >= measuredFrom { echoes += 1 }
                        }
                        _ = await socket.closeAndWait()
                        return (echoes, 0)
                    } catch {
                        return (0, 1)
                    }
                }
            }
            return await tasks.reduce(into: (0, 0)) { $0.0 += $1.0; $0.1 += $1.1 }
        }
    }
    let elapsed = Double(nowNanoseconds() - started)
    let serverBusy = Double(threadCPUNanoseconds(of: server.loop) - serverBefore) / elapsed * 100
    let clientBusy = Double(threadCPUNanoseconds(of: clientLoop) - clientBefore) / elapsed * 100
    if !streamOK || failed != 0 {
        FileHandle.standardError.write(Data("websocket: the JSON stream failed (compression \(compress), \(failed) client(s))\n".utf8))
    }
    let rate = failed == 0 ? Double(echoes) / (Double(measuredMilliseconds) / 1e3) : .nan
    return [("messages_per_s", rate),
            ("server_busy_pct", serverBusy), ("client_busy_pct", clientBusy),
            ("server_cpu_us_per_message", serverBusy / 100 / rate * 1e6),
            ("compression_ratio", streamOK ? Double(upstream) / payloadBytes : .nan),
            ("compression_ratio_echo", streamOK ? Double(downstream) / payloadBytes : .nan)]
}
