import Foundation
import Mainspring
import MainspringHTTP

// mainspring-supervise: a small process supervisor on Mainspring. It runs the programs of a
// JSON configuration file (Config.swift) as children (Subprocess), prefixes and forwards their
// output lines, restarts them with backoff, reloads the file when it is replaced or changed
// (file watching), checks each program's health URL (HTTPClient), serves /metrics and /healthz
// (HTTPServer), and on SIGTERM or SIGINT stops its children in order (grace, then SIGKILL).
//
// The supervisor itself runs on the main loop; the HTTP side and the health checks on a loop of
// their own, so that a burst of children's output never delays /healthz.

let usage = """
    usage: mainspring-supervise [--http-port <n>] [--http-host <address>] CONFIG
      CONFIG               the JSON file of programs (see Examples/Supervisor/Config.swift)
      --http-port <n>      port of /metrics and /healthz (default 0: any free port; printed as
                           "listening on HOST:PORT")
      --http-host <addr>   address of the HTTP side (default 127.0.0.1)
    Exit status: 0 after SIGTERM/SIGINT stopped every child, 1 when it cannot start, 2 for a bad
    command line or configuration.
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
    // The blocking initialiser, from the main thread before its loop runs.
    server = try HTTPServer(loop: http.loops[0], configuration: .init(host: httpHost, port: httpPort), routes: routes)
} catch {
    fail("cannot listen for HTTP on \(httpHost):\(httpPort): \(error)", status: 1)
}
FileHandle.standardOutput.write(Data("listening on \(httpHost.contains(":") ? "[\(httpHost)]" : httpHost):\(server.port)\n".utf8))

let client = HTTPClient(loop: http.loops[0], configuration: .init(maxConnectionsPerHost: 2, connectTimeout: .seconds(2),
                                                                 responseTimeout: .seconds(2)))
let supervisor = Supervisor(loop: main, configPath: configPath, config: config, stats: stats, client: client)
var finished = false
var signalWatchers: [Watcher] = []
do {
    for signal in [SIGTERM, SIGINT] {
        signalWatchers.append(try main.onSignal(signal) {
            supervisor.say("supervisor: stopping on signal \(signal)")
            supervisor.stop { finished = true }
        })
    }
    try supervisor.start()
} catch {
    fail("cannot start: \(error)", status: 1)
}
main.spin(until: { finished })
client.shutdown()
server.close()
http.shutdown(gracePeriod: .seconds(1))
supervisor.say("supervisor: stopped")
exit(0)
