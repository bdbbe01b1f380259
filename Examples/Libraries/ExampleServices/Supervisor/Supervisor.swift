import Foundation
import Mainspring
import MainspringHTTP
import Synchronization

/// What /metrics reports of one program. Written on the supervisor's loop, read by the HTTP loop.
public struct ProgramStats: Sendable, Equatable {
    public var starts = 0
    public var restarts = 0
    public var lastExitCode: Int32?
    public var lastSignal: Int32?
    public var outputLines = 0
    public var running = false
    public var healthy: Bool?
}

/// The numbers the HTTP side serves, behind a lock.
public final class SupervisorStats: Sendable {
    private let state = Mutex<[(String, ProgramStats)]>([])

    public init() {}

    /// The numbers of program `name` (nil: never seen). Any thread.
    public subscript(name: String) -> ProgramStats? {
        state.withLock { list in list.first { $0.0 == name }?.1 }
    }

    func update(_ name: String, _ change: (inout ProgramStats) -> Void) {
        state.withLock { list in
            if let index = list.firstIndex(where: { $0.0 == name }) {
                change(&list[index].1)
            } else {
                var stats = ProgramStats()
                change(&stats)
                list.append((name, stats))
            }
        }
    }

    /// The Prometheus text of every program's numbers.
    public func render() -> String {
        let list = state.withLock { $0 }
        var text = ""
        func family(_ name: String, _ type: String, _ help: String, _ value: (ProgramStats) -> String?) {
            text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
            for (program, stats) in list {
                if let value = value(stats) { text += "\(name){program=\"\(program)\"} \(value)\n" }
            }
        }
        family("supervisor_starts_total", "counter", "Times the program was started.") { "\($0.starts)" }
        family("supervisor_restarts_total", "counter", "Times the program was restarted after it ended.") { "\($0.restarts)" }
        family("supervisor_last_exit_code", "gauge", "The exit status of its last exit.") { $0.lastExitCode.map { "\($0)" } }
        family("supervisor_last_exit_signal", "gauge", "The signal that ended it last.") { $0.lastSignal.map { "\($0)" } }
        family("supervisor_output_lines_total", "counter", "Lines the program wrote to stdout and stderr.") { "\($0.outputLines)" }
        family("supervisor_running", "gauge", "1 while the program runs.") { $0.running ? "1" : "0" }
        family("supervisor_health_up", "gauge", "1 when its last health check answered 2xx/3xx.") {
            $0.healthy.map { $0 ? "1" : "0" }
        }
        return text
    }
}

/// Runs the configured programs on its loop: starts them, forwards their output lines with a
/// prefix, restarts them with backoff, checks their health URLs, reloads the configuration when
/// the file changes, and stops them in order. Loop thread only.
///
/// Its times (backoff, the health interval) are its loop's: on a simulated loop
/// (`MainspringTesting`) it runs in virtual time, its children registered programs.
public final class Supervisor {
    public let loop: EventLoop
    /// The configuration file, watched for changes (nil: none; the configuration given stays).
    public let configPath: String?
    public let stats: SupervisorStats
    public let client: HTTPClient
    /// Where its lines go (standard output by default).
    private let output: (String) -> Void
    private var config: SupervisorConfig
    private var children: [String: Child] = [:]
    private var watcher: Watcher?
    private var healthTimer: TimerHandle?
    private var stopping = false

    /// One program's state.
    final class Child {
        var program: SupervisorConfig.Program
        var process: Subprocess?
        var failures = 0
        /// When `launch` last started it (on the loop's clock).
        var startedAt = LoopClock.Instant(nanoseconds: 0)
        var restartTimer: TimerHandle?
        /// Removed from the configuration (or the supervisor stops): no restart.
        var retired = false
        init(program: SupervisorConfig.Program) { self.program = program }
    }

    /// A supervisor of `config`'s programs on `loop`, its health checks through `client`.
    public init(loop: EventLoop, configPath: String?, config: SupervisorConfig, stats: SupervisorStats, client: HTTPClient,
                output: @escaping (String) -> Void = { FileHandle.standardOutput.write(Data(($0 + "\n").utf8)) })
    {
        self.loop = loop
        self.configPath = configPath
        self.config = config
        self.stats = stats
        self.client = client
        self.output = output
    }

    func say(_ line: String) { output(line) }

    /// Starts every program, the config watch and the health checks.
    public func start() throws {
        for program in config.programs { add(program) }
        if let configPath {
            watcher = try loop.observeFile(at: configPath) { [weak self] event in
                switch event.kind {
                case .replaced, .modified, .created: self?.reload(from: configPath)
                default: break
                }
            }
        }
        let interval = Duration.milliseconds(Int((config.healthInterval ?? 2) * 1_000))
        healthTimer = loop.schedule(every: max(interval, .milliseconds(50))) { [weak self] _ in self?.checkHealth() }
    }

    private func add(_ program: SupervisorConfig.Program) {
        let child = Child(program: program)
        children[program.name] = child
        launch(child)
    }

