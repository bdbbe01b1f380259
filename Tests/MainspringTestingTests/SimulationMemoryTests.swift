import CMainspringSystem
import Foundation
import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Synchronization
import Testing

/// A finished simulation gives back what it used: a test suite runs thousands of simulations in
/// one process, which must stay flat.
@Suite("Simulation memory")
struct SimulationMemoryTests {
    /// Bytes the process has allocated with malloc and not freed (glibc's `mallinfo2`, every
    /// arena): steadier than resident memory, which keeps pages that were freed.
    static func heapInUse() -> Int { Int(mallinfo2().uordblks) }

    /// The process's resident memory in bytes (`/proc/self/statm`'s second field, in pages).
    static func residentBytes() -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    /// What one run of `smallProgram` ended with.
    struct Outcome: Equatable, CustomStringConvertible {
        var echoed: Int
        var status: Int
        var ticked: Bool
        var openStreamEnds: Int
        /// A correct run: every echo back, a 200, the timer fired, every stream closed.
        static let expected = Outcome(echoed: 20, status: 200, ticked: true, openStreamEnds: 0)

        var description: String {
            "\(echoed) of 20 echoed, status \(status), timer \(ticked ? "fired" : "never fired"), \(openStreamEnds) stream ends open"
        }
    }

    /// A small whole program, from start to finish: an echo server and 20 clients over a link
    /// with latency, a repeating timer, an `HTTPServer` and one `HTTPClient` request, everything
    /// closed at the end. The server side is a group of the simulation's (its host 10.0.0.1).
    static func smallProgram(seed: UInt64) throws -> Outcome {
        let simulation = try Simulation(seed: seed)
        simulation.network.latency = .milliseconds(1)
        let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        let echo = try Listener(.tcp(host: "0.0.0.0", port: 7), on: group.loops[0]) { connection in
            connection.readLines { event in
                switch event {
                case .line(let text): connection.writeLine(text)
                default: connection.close()
                }
            }
        }
        var routes = HTTPRoutes()
        routes.get("/hello") { _ in .text("hello\n") }
        let server = try HTTPServer(group: group, configuration: .init(host: "0.0.0.0", port: 80), routes: routes)
        let client = HTTPClient(loop: simulation.loop)
        let ticks = Mutex(0)
        let timer = simulation.loop.schedule(every: .milliseconds(2)) { _ in ticks.withLock { $0 += 1 } }

        let (echoed, status) = try simulation.runSynchronously { () async throws -> (Int, Int) in
            let echoed = try await withThrowingTaskGroup(of: Bool.self) { clients in
                for index in 0..<20 {
                    clients.addTask {
                        let connection = try await Connection.connect(to: "10.0.0.1", port: 7, on: simulation.loop)
                        try await connection.send(line: "line \(index)")
                        let reply = try await connection.readLine()
                        connection.close()
                        return reply == .line("line \(index)")
                    }
                }
                return try await clients.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            let response = try await client.get("http://10.0.0.1/hello")
            return (echoed, response.status)
        }
        timer.cancel()
        client.shutdown()
        try simulation.runSynchronously { await server.closeAndWait() }
        echo.close()
        simulation.advance(by: .seconds(1))
        return Outcome(echoed: echoed, status: status, ticked: ticks.withLock { $0 } > 0,
                       openStreamEnds: simulation.network.openStreamEnds)
    }

    /// Heap bytes kept per finished simulation of `smallProgram`: after `warmUp` runs (the
    /// runtime's caches, the allocator's own tables), the smallest growth of `rounds` rounds of
    /// `runs` runs each, divided by `runs`. A leak grows every round; what tests running in
    /// parallel allocate comes and goes, and cannot make every round grow. Also returns the
    /// runs that did not end as a correct run does.
    static func bytesKeptPerSimulation(warmUp: Int, rounds: Int, runs: Int) throws
        -> (kept: Int, resident: (before: Int, after: Int), wrong: [String])
    {
        var seed: UInt64 = 0
        var wrong: [String] = []
        func batch(_ count: Int) throws {
            for _ in 0..<count {
                seed += 1
                let outcome = try smallProgram(seed: seed)
                if outcome != .expected { wrong.append("seed \(seed): \(outcome)") }
            }
        }
        try batch(warmUp)
        let residentBefore = residentBytes()
        var smallest = Int.max
        for _ in 0..<rounds {
            let before = heapInUse()
            try batch(runs)
            smallest = min(smallest, heapInUse() - before)
        }
        return (max(0, smallest) / runs, (residentBefore, residentBytes()), wrong)
    }

    /// A simulation whose loops ran a simulated program — registered with a body that uses its
    /// loop, spawned on a group's loop, ended — lets go of its loops once it is released, as one
    /// that spawned nothing does. (They were kept: each spawned program holds its loop, the loop
    /// its simulation's core, and the core the record of its programs.)
    @Test func aSimulationThatRanAProgramLetsGoOfItsLoops() async throws {
        let (released, status) = try await onPlainThread { () throws -> (Bool, Subprocess.ExitStatus) in
            weak var first: EventLoop?
            weak var member: EventLoop?
            let status = try { () throws -> Subprocess.ExitStatus in
                let simulation = try Simulation(seed: 7)
                let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
                let loop = group.loops[0]
                simulation.register(program: "worker") { process in
                    try await loop.sleep(for: .seconds(1))
                    process.write(line: "done")
                    return 0
                }
                first = simulation.loop
                member = loop
                return try simulation.runSynchronously {
                    await (try Subprocess.launch(.init(executable: "worker"), on: loop)).exit
                }
            }()
            return (first == nil && member == nil, status)
        }
        #expect(status == .exited(0))
        #expect(released, "a finished simulation that ran a program kept its loops")
    }

    /// 640 small whole programs (40 to warm up, then three rounds of 200) keep under 7 KB of
    /// heap each. (Each kept about 106 KB when a simulated group, released with its simulation,
    /// posted its loops a shutdown that nothing would ever run: the posted closure held the
    /// loop, and the loop its simulation.) `SIMULATION_MEMORY_ROUNDS` and
    /// `SIMULATION_MEMORY_RUNS` change the measure (BENCHMARKS.md's figure: 5 rounds of 200).
    @Test("A finished simulation gives back what it used: under 7 KB kept per small whole program")
    func finishedSimulationsKeepNoMemory() async throws {
        let environment = ProcessInfo.processInfo.environment
        let rounds = environment["SIMULATION_MEMORY_ROUNDS"].flatMap(Int.init) ?? 3
        let runs = environment["SIMULATION_MEMORY_RUNS"].flatMap(Int.init) ?? 200
        // On a thread of its own: each run drives its simulation on the calling thread, which
        // must not be one of the cooperative pool's (two on a 2-core machine).
        let (kept, resident, wrong) = try await onPlainThread {
            try Self.bytesKeptPerSimulation(warmUp: 40, rounds: rounds, runs: runs)
        }
        print("SimulationMemoryTests: \(kept) bytes of heap kept per finished simulation (\(rounds) rounds of \(runs), after 40); "
            + "resident \(resident.before >> 10) KB before the rounds, \(resident.after >> 10) KB after")
        #expect(wrong.isEmpty, "runs that went wrong: \(wrong.prefix(5))")
        #expect(kept < 7_000, "\(kept) bytes of heap kept per finished simulation")
    }
}
