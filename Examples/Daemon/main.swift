import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP
import MainspringTLS

// mainspring-daemon: a line service on loopback, written with async/await, its connections
// spread over an EventLoopGroup (AsyncLineService; see LineService for the protocol).
// SIGINT/SIGTERM drain gracefully and exit 0; SIGHUP prints the counters to stderr. With
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
      --http-port <n>        also serve HTTP (/metrics, /healthz, POST /echo, /work?n=) on this
                             port (0: any free port; the bound one is printed)
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
    Exit status: 0 after a clean shutdown, 1 when it cannot listen, 2 for a bad command line,
    78 when the sockets or environment passed by the service manager cannot be used.
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
var arguments = Array(CommandLine.arguments.dropFirst())
while !arguments.isEmpty {
    let flag = arguments.removeFirst()
    if flag == "--help" || flag == "-h" {
        say(usage)
        exit(0)
    }
    guard let value = arguments.first else { fail("\(flag) needs a value") }
    arguments.removeFirst()
    func number(_ range: ClosedRange<Int>) -> Int {
        guard let n = Int(value), range.contains(n) else { fail("\(flag) needs a number in \(range), not '\(value)'") }
        return n
    }
    switch flag {
    case "--host": host = value
    case "--port":
        port = UInt16(number(0...65_535))
        portGiven = true
    case "--http-port": httpPort = UInt16(number(0...65_535))
    case "--unix":
        guard !value.isEmpty else { fail("--unix needs a path") }
        unixPath = value
    case "--http-unix":
        guard !value.isEmpty else { fail("--http-unix needs a path") }
        httpUnixPath = value
    case "--loops": loops = number(1...256)
    case "--max-line": options.maxLineLength = number(16...(16 << 20))
    case "--output-limit": options.outputLimit = number(1_024...(1 << 30))
    case "--idle-timeout":
        let seconds = number(0...86_400)
        options.idleTimeout = seconds == 0 ? nil : .seconds(seconds)
    case "--grace": grace = .seconds(number(0...3_600))
    case "--fd-limit":
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = rlim_t(number(16...1_048_576))
        guard setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { fail("cannot set the descriptor limit") }
    case "--socket-name": socketName = value
    case "--status-interval": statusInterval = .milliseconds(number(0...3_600_000))
    case "--tls-certificate": tlsCertificate = value
    case "--tls-key": tlsKey = value
    default: fail("unknown option \(flag)")
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
        tls = try TLSServerContext(configuration: .init(certificateFile: certificate, keyFile: key))
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
// - The signal handlers (their loop has an eventfd, an epoll and a timerfd).
// - The main loop's Dispatch main-queue bridge, installed by running the loop once: libdispatch
//   creates an eventfd for it, and aborts the process if it cannot.
let main = EventLoop.main
let signals: EventLoop.Signals
do {
    signals = try main.signals([SIGINT, SIGTERM, SIGHUP])
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

/// The STATUS= line: where the daemon serves and its counters.
@MainActor func status(of service: AsyncLineService) -> String {
    "serving \(service.localAddresses.joined(separator: " and ")) on \(service.group.loops.count) loop(s): \(service.currentStats)"
        + manager.watchdogSummary
}

// The daemon itself: a task on the main loop that starts the service (each connection served by
// a task on its own loop), tells the service manager, then waits for signals. SIGINT/SIGTERM
// drain and end it; SIGHUP prints the counters (the manager hears RELOADING=1 … READY=1 around
// it: the daemon has no configuration to re-read).
Task { @MainActor in
    // The endpoints: the activated socket or host:port (not when --unix is given without
    // --port), then the unix socket.
    var endpoints: [LineService.Endpoint] = []
    if let activated {
        endpoints.append(.activated(activated))
    } else if unixPath == nil || portGiven {
        endpoints.append(.address(host: host, port: port))
    }
    if let unixPath { endpoints.append(.unix(path: unixPath)) }
    // The application's own metrics, on the HTTP side's /metrics beside the loops' figures.
    let metrics = MetricsRegistry()
    do {
        options.requestCounter = try metrics.counter("mainspring_daemon_requests_total",
                                                     help: "Line-protocol requests the daemon has read (each request line).")
    } catch {
        log(.error, "mainspring-daemon: \(error)")
        exit(1)
    }
    let service: AsyncLineService
    do {
        service = try await AsyncLineService(group: group, endpoints: endpoints, options: options, tls: tls)
    } catch {
        // The activated socket is unusable (78), unless the failure is the unix socket's (its
        // errors name its path): that one is an ordinary "cannot listen" (1).
        let unixFailed = unixPath.map { "\(error)".contains($0) } ?? false
        if let activated, !unixFailed {
            log(.error, "mainspring-daemon: cannot serve on the activated \(activated): \(error)")
            exit(exitConfigurationError)
        }
        log(.error, "mainspring-daemon: cannot listen: \(error)")
        exit(1)
    }
    // One line per endpoint: "listening on <address> with <n> loop(s)".
    for (index, address) in service.localAddresses.enumerated() {
        let how = index == 0 ? activated.map { " (socket activation: \($0))" } ?? "" : ""
        say("listening on \(address)\(how) with \(loops) loop(s)")
    }
    var https: [HTTPServer] = []
    /// An HTTP side could not listen (it said why): what did start goes, so that no socket file
    /// is left behind (`--unix`'s, an HTTP one), then exit 1.
    func abandon() async -> Never {
        for http in https { await http.close() }
        await service.shutdown(gracePeriod: .zero)
        exit(1)
    }
    if let httpPort {
        guard let server = await startHTTPSide(group: group, host: host, port: httpPort, tls: tls, metrics: metrics) else { await abandon() }
        https.append(server)
    }
    if let httpUnixPath {
        guard let server = await startHTTPSide(group: group, unixPath: httpUnixPath, tls: tls, metrics: metrics) else { await abandon() }
        https.append(server)
    }

    // Accepting: tell the service manager, keep it posted, and feed its watchdog while the
    // group's loops are healthy.
    manager.ready(status: status(of: service))
    manager.startWatchdog(over: group.loops)
    manager.sendStatus(every: statusInterval, on: main) { MainActor.assumeIsolated { status(of: service) } }

    for await signal in signals {
        if signal == SIGHUP {
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
            continue
        }
        let name = signal == SIGINT ? "SIGINT" : "SIGTERM"
        manager.stopping(status: "\(name): draining (up to \(grace)): \(service.currentStats)")
        log(.info, "\(name): draining (up to \(grace))…")
        for http in https { await http.close() }
        let report = await service.shutdown(gracePeriod: grace)
        log(.info, "stopped: \(service.currentStats); \(report)")
        break
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
exit(0)
