import ExampleCommandLine
import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP
import MainspringTLS

// mainspring-daemon: a line service on loopback, written with async/await, its connections
// spread over an EventLoopGroup (AsyncLineService; see LineService for the protocol).
// SIGINT/SIGTERM drain gracefully and exit 0 (a second one stops at once: exit 1); SIGHUP prints
// the counters to stderr. Its parts are a ServiceGroup: started in order, stopped in reverse. With
// --unix, the same service on a Unix stream socket too (or only). With --http-port and/or
// --http-unix, an HTTP side (HTTPSide.swift: /metrics, /healthz, /echo, /work). Under systemd
// (Systemd.swift): socket activation, readiness, status and reload notifications, a watchdog fed
// by the loops' health, journal priorities.

let usage = """
    usage: mainspring-daemon [options]
      --host <address>       address to listen on (default 127.0.0.1; ::1 for IPv6)
      --port <n>             port (default 0: any free port; the bound one is printed)
      --unix <path>          serve the line protocol on a Unix stream socket at this path
                             ("@name": abstract namespace) — instead of TCP, or beside it when
                             --port is given too; a stale socket file there is replaced, the
                             file is removed at exit
      --http-port <n>        also serve HTTP/1.1 and HTTP/2 (h2c with prior knowledge; h2 by ALPN
                         with --tls-*): /metrics, /healthz, POST /echo, /work?n=, and
                             GET /ws/echo, a WebSocket echo) on this port (0: any free port;
                             the bound one is printed)
      --http-unix <path>     also serve HTTP on a Unix stream socket at this path (beside
                             --http-port when both are given); removed at exit
      --loops <n>            event loops / threads (default: the number of cores)
      --max-line <bytes>     longest request line (default 4096)
      --output-limit <bytes> output buffered per connection before reading pauses (default 262144)
      --idle-timeout <s>     close connections idle this long (default 300; 0: never)
      --grace <s>            how long a shutdown waits for in-flight requests (default 5)
      --fd-limit <n>         lower the descriptor limit (to see EMFILE handled)
      --socket-name <name>   serve on the activated socket with this name (LISTEN_FDNAMES;
                             default: the first socket passed, if any)
      --status-interval <ms> how often STATUS= goes to the service manager (default 5000; 0: never)
      --tls-certificate <file>  serve the line protocol over TLS (and HTTPS on --http-port) with
      --tls-key <file>          this PEM certificate chain and key; SIGHUP reloads both files
      --help                 this text
    Sockets passed by socket activation (LISTEN_FDS) take the place of --host/--port (--unix
    still adds its socket).
    Exit status: 0 after a clean shutdown, 1 when it cannot listen (or a second SIGINT/SIGTERM
    cut the drain short), 2 for a bad command line, 78 when the sockets or environment passed
    by the service manager cannot be used.
    """

let log = DaemonLog()

func fail(_ message: String) -> Never {
    log(.error, "mainspring-daemon: \(message)")
    FileHandle.standardError.write(Data("\(usage)\n".utf8))
    exit(2)
}

func say(_ text: String, to handle: FileHandle = .standardOutput) {
    handle.write(Data((text + "\n").utf8))
}

var host = "127.0.0.1"
var port: UInt16 = 0
var portGiven = false
var httpPort: UInt16?
var unixPath: String?
var httpUnixPath: String?
var loops = ProcessInfo.processInfo.activeProcessorCount
var options = LineService.Options()
var grace = Duration.seconds(5)
var socketName: String?
var statusInterval = Duration.seconds(5)
var tlsCertificate: String?
var tlsKey: String?
forEachFlag(in: Array(CommandLine.arguments.dropFirst()), help: { say(usage) }, fail: fail) { flag in
    switch flag.name {
    case "--host": host = flag.value
    case "--port":
        port = UInt16(flag.number(0...65_535))
        portGiven = true
    case "--http-port": httpPort = UInt16(flag.number(0...65_535))
    case "--unix":
        guard !flag.value.isEmpty else { fail("--unix needs a path") }
        unixPath = flag.value
    case "--http-unix":
        guard !flag.value.isEmpty else { fail("--http-unix needs a path") }
        httpUnixPath = flag.value
    case "--loops": loops = flag.number(1...256)
    case "--max-line": options.maxLineLength = flag.number(16...(16 << 20))
    case "--output-limit": options.outputLimit = flag.number(1_024...(1 << 30))
    case "--idle-timeout":
        let seconds = flag.number(0...86_400)
        options.idleTimeout = seconds == 0 ? nil : .seconds(seconds)
    case "--grace": grace = .seconds(flag.number(0...3_600))
    case "--fd-limit":
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = rlim_t(flag.number(16...1_048_576))
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { fail("cannot set the descriptor limit") }
    case "--socket-name": socketName = flag.value
    case "--status-interval": statusInterval = .milliseconds(flag.number(0...3_600_000))
    case "--tls-certificate": tlsCertificate = flag.value
    case "--tls-key": tlsKey = flag.value
    default: fail("unknown option \(flag.name)")
    }
}

