import ExampleServices
import Foundation
import Mainspring

// mainspring-daemon under systemd (or any service manager that speaks its protocols): log lines
// with syslog priorities when stderr is the journal, the listening socket from socket
// activation, and what the daemon tells the manager (READY=1, STATUS=, RELOADING=1,
// STOPPING=1, watchdog pings). Self-contained: main.swift creates these and calls them from
// a few places (start-up, signals, exit).

/// The exit status for a configuration the service manager passed that cannot be used: a
/// passed descriptor that is not a listening socket, malformed `LISTEN_*` variables
/// (`EX_CONFIG` from sysexits.h; the unit file's `RestartPreventExitStatus=` names it, so that
/// systemd does not restart a service that cannot work).
let exitConfigurationError: Int32 = 78

/// The daemon's log: lines on stderr, each prefixed with its syslog priority (`<3>` error, `<4>`
/// warning, `<6>` info) when stderr is systemd's journal (`$JOURNAL_STREAM`), which stores the
/// priority instead of printing it. Any thread: one `write(2)` per line.
struct DaemonLog: Sendable {
    enum Priority: Int {
        case error = 3
        case warning = 4
        case info = 6
    }

    /// Whether stderr is the journal.
    let toJournal: Bool

    init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        toJournal = JournalStream.isConnected(STDERR_FILENO, environment: environment)
    }

    func callAsFunction(_ priority: Priority, _ text: String) {
        let prefix = toJournal ? "<\(priority.rawValue)>" : ""
        // A multi-line text gets the prefix on each line: the journal reads one per line.
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { prefix + $0 + "\n" }
        FileHandle.standardError.write(Data(lines.joined().utf8))
    }
}

/// The socket to serve on when the service manager passed some (socket activation): the one
/// named `name` (`--socket-name`, a `.socket` unit's `FileDescriptorName=`), or the first one
/// when no name is asked for. nil when nothing was passed: listen on `--host`/`--port`.
///
/// Call it first thing, before any thread starts (it reads and unsets `LISTEN_*`). Exits with
/// `exitConfigurationError` when the variables are malformed, name descriptors that are not
/// open, or no passed socket has the name asked for; warns when they were meant for another
/// process (`LISTEN_PID`).
func activatedSocket(named name: String?, log: DaemonLog) -> ActivatedSockets.Socket? {
    let activated: ActivatedSockets
    do {
        activated = try ActivatedSockets.fromEnvironment()
    } catch {
        log(.error, "mainspring-daemon: socket activation: \(error)")
        exit(exitConfigurationError)
    }
    if let reason = activated.ignoredReason {
        log(.warning, "mainspring-daemon: socket activation: \(reason)")
    }
    guard !activated.isEmpty else {
        if let name {
            log(.error, "mainspring-daemon: --socket-name \(name): the service manager passed no sockets (LISTEN_FDS)")
            exit(exitConfigurationError)
        }
        return nil
    }
    guard let name else { return activated.sockets[0] }
    guard let socket = activated.first(named: name) else {
        let names = activated.sockets.map { $0.name.map { "'\($0)'" } ?? "(unnamed)" }.joined(separator: ", ")
        log(.error, "mainspring-daemon: --socket-name \(name): no passed socket has that name (LISTEN_FDNAMES: \(names))")
        exit(exitConfigurationError)
    }
    return socket
}

/// What the daemon tells its service manager. Every call is a cheap no-op without
/// `$NOTIFY_SOCKET`. A notification that cannot be sent is logged (the first time) and
/// otherwise ignored: the service keeps serving. `READY=1`, `STOPPING=1` and the watchdog are
/// the service group's (`serviceManager(watchdogLoops:)`); reloads and status lines are here.
final class ServiceManagerLink: Sendable {
    let notifier: ServiceNotifier
    private let log: DaemonLog
    private let environment: [String: String]
    private let statusTimer = Guarded<TimerHandle?>(nil)
    private let failureLogged = Guarded(false)

    /// Reads `$NOTIFY_SOCKET`; a malformed one is a warning, and nothing is sent.
    init(log: DaemonLog, environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.log = log
        self.environment = environment
        do {
            notifier = try ServiceNotifier(environment: environment)
        } catch {
            log(.warning, "mainspring-daemon: not notifying the service manager: \(error)")
            notifier = .disabled
        }
    }

    /// What the service group tells the manager: `READY=1` and `STOPPING=1` through this
    /// notifier, and a watchdog over `loops` when the manager asks for one (`$WATCHDOG_USEC`,
    /// for this process if `$WATCHDOG_PID` is set): `WATCHDOG=1` every half interval while
    /// every loop polls within half the interval. A malformed variable is a warning, and no
    /// watchdog runs. Health changes are logged.
    func serviceManager(watchdogLoops loops: [EventLoop]) -> ServiceGroup.ServiceManager {
        var manager = ServiceGroup.ServiceManager(notifier: notifier, watchdogLoops: loops)
        guard notifier.isEnabled else { return manager }
        do {
            manager.watchdogInterval = try Watchdog.requestedInterval(environment: environment)
        } catch {
            log(.warning, "mainspring-daemon: no watchdog: \(error)")
        }
        let log = self.log
        manager.onWatchdogHealthChange = { health in
            if health.isHealthy {
                log(.info, "watchdog: the loops poll again; WATCHDOG=1 resumes")
            } else {
                log(.warning, "watchdog: \(health); WATCHDOG=1 withheld until it polls again")
            }
        }
        return manager
    }

    /// `RELOADING=1`, then `body` (the reload), then `READY=1` with a status line.
    func reload(status: () -> String, _ body: () -> Void) {
        send(.reloading, .status("reloading"))
        body()
        send(.ready, .status(status()))
    }

    /// One `STATUS=` line (for a daemon that keeps its own schedule, a task, say).
    func status(_ text: String) { send(.status(text)) }

    /// A `STATUS=` line from `status` every `interval`, from a timer on `loop` (call on its
    /// thread). Nothing without `$NOTIFY_SOCKET`.
    func sendStatus(every interval: Duration, on loop: EventLoop, _ status: @escaping () -> String) {
        guard notifier.isEnabled, interval > .zero else { return }
        let timer = loop.schedule(every: interval) { [self] _ in send(.status(status())) }
        statusTimer.withLock { $0 = timer }
    }

    /// The watchdog's state for status lines: "", or "; watchdog: healthy".
    func watchdogSummary(_ watchdog: Watchdog?) -> String {
        watchdog.map { "; watchdog: \($0.health)" } ?? ""
    }

    /// Stops the status timer (the timer's loop thread only when it runs).
    func stop() {
        statusTimer.withLock { $0 }?.cancel()
    }

    /// A notification could not be sent: logged the first time.
    func notificationFailed(_ error: EventLoopError) {
        let first = failureLogged.withLock { logged in
            defer { logged = true }
            return !logged
        }
        if first { log(.warning, "mainspring-daemon: cannot notify the service manager: \(error) (not logged again)") }
    }

    private func send(_ notifications: ServiceNotification...) {
        guard notifier.isEnabled else { return }
        do {
            try notifier.notify(notifications)
        } catch {
            notificationFailed(error)
        }
    }
}
