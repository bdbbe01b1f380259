import ExampleServices
import Foundation
import Mainspring

// mainspring-daemon: a line service on loopback, written with async/await, its connections
// spread over an EventLoopGroup (AsyncLineService; see LineService for the protocol). SIGINT and
// SIGTERM drain gracefully and exit 0; SIGHUP prints the counters to stderr.

let usage = """
    usage: mainspring-daemon [options]
      --host <address>       address to listen on (default 127.0.0.1; ::1 for IPv6)
      --port <n>             port (default 0: any free port; the bound one is printed)
      --loops <n>            event loops / threads (default: the number of cores)
      --max-line <bytes>     longest request line (default 4096)
      --output-limit <bytes> output buffered per connection before reading pauses (default 262144)
      --idle-timeout <s>     close connections idle this long (default 300; 0: never)
      --grace <s>            how long a shutdown waits for in-flight requests (default 5)
      --fd-limit <n>         lower the descriptor limit (to see EMFILE handled)
      --help                 this text
    """

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("mainspring-daemon: \(message)\n\(usage)\n".utf8))
    exit(2)
}

func say(_ text: String, to handle: FileHandle = .standardOutput) {
    handle.write(Data((text + "\n").utf8))
}

var host = "127.0.0.1"
var port: UInt16 = 0
var loops = ProcessInfo.processInfo.activeProcessorCount
var options = LineService.Options()
var grace = Duration.seconds(5)
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
    case "--port": port = UInt16(number(0...65_535))
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
    default: fail("unknown option \(flag)")
    }
}

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
    FileHandle.standardError.write(Data("mainspring-daemon: cannot watch signals: \(error)\n".utf8))
    exit(1)
}
main.runOnce(blocking: false)

let group: EventLoopGroup
do {
    group = try EventLoopGroup(loopCount: loops)
} catch {
    FileHandle.standardError.write(Data("mainspring-daemon: cannot start \(loops) loop(s): \(error)\n".utf8))
    exit(1)
}

// The daemon itself: a task on the main loop that starts the service (each connection served by
// a task on its own loop), then waits for signals. SIGINT/SIGTERM drain and end it.
Task { @MainActor in
    let service: AsyncLineService
    do {
        service = try await AsyncLineService(group: group, host: host, port: port, options: options)
    } catch {
        FileHandle.standardError.write(Data("mainspring-daemon: cannot listen on \(host):\(port): \(error)\n".utf8))
        exit(1)
    }
    let shown = host.contains(":") ? "[\(host)]" : host
    say("listening on \(shown):\(service.port) with \(loops) loop(s)")
    for await signal in signals {
        if signal == SIGHUP {
            say("stats: \(service.currentStats)", to: .standardError)
            continue
        }
        say("\(signal == SIGINT ? "SIGINT" : "SIGTERM"): draining (up to \(grace))…", to: .standardError)
        let report = await service.shutdown(gracePeriod: grace)
        say("stopped: \(service.currentStats); \(report)", to: .standardError)
        break
    }
    main.stop()
}

do {
    try main.run()
} catch {
    FileHandle.standardError.write(Data("mainspring-daemon: \(error)\n".utf8))
    exit(1)
}
exit(0)