if unixPath != nil && tlsCertificate != nil {
    fail("--unix serves the line protocol in plaintext only: not with --tls-certificate (HTTPS on --http-unix is fine)")
}

// TLS: both files or neither; read now, so a bad pair is a clear error before anything starts.
let tls: TLSServerContext?
switch (tlsCertificate, tlsKey) {
case (nil, nil):
    tls = nil
case (let certificate?, let key?):
    do {
        // ALPN: an HTTPS client that offers h2 speaks HTTP/2 on the HTTP port; one that offers
        // neither (the line protocol's clients) is served without a protocol.
        tls = try TLSServerContext(configuration: .init(certificates: [.init(certificateFile: certificate, keyFile: key)],
                                                        applicationProtocols: ["h2", "http/1.1"]))
    } catch {
        log(.error, "mainspring-daemon: \(error)")
        exit(1)
    }
default:
    fail("--tls-certificate and --tls-key go together")
}

// Before any thread starts: socket activation reads and unsets LISTEN_* in the environment.
let activated = activatedSocket(named: socketName, log: log)
let manager = ServiceManagerLink(log: log)

// Everything that needs a file descriptor of its own is set up before the service accepts its
// first connection: once clients may have taken every descriptor (EMFILE), it would be too late.
// - SIGHUP's handler (its eventfd): held until exit, so that a SIGHUP while stopping is ignored
//   rather than fatal. (The service group watches SIGINT/SIGTERM from its start, before the
//   line service listens.)
// - The main loop's Dispatch main-queue bridge, installed by running the loop once: libdispatch
//   creates an eventfd for it, and aborts the process if it cannot.
let main = EventLoop.main
let hangupsHeld: Watcher
do {
    hangupsHeld = try main.onSignal(SIGHUP) {}
} catch {
    log(.error, "mainspring-daemon: cannot watch signals: \(error)")
    exit(1)
}
main.runOnce(blocking: false)

let group: EventLoopGroup
do {
    group = try EventLoopGroup(loopCount: loops)
} catch {
    log(.error, "mainspring-daemon: cannot start \(loops) loop(s): \(error)")
    exit(1)
}

/// The daemon could not start (it said why): exit with this status.
struct StartFailure: Error, CustomStringConvertible {
    let status: Int32
    var description: String { "exit status \(status)" }
}

/// The line service, once it listens (for status lines and SIGHUP's counters).
let lineService = Guarded<AsyncLineService?>(nil)
/// An HTTP side could not listen: the line service stops at once (no grace), to exit 1.
let abandoning = Guarded(false)
/// The service group (for the watchdog's state in status lines).
let services = Guarded<ServiceGroup?>(nil)

/// The STATUS= line: where the daemon serves and its counters.
func status(of service: AsyncLineService) -> String {
    "serving \(service.localAddresses.joined(separator: " and ")) on \(service.group.loops.count) loop(s): \(service.currentStats)"
        + manager.watchdogSummary(services.withLock { $0 }?.watchdog)
}

// The daemon is a service group: the line service, then its HTTP sides, then the SIGHUP
// handler, started in that order (each once the one before listens). SIGINT/SIGTERM stop them
// in reverse: SIGHUP's handler, the HTTP sides, then the line service drains (up to --grace).
// The group tells the service manager READY=1 once all three are up and STOPPING=1 when the
// drain begins, and feeds its watchdog while the loops are healthy; SIGHUP prints the counters
// (RELOADING=1 … READY=1 around it: the daemon has no configuration to re-read).
let drainGrace = grace
let lineMember = ServiceGroup.Member(name: "line service", stopDeadline: drainGrace + .seconds(10)) { @MainActor context in
    // The endpoints: the activated socket or host:port (not when --unix is given without
    // --port), then the unix socket.
    var endpoints: [LineService.Endpoint] = []
    if let activated {
        endpoints.append(.activated(activated))
    } else if unixPath == nil || portGiven {
        endpoints.append(.address(host: host, port: port))
    }
    if let unixPath { endpoints.append(.unix(path: unixPath)) }
    let service: AsyncLineService
    do {
        service = try await AsyncLineService(group: group, endpoints: endpoints, options: options, tls: tls)
    } catch {
        // The activated socket is unusable (78), unless the failure is the unix socket's (its
        // errors name its path): that one is an ordinary "cannot listen" (1).
        let unixFailed = unixPath.map { "\(error)".contains($0) } ?? false
        if let activated, !unixFailed {
            log(.error, "mainspring-daemon: cannot serve on the activated \(activated): \(error)")
            throw StartFailure(status: exitConfigurationError)
        }
        log(.error, "mainspring-daemon: cannot listen: \(error)")
        throw StartFailure(status: 1)
    }
    // One line per endpoint: "listening on <address> with <n> loop(s)".
    for (index, address) in service.localAddresses.enumerated() {
        let how = index == 0 ? activated.map { " (socket activation: \($0))" } ?? "" : ""
        say("listening on \(address)\(how) with \(loops) loop(s)")
    }
    lineService.withLock { $0 = service }
    context.started()
    await context.stopRequested()
    if abandoning.withLock({ $0 }) {
        await service.shutdown(gracePeriod: .zero)
        return
    }
    let report = await service.shutdown(gracePeriod: drainGrace)
    log(.info, "stopped: \(service.currentStats); \(report)")
}

