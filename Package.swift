// swift-tools-version:6.2
import PackageDescription

// Opt-in, experimental: `MAINSPRING_MAIN_EXECUTOR=1 swift build` compiles
// `EventLoop.installAsMainExecutor()` (Swift 6.3's custom main executor SPI; see README).
let experimentalMainExecutor: [SwiftSetting] =
    Context.environment["MAINSPRING_MAIN_EXECUTOR"] == "1" ? [.define("MAINSPRING_MAIN_EXECUTOR")] : []

let package = Package(
    name: "Mainspring",
    products: [
        // The three modules with one job each (the next three products), re-exported:
        // `import Mainspring` gives the whole library but HTTP, TLS and Testing.
        .library(name: "Mainspring", targets: ["Mainspring"]),
        // Each job on its own, for a dependent that wants only that part.
        .library(name: "MainspringCore", targets: ["MainspringCore"]),
        .library(name: "MainspringPatterns", targets: ["MainspringPatterns"]),
        .library(name: "MainspringServices", targets: ["MainspringServices"]),
        .library(name: "MainspringHTTP", targets: ["MainspringHTTP"]),
        .library(name: "MainspringTLS", targets: ["MainspringTLS"]),
        .library(name: "MainspringTesting", targets: ["MainspringTesting"]),
        .executable(name: "mainspring-demo", targets: ["mainspring-demo"]),
        .executable(name: "mainspring-daemon", targets: ["mainspring-daemon"]),
        .executable(name: "mainspring-bench", targets: ["mainspring-bench"]),
        .executable(name: "mainspring-operations", targets: ["mainspring-operations"]),
        .executable(name: "mainspring-chat", targets: ["mainspring-chat"]),
        .executable(name: "mainspring-kv", targets: ["mainspring-kv"]),
        .executable(name: "mainspring-supervise", targets: ["mainspring-supervise"]),
    ],
    targets: [
        // ---- The library products (Sources/): the core, its three siblings, the umbrella,
        // HTTP, TLS, Testing, and the C modules they link (one folder of C calls each).

        // libevent 2.1 through pkg-config; `make` installs libevent-dev when it is missing.
        .systemLibrary(
            name: "CLibevent",
            path: "CLibevent",
            pkgConfig: "libevent",
            providers: [.apt(["libevent-dev"])]
        ),
        // The operating system's calls that Swift cannot make directly (variadic syscalls, the
        // cycle counter, libdispatch's main-queue hooks).
        .target(
            name: "CMainspringSystem",
            path: "Sources/CMainspringSystem"
        ),
        // The loop and what it drives: executor, feeder, timers, signals, metrics, sockets and
        // names, UDP, child processes, file watching, socket activation. Its libevent calls are
        // in its Libevent/ folder (the folder keeps the library's name: Sources/Mainspring).
        .target(
            name: "MainspringCore",
            dependencies: ["CLibevent", "CMainspringSystem"],
            path: "Sources/Mainspring",
            swiftSettings: experimentalMainExecutor
        ),
        // The seed patterns on top of the loop: Operations that spin it and completion hooks,
        // the GCD-style `Queue` and `Semaphore`, `Timeline`.
        .target(
            name: "MainspringPatterns",
            dependencies: ["MainspringCore"],
            path: "Sources/MainspringPatterns"
        ),
        // Running as a service: the service group (ordered start, reverse-ordered stop with
        // deadlines), systemd readiness, the watchdog, the journal.
        .target(
            name: "MainspringServices",
            dependencies: ["MainspringCore"],
            path: "Sources/MainspringServices"
        ),
        // The umbrella: `import Mainspring` re-exports the three modules above.
        .target(
            name: "Mainspring",
            dependencies: ["MainspringCore", "MainspringPatterns", "MainspringServices"],
            path: "Sources/MainspringUmbrella"
        ),
        // Deterministic simulation for tests: virtual time, modelled CPU, seeded order. Depends
        // on MainspringCore alone (it reaches the loop through the `Simulation` SPI).
        .target(
            name: "MainspringTesting",
            dependencies: ["MainspringCore"],
            path: "Sources/MainspringTesting"
        ),
        // OpenSSL 3 and libevent's OpenSSL bufferevents through pkg-config (`libevent_openssl`
        // brings `openssl`); `make` installs libssl-dev when it is missing. Only MainspringTLS
        // links it: the core module does not.
        .systemLibrary(
            name: "CMainspringTLS",
            path: "Sources/CMainspringTLS",
            pkgConfig: "libevent_openssl",
            providers: [.apt(["libevent-dev", "libssl-dev"])]
        ),
        // TLS for connections and listeners, and the layer under HTTPS: MainspringHTTP takes it
        // through the core's `ServerConnectionSecurity` / `ClientConnectionSecurity`, so neither
        // module depends on the other. Its OpenSSL calls are in its OpenSSL/ folder.
        .target(
            name: "MainspringTLS",
            dependencies: ["MainspringCore", "CLibevent", "CMainspringTLS"],
            path: "Sources/MainspringTLS"
        ),
        // zlib through pkg-config, for WebSocket compression (permessage-deflate); `make`
        // installs zlib1g-dev when it is missing.
        .systemLibrary(
            name: "CZlib",
            path: "Sources/CZlib",
            pkgConfig: "zlib",
            providers: [.apt(["zlib1g-dev"])]
        ),
        // nghttp2 through pkg-config, for HTTP/2 (server and client); `make` installs
        // libnghttp2-dev when it is missing.
        .systemLibrary(
            name: "CNGHTTP2",
            path: "Sources/CNGHTTP2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        // HTTP for daemons, HTTP/1.1 in Swift and HTTP/2 on nghttp2 over the core's connections:
        // routes, streaming, Prometheus metrics, health, WebSockets. It imports no CLibevent; only
        // its Deflate/ folder imports CZlib, only its NGHTTP2/ folder CNGHTTP2.
        .target(
            name: "MainspringHTTP",
            dependencies: ["MainspringCore", "CZlib", "CNGHTTP2"],
            path: "Sources/MainspringHTTP"
        ),
        // ---- Not products: what the examples, the benchmarks and the fuzzer are made of. Each
        // lives beside what uses it (Examples/Libraries, Benchmarks/, Fuzz/), and no library
        // product depends on any of it (`make check-dependents` checks that a dependent compiles
        // only library targets).

        // Plain-C TLS peers for the `tls` benchmark (libevent + bufferevent_openssl), and a
        // blocking OpenSSL client for its load generators (CBaselines: the region `--counts` counts).
        .target(
            name: "CTLSBaselines",
            dependencies: ["CLibevent", "CMainspringTLS", "CBaselines"],
            path: "Benchmarks/CTLSBaselines"
        ),
        // Plain-C libevent loops: the baselines `mainspring-bench` compares against.
        .target(
            name: "CBaselines",
            dependencies: ["CLibevent"],
            path: "Benchmarks/CBaselines"
        ),
        // What the examples serve (command parsers, the demo's job, the daemon's line service):
        // a library, so the benchmark, the fuzzer and the tests use the very same code.
        .target(
            name: "ExampleServices",
            dependencies: ["Mainspring", "MainspringCore", "MainspringHTTP", "MainspringTLS", "MainspringTesting",
                           "KVService"],
            path: "Examples/Libraries/ExampleServices"
        ),
        // The `--flag value` command line that mainspring-daemon and mainspring-kv share: a target
        // of its own, without dependencies, so that the KV server does not build TLS to have it.
        .target(name: "ExampleCommandLine", path: "Examples/Libraries/ExampleCommandLine"),
        // The pure logic of a Redis-protocol server (RESP2 parser, reply encoder, keyspace,
        // commands, sliced slow commands): no dependencies, so the network side wires it up.
        .target(name: "KVCore", path: "Examples/Libraries/KVCore"),
        // The network side of mainspring-kv (KVCore's commands on Mainspring's loops): a library,
        // so the tests and the reliability benchmark run the very same server on simulated loops.
        .target(name: "KVService", dependencies: ["Mainspring", "MainspringCore", "KVCore"], path: "Examples/Libraries/KVService"),
        .executableTarget(
            name: "mainspring-demo",
            dependencies: ["Mainspring", "ExampleServices"],
            path: "Examples/Interactive"
        ),
        // Fuzz harnesses (a library, so the test suite replays the corpus through them) and the
        // libFuzzer driver / corpus replayer (`make fuzz`).
        .target(
            name: "MainspringFuzzing",
            dependencies: ["Mainspring", "MainspringHTTP", "ExampleServices"],
            path: "Fuzz/Harnesses"
        ),
        .executableTarget(
            name: "mainspring-fuzz",
            dependencies: ["MainspringFuzzing"],
            path: "Fuzz",
            exclude: ["Corpus", "Harnesses"]
        ),
        .executableTarget(
            name: "mainspring-daemon",
            dependencies: ["Mainspring", "MainspringHTTP", "MainspringTLS", "ExampleServices", "ExampleCommandLine"],
            path: "Examples/Daemon",
            exclude: ["systemd"]  // the unit files
        ),
        // The README's quick start, exactly as printed there (a test compares the two and runs it).
        .executableTarget(
            name: "mainspring-quickstart",
            dependencies: ["Mainspring"],
            path: "Examples/QuickStart"
        ),
        // The README's async daemon, exactly as printed there (a test compares the two and runs it).
        .executableTarget(
            name: "mainspring-echo",
            dependencies: ["Mainspring"],
            path: "Examples/Echo"
        ),
        // A chat room: bounded fan-out with a slow-consumer policy.
        .executableTarget(
            name: "mainspring-chat",
            dependencies: ["Mainspring", "ExampleServices"],
            path: "Examples/Chat"
        ),
        // A Redis-protocol server: KVCore's commands on Mainspring's loops (`Examples/KV/tests`
        // holds the redis-py oracle and the redis-cli session the tests run against it).
        .executableTarget(
            name: "mainspring-kv",
            dependencies: ["Mainspring", "MainspringHTTP", "KVService", "ExampleCommandLine"],
            path: "Examples/KV",
            exclude: ["tests"]
        ),
        // A batch of asynchronous saves, with completion hooks on the main loop.
        .executableTarget(
            name: "mainspring-supervise",
            dependencies: ["Mainspring", "MainspringHTTP", "ExampleServices"],
            path: "Examples/Supervisor"
        ),
        .executableTarget(
            name: "mainspring-operations",
            dependencies: ["Mainspring"],
            path: "Examples/Operations"
        ),
        .executableTarget(
            name: "mainspring-bench",
            dependencies: ["Mainspring", "MainspringHTTP", "MainspringTLS", "MainspringTesting", "CBaselines", "CTLSBaselines",
                           "ExampleServices"],
            path: "Benchmarks",
            exclude: ["CBaselines", "CTLSBaselines"],
            swiftSettings: experimentalMainExecutor
        ),
        // Programs the tests start as subprocesses: scenarios that need the process main thread
        // (`EventLoop.main`, `DispatchQueue.main`, `@MainActor`). `mainspring-fixture <scenario>`.
        .executableTarget(
            name: "mainspring-fixture",
            dependencies: ["Mainspring"],
            path: "Tests/Fixture",
            swiftSettings: experimentalMainExecutor
        ),
        // What the test targets share: threads, pipes, sockets, a fake notification socket, and
        // the fixture that runs the package's executables as subprocesses.
        .target(
            name: "MainspringTestSupport",
            dependencies: ["MainspringCore", "CMainspringSystem"],
            path: "Tests/Support"
        ),
        // One test target per module: MainspringTests is the core's (and the examples', which
        // run it end to end).
        .testTarget(
            name: "MainspringTests",
            dependencies: ["Mainspring", "MainspringHTTP", "MainspringTLS", "MainspringFuzzing", "ExampleServices",
                           "CMainspringSystem", "KVCore", "KVService", "MainspringTesting", "MainspringTestSupport"],
            path: "Tests/MainspringTests",
            swiftSettings: experimentalMainExecutor
        ),
        .testTarget(
            name: "MainspringHTTPTests",
            dependencies: ["Mainspring", "MainspringCore", "MainspringHTTP", "MainspringTLS", "MainspringTesting",
                           "MainspringServices", "ExampleServices", "MainspringTestSupport"],
            path: "Tests/MainspringHTTPTests"
        ),
        .testTarget(
            name: "MainspringTLSTests",
            dependencies: ["Mainspring", "MainspringTLS", "MainspringHTTP", "MainspringTesting", "MainspringTestSupport"],
            path: "Tests/MainspringTLSTests"
        ),
        .testTarget(
            name: "MainspringPatternsTests",
            dependencies: ["MainspringCore", "MainspringPatterns", "MainspringTesting", "MainspringTestSupport"],
            path: "Tests/MainspringPatternsTests"
        ),
        .testTarget(
            name: "MainspringServicesTests",
            dependencies: ["MainspringCore", "MainspringServices", "CMainspringSystem", "MainspringTesting",
                           "MainspringTestSupport"],
            path: "Tests/MainspringServicesTests"
        ),
        .testTarget(
            name: "MainspringTestingTests",
            dependencies: ["Mainspring", "MainspringTesting", "MainspringHTTP", "MainspringTLS", "MainspringTestSupport"],
            path: "Tests/MainspringTestingTests"
        ),
    ],
    swiftLanguageModes: [.v6]
)
