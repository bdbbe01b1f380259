import ExampleServices
import Foundation
import Mainspring
import MainspringHTTP
import Synchronization

// mainspring-supervise: a small process supervisor on Mainspring. It runs the programs of a
// JSON configuration file (`SupervisorConfig`, in ExampleServices) as children (Subprocess), prefixes and forwards their
// output lines, restarts them with backoff, reloads the file when it is replaced or changed
// (file watching), checks each program's health URL (HTTPClient), serves /metrics and /healthz
// (HTTPServer), and on SIGTERM or SIGINT stops its children in order (grace, then SIGKILL): a
// ServiceGroup of its HTTP side and the supervisor proper, started in order, stopped in reverse.
//
// The supervisor itself runs on the main loop; the HTTP side and the health checks on a loop of
// their own, so that a burst of children's output never delays /healthz.

let usage = """
    usage: mainspring-supervise [--http-port <n>] [--http-host <address>] CONFIG
      CONFIG               the JSON file of programs (see SupervisorConfig in Examples/Libraries/ExampleServices)
      --http-port <n>      port of /metrics and /healthz (default 0: any free port; printed as
                           "listening on HOST:PORT")
      --http-host <addr>   address of the HTTP side (default 127.0.0.1)
    Exit status: 0 after SIGTERM/SIGINT stopped every child, 1 when it cannot start (or a second
    SIGTERM/SIGINT cut the stop short), 2 for a bad command line or configuration.
    """

func fail(_ message: String, status: Int32 = 2) -> Never {
    FileHandle.standardError.write(Data("mainspring-supervise: \(message)\n".utf8))
    if status == 2 { FileHandle.standardError.write(Data("\(usage)\n".utf8)) }
    exit(status)
}

var httpPort: UInt16 = 0
var httpHost = "127.0.0.1"
var configPath: String?
var arguments = Array(CommandLine.arguments.dropFirst())
while !arguments.isEmpty {
    let argument = arguments.removeFirst()
    switch argument {
    case "--http-port":
        guard let value = arguments.first.flatMap({ UInt16($0) }) else { fail("--http-port needs a port") }
        arguments.removeFirst()
        httpPort = value
    case "--http-host":
        guard let value = arguments.first else { fail("--http-host needs an address") }
        arguments.removeFirst()
        httpHost = value
    case "--help", "-h":
        print(usage)
        exit(0)
    default:
        guard configPath == nil, !argument.hasPrefix("-") else { fail("unexpected argument \(argument)") }
        configPath = argument
    }
}
guard let configPath else { fail("no configuration file given") }
let config: SupervisorConfig
do {
    config = try SupervisorConfig.load(configPath)
} catch {
    fail("cannot read \(configPath): \(error)")
}

let main = EventLoop.main
let http: EventLoopGroup
do {
    http = try EventLoopGroup(loopCount: 1)
} catch {
    fail("cannot start the HTTP loop: \(error)", status: 1)
}
let stats = SupervisorStats()
let client = HTTPClient(loop: http.loops[0], configuration: .init(maxConnectionsPerHost: 2, connectTimeout: .seconds(2),
                                                                 responseTimeout: .seconds(2)))

/// The supervisor could not start (it said why on stderr): exit 1.
struct StartFailure: Error, CustomStringConvertible {
    var description: String { "cannot start" }
}

@Sendable func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

// The supervisor is a service group of two: the HTTP side (/metrics, /healthz, and the health
// checks' client), then the supervisor with its children, which relies on it. SIGTERM or SIGINT
// stops them in reverse: the children first (in the configuration's order, each SIGTERM then
// SIGKILL after its grace), then the HTTP side. A second signal stops at once.
let httpSide = ServiceGroup.Member(name: "HTTP side") { @MainActor context in
    let exporter = LoopMetricsExporter(loops: [main, http.loops[0]])
    var routes = HTTPRoutes()
    routes.serveHealth(of: [main, http.loops[0]])
    routes.on([.get], "/metrics", responding: { request, responder in
        exporter.collect(on: request.loop, server: request.server) { loops in
            responder.send(.text(stats.render() + loops,
                                 headers: ["Content-Type": "text/plain; version=0.0.4; charset=utf-8"]))
        }
    })
    let server: HTTPServer
    do {
        server = try await HTTPServer(loop: http.loops[0], configuration: .init(host: httpHost, port: httpPort), routes: routes)
    } catch {
        FileHandle.standardError.write(Data("mainspring-supervise: cannot listen for HTTP on \(httpHost):\(httpPort): \(error)\n".utf8))
        throw StartFailure()
    }
    say("listening on \(httpHost.contains(":") ? "[\(httpHost)]" : httpHost):\(server.port)")
    context.started()
    await context.stopRequested()
    client.shutdown()
    await server.shutdown(gracePeriod: .seconds(1))
    _ = await http.shutdown(gracePeriod: .seconds(1))
}

/// The supervisor, once it runs: after a forced stop its remaining children are killed.
var runningSupervisor: Supervisor?

// Its children's graces, and some: a stop that takes longer is cut short (exit 1).
let children = ServiceGroup.Member(name: "supervisor",
                                   stopDeadline: .seconds(30 + Int(config.programs.map(\.grace).reduce(0, +)))) {
    @MainActor context in
    let supervisor = Supervisor(loop: main, configPath: configPath, config: config, stats: stats, client: client)
    runningSupervisor = supervisor
    do {
        try supervisor.start()
    } catch {
        FileHandle.standardError.write(Data("mainspring-supervise: cannot start: \(error)\n".utf8))
        throw StartFailure()
    }
    context.started()
    await context.stopRequested()
    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in supervisor.stop { done.resume() } }
}

var configuration = ServiceGroup.Configuration()
configuration.onEvent = { event in
    if case .stopRequested(.signal(let signal)) = event { say("supervisor: stopping on signal \(signal)") }
}
let exitStatus = Atomic<Int32>(0)
Task { @MainActor in
    do throws(ServiceGroupError) {
        try await ServiceGroup([httpSide, children], configuration: configuration).run()
        say("supervisor: stopped")
    } catch {
        if case .serviceFailed(_, _ as StartFailure, _) = error {
            exitStatus.store(1, ordering: .relaxed)  // said why already
        } else {
            FileHandle.standardError.write(Data("mainspring-supervise: \(error)\n".utf8))
            exitStatus.store(1, ordering: .relaxed)
        }
    }
    main.stop()
}
do {
    try main.run()
} catch {
    fail("\(error)", status: 1)
}
// After a forced stop (or a stop past its deadline) children may be left: none outlives us.
runningSupervisor?.killRemaining()
exit(exitStatus.load(ordering: .relaxed))