// The application's own metrics, on the HTTP side's /metrics beside the loops' figures.
let metrics = MetricsRegistry()
do {
    options.requestCounter = try metrics.counter("mainspring_daemon_requests_total",
                                                 help: "Line-protocol requests the daemon has read (each request line).")
} catch {
    log(.error, "mainspring-daemon: \(error)")
    exit(1)
}
let httpMember = ServiceGroup.Member(name: "HTTP side", stopDeadline: drainGrace + .seconds(10)) { @MainActor context in
    var https: [HTTPServer] = []
    /// An HTTP side could not listen (it said why): what did start goes, then the line
    /// service (no socket file is left behind: --unix's, an HTTP one), then exit 1.
    func abandon() async throws -> Never {
        for http in https { await http.shutdown(gracePeriod: .zero) }
        abandoning.withLock { $0 = true }
        throw StartFailure(status: 1)
    }
    if let httpPort {
        guard let server = await startHTTPSide(group: group, host: host, port: httpPort, tls: tls, metrics: metrics) else {
            try await abandon()
        }
        https.append(server)
    }
    if let httpUnixPath {
        guard let server = await startHTTPSide(group: group, unixPath: httpUnixPath, tls: tls, metrics: metrics) else {
            try await abandon()
        }
        https.append(server)
    }
    context.started()
    await context.stopRequested()
    // Drained before the line service and the rest stop: requests in flight are answered
    // within the grace period, what outlasts it is cut.
    for http in https {
        let report = await http.shutdown(gracePeriod: drainGrace)
        if report.aborted > 0 || report.webSocketsAborted > 0 { log(.info, "HTTP side stopped: \(report)") }
    }
}

let reloadMember = ServiceGroup.Member(name: "SIGHUP") { @MainActor context in
    let hangups = try await main.signals([SIGHUP])
    context.started()
    let handler = Task { @MainActor in
        for await _ in hangups {
            guard let service = lineService.withLock({ $0 }) else { continue }
            manager.reload(status: { status(of: service) }) {
                log(.info, "stats: \(service.currentStats)")
                guard let tls else { return }
                do {
                    try tls.reload()
                    log(.info, "TLS: certificate and key reloaded")
                } catch {
                    log(.error, "TLS: reload failed, the previous certificate stays: \(error)")
                }
            }
        }
    }
    await context.stopRequested()
    handler.cancel()
    await handler.value
}

var configuration = ServiceGroup.Configuration()
configuration.serviceManager = manager.serviceManager(watchdogLoops: group.loops)
configuration.serviceManager.readyStatus = { lineService.withLock { $0 }.map { status(of: $0) } }
configuration.serviceManager.stoppingStatus = { reason in
    "\(reason): draining (up to \(drainGrace)): " + (lineService.withLock { $0 }.map { "\($0.currentStats)" } ?? "")
}
let statusEvery = statusInterval
configuration.onEvent = { event in
    switch event {
    case .ready:
        // Keep the manager posted, from a timer on the main loop.
        main.execute {
            manager.sendStatus(every: statusEvery, on: main) {
                lineService.withLock { $0 }.map { status(of: $0) } ?? ""
            }
        }
    case .stopRequested(.signal(let signal)):
        log(.info, "\(signal == SIGINT ? "SIGINT" : "SIGTERM"): draining (up to \(drainGrace))…")
    case .notificationFailed(let error):
        manager.notificationFailed(error)
    default:
        break
    }
}
let serviceGroup = ServiceGroup(httpPort == nil && httpUnixPath == nil ? [lineMember, reloadMember]
                                    : [lineMember, httpMember, reloadMember],
                                configuration: configuration)
services.withLock { $0 = serviceGroup }

let exitStatus = Guarded<Int32>(0)
Task { @MainActor in
    do throws(ServiceGroupError) {
        try await serviceGroup.run()
    } catch {
        if case .serviceFailed(_, let failure as StartFailure, _) = error {
            exitStatus.withLock { $0 = failure.status }  // said why already
        } else {
            log(.error, "mainspring-daemon: \(error)")
            exitStatus.withLock { $0 = 1 }
        }
    }
    main.stop()
}

do {
    try main.run()
} catch {
    log(.error, "mainspring-daemon: \(error)")
    exit(1)
}
manager.stop()
hangupsHeld.cancel()
exit(exitStatus.withLock { $0 })