    private func launch(_ child: Child) {
        let program = child.program
        var configuration = Subprocess.Configuration(executable: program.command[0],
                                                     arguments: Array(program.command.dropFirst()))
        configuration.standardError = .pipe
        configuration.newProcessGroup = true
        child.startedAt = loop.clock.now
        let process: Subprocess
        do {
            process = try Subprocess.launch(configuration, on: loop)
        } catch {
            say("supervisor: cannot start \(program.name): \(error)")
            scheduleRestart(child, status: nil)
            return
        }
        child.process = process
        stats.update(program.name) {
            $0.starts += 1
            $0.running = true
        }
        say("supervisor: started \(program.name) (pid \(process.processIdentifier))")
        for stream in [process.standardOutput, process.standardError] {
            stream?.readLines { [weak self] event in
                guard case .line(let text) = event else { return }
                self?.say("[\(program.name)] \(text)")
                self?.stats.update(program.name) { $0.outputLines += 1 }
            }
        }
        process.onExit { [weak self, weak child] status in
            guard let self, let child, child.process === process else { return }
            child.process = nil
            self.stats.update(program.name) {
                $0.running = false
                switch status {
                case .exited(let code): $0.lastExitCode = code; $0.lastSignal = nil
                case .signaled(let signal): $0.lastSignal = signal
                case .reapedElsewhere: break
                }
            }
            self.say("supervisor: \(program.name) \(status)")
            self.scheduleRestart(child, status: status)
        }
    }

    /// Restarts per the program's policy, after 100 ms doubling per consecutive quick failure
    /// (up to 5 s); a run of 5 s or more resets the backoff.
    private func scheduleRestart(_ child: Child, status: Subprocess.ExitStatus?) {
        guard !stopping, !child.retired else { return }
        switch child.program.restart {
        case .never: return
        case .onFailure: if status?.isSuccess == true { return }
        case .always: break
        }
        if child.startedAt.duration(to: loop.clock.now) >= .seconds(5) { child.failures = 0 }
        let delay = Duration.milliseconds(min(5_000, 100 << min(child.failures, 6)))
        child.failures += 1
        child.restartTimer = loop.schedule(after: delay) { [weak self, weak child] in
            guard let self, let child, !self.stopping, !child.retired else { return }
            self.stats.update(child.program.name) { $0.restarts += 1 }
            self.launch(child)
        }
    }

    /// The file changed: start what is new, stop what is gone, restart what changed. A file that
    /// does not parse changes nothing.
    private func reload(from configPath: String) {
        guard !stopping else { return }
        let fresh: SupervisorConfig
        do {
            fresh = try SupervisorConfig.load(configPath)
        } catch {
            say("supervisor: configuration not reloaded: \(error)")
            return
        }
        guard fresh != config else { return }
        say("supervisor: configuration reloaded")
        let wanted = Dictionary(uniqueKeysWithValues: fresh.programs.map { ($0.name, $0) })
        for (name, child) in children where wanted[name] != child.program {
            retire(child)
            children[name] = nil
        }
        for program in fresh.programs where children[program.name] == nil {
            add(program)
        }
        config = fresh
    }

    private func retire(_ child: Child, then done: @escaping () -> Void = {}) {
        child.retired = true
        child.restartTimer?.cancel()
        guard let process = child.process else {
            done()
            return
        }
        process.onExit { _ in done() }
        process.startTerminating(grace: .milliseconds(Int(child.program.grace * 1_000)))
    }

    private func checkHealth() {
        for (name, child) in children where child.process != nil {
            guard let url = child.program.health else { continue }
            let client = self.client
            let stats = self.stats
            // On the supervisor's loop: in a simulation, in virtual time and in seed order.
            Task(executorPreference: loop) {
                let healthy: Bool
                do {
                    let response = try await client.get(url)
                    healthy = (200..<400).contains(response.status)
                } catch {
                    healthy = false
                }
                stats.update(name) { $0.healthy = healthy }
            }
        }
    }

    /// A forced stop (a second signal) cut `stop` short: every child still running gets
    /// SIGKILL, with its process group, at once — none outlives the supervisor. Loop thread
    /// (the loop may have stopped).
    public func killRemaining() {
        stopping = true
        for program in config.programs {
            guard let child = children[program.name] else { continue }
            child.restartTimer?.cancel()
            guard let process = child.process else { continue }
            say("supervisor: killing \(program.name) (forced stop)")
            process.signalGroup(SIGKILL)
        }
    }

    /// SIGTERM: stops the children one after another, in the configuration's order (each:
    /// SIGTERM to its group, SIGKILL after its grace), then calls `done`.
    public func stop(_ done: @escaping () -> Void) {
        guard !stopping else { return }
        stopping = true
        watcher?.cancel()
        healthTimer?.cancel()
        let order = config.programs.compactMap { children[$0.name] }
        func next(_ index: Int) {
            guard index < order.count else {
                done()
                return
            }
            say("supervisor: stopping \(order[index].program.name)")
            retire(order[index]) { next(index + 1) }
        }
        next(0)
    }
}
