import ExampleCommandLine
import Foundation
import KVService
import Mainspring
import MainspringHTTP

// mainspring-kv: a Redis-protocol (RESP2 and inline) server on Mainspring, its commands run by
// KVCore. The server itself is the KVService library (Examples/Libraries/KVService): KVServer.swift holds
// the keyspace's side (the core, the feeders for slow commands, freeing and expiry, INFO),
// KVClient.swift a connection's side; this file is the command line around it.
//
// Callbacks, not async: each connection is read with `readBytes` into KVCore's incremental
// parser, and a batch's replies go out with one `write`. Measured with redis-benchmark (-c 50,
// one loop, release build, on this 2-core machine shared with other builds), against the same
// server reading with `read(upTo:)` and replying with `send` from a task per connection on its
// loop: with -P 16, PING_MBULK 1.43M vs 1.36M requests/s, SET 1.04M vs 1.00M, GET 1.10M vs
// 1.05M; with -P 1, SET 102k vs 82k, GET 100k vs 80k. The async form costs a task resumption
// per batch (a job through the loop's executor) and a new array per read; the callback form
// takes libevent's chunk straight into the parser. The slow commands' feeding and backpressure
// are the same few lines either way (a FeedJob paused until `onWritable`).
//
// --loops N: the keyspace belongs to loop 0; connections are spread over all N loops, and a
// connection on another loop parses its input there and posts each batch of commands to loop 0,
// which posts the replies back (one batch in flight per connection). See BENCHMARKS.md for what
// that buys on 2 cores (nothing: loop 0 runs every command either way).
//
// SIGTERM and SIGINT stop the server: it exits 0 (nothing is persisted; open connections are
// closed by the exit).

let usage = """
    usage: mainspring-kv [options]
      --port <n>                 port (default 6379; 0: any free port, printed)
      --host <address>           address to listen on (default 127.0.0.1)
      --loops <n>                event loops / threads (default 1; the keyspace is on loop 0)
      --http-port <n>            also serve HTTP /metrics (Prometheus) and /healthz (0: any port)
      --client-output-limit <n>  bytes of pending output after which a client is disconnected,
                                 while CONFIG's client-output-buffer-limit normal is 0 0 0
                                 (default 67108864 = 64 MB; 0: no limit)
      --maxclients <n>           most connected clients (default 10000)
      --help                     this text
    """

/// Writes a line to stdout at once (unbuffered: the test harness reads the banner as it comes).
func say(_ text: String) {
    FileHandle.standardOutput.write(Data((text + "\n").utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("mainspring-kv: \(message)\n\(usage)\n".utf8))
    exit(2)
}

var options = KVServerOptions()
options.port = 6379
var httpPort: UInt16?
forEachFlag(in: Array(CommandLine.arguments.dropFirst()), help: { print(usage) }, fail: fail) { flag in
    switch flag.name {
    case "--port": options.port = UInt16(flag.number(0...65_535))
    case "--host": options.host = flag.value
    case "--loops": options.loops = flag.number(1...64)
    case "--http-port": httpPort = UInt16(flag.number(0...65_535))
    case "--client-output-limit": options.clientOutputLimit = flag.number(0...(1 << 40))
    case "--maxclients": options.maxClients = flag.number(1...1_000_000)
    default: fail("unknown option \(flag.name)")
    }
}

// No fastbins in glibc's malloc: they keep small freed chunks unmerged until some large free
// consolidates them all at once, and after the million frees of a `DEL` of a big list (done in
// slices) that one consolidation stalled the loop for ~9 ms (PING round trips during the DEL:
// 9-13 ms once per DEL with fastbins, under 4 ms without). Redis's jemalloc has no such step.
// (`mallopt` is not in Swift's Glibc module: looked up by name. M_MXFAST is 1 in <malloc.h>.)
//
// And a fixed mmap threshold of 1 MiB (M_MMAP_THRESHOLD, -3): every block of 1 MiB or more (the
// keyspace's slot array and index, a big list's or hash's buffers) is mapped on its own and
// unmapped when freed. glibc's default threshold starts at 128 KiB but rises to the size of
// each mapped block freed, up to 32 MiB: after the keyspace's index had doubled a few times,
// its next copies (and the slot array's) came from the heap, and stayed resident when freed.
// The RSS of 1,000,000 keys then held ~17 bytes a key of the index's earlier copies, and a
// FLUSHALL gave back less than half (34 MB of the 74 stayed resident). jemalloc (Redis) returns them.
if let symbol = dlsym(nil, "mallopt") {
    typealias Mallopt = @convention(c) (Int32, Int32) -> Int32
    let mallopt = unsafeBitCast(symbol, to: Mallopt.self)
    _ = mallopt(1, 0)  // M_MXFAST
    _ = mallopt(-3, 1 << 20)  // M_MMAP_THRESHOLD
}

// Like Redis: as many descriptors as the hard limit allows, for maxclients connections.
var limit = rlimit()
if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 && limit.rlim_cur < limit.rlim_max {
    limit.rlim_cur = limit.rlim_max
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

let main = EventLoop.main
var watchers: [Watcher] = []
do {
    for signal in [SIGTERM, SIGINT] { watchers.append(try main.onSignal(signal) { main.stop() }) }
} catch {
    FileHandle.standardError.write(Data("mainspring-kv: cannot watch signals: \(error)\n".utf8))
    exit(1)
}

let group: EventLoopGroup
let server: KVServer
do {
    group = try EventLoopGroup(loopCount: options.loops)
    server = try KVServer(group: group, options: options)
} catch {
    FileHandle.standardError.write(Data("mainspring-kv: cannot listen on \(options.host):\(options.port): \(error)\n".utf8))
    exit(1)
}
say("listening on \(options.host):\(server.port)")

var http: HTTPServer?
if let httpPort {
    var routes = HTTPRoutes()
    routes.serveMetrics(of: group)
    routes.serveHealth(of: group)
    do {
        http = try HTTPServer(group: group, configuration: .init(host: options.host, port: httpPort), routes: routes)
        say("http listening on \(options.host):\(http!.port)")
    } catch {
        FileHandle.standardError.write(Data("mainspring-kv: cannot listen for HTTP on port \(httpPort): \(error)\n".utf8))
        exit(1)
    }
}

do {
    try main.run()
} catch {
    FileHandle.standardError.write(Data("mainspring-kv: \(error)\n".utf8))
    exit(1)
}
exit(0)
