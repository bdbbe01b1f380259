import Foundation
import Mainspring

// README.md, "Running under systemd": the library's side of a daemon under systemd, as written
// there (the lines between the markers, less their indentation; a test compares the two). Run
// it under systemd-socket-activate with a notify socket: `mainspring-fixture readme-systemd`.

@MainActor
func readmeSystemdScenario() throws {
    // README begin
    let activated = try ActivatedSockets.fromEnvironment()   // first thing: it unsets LISTEN_*
    let notifier = try ServiceNotifier()                      // a no-op without $NOTIFY_SOCKET
    let group = try EventLoopGroup()
    let acceptor = group.loops[0]
    let echo: @Sendable (Connection) -> Void = { connection in
        connection.readLines { event in
            if case .line(let text) = event { connection.writeLine(text) } else { connection.close() }
        }
    }
    acceptor.execute {
        do {
            let listener = if let socket = activated.first(named: "line") ?? activated.sockets.first {
                try Listener(.activated(socket), on: acceptor, group: group, accept: echo)
            } else {
                try Listener(.tcp(port: 7000), on: acceptor, group: group, accept: echo)
            }
            try notifier.notify(.ready, .status("accepting on \(listener.localAddress)"))   // READY=1
        } catch {
            print("cannot listen: \(error)")
            exit(1)
        }
    }
    // WATCHDOG=1 every half $WATCHDOG_USEC, while every loop of the group polls.
    let watchdog = try Watchdog.startIfRequested(watching: group.loops, notifier: notifier)

    _ = try EventLoop.main.onSignal(SIGTERM) {
        try? notifier.notify(.stopping)                       // STOPPING=1
        watchdog?.stop()                                      // before the loops stop
        group.shutdownBlocking(gracePeriod: .seconds(5))
        EventLoop.main.stop()
    }
    try EventLoop.main.run()
    // README end
}
