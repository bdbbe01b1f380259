import Foundation
import Mainspring

// An echo daemon: each connection served by a task on its own loop. `mainspring-echo [port]`.
let port = UInt16(CommandLine.arguments.dropFirst().first ?? "") ?? 7000
let group = try EventLoopGroup()                   // one loop per core, each on its own thread
let signals = try EventLoop.main.signals([SIGTERM, SIGINT])

Task { @MainActor in                               // the main actor runs inside EventLoop.main
    do {
        let listener = try await Listener(.tcp(port: port), on: group.loops[0], group: group,
                                          options: .init(maxLineLength: 4_096, idleTimeout: .seconds(300)))
        print("listening on port \(listener.port)")

        // SIGTERM or SIGINT: stop accepting, give the connections 5 s to finish, then stop.
        Task { @MainActor in
            for await _ in signals {
                listener.close()
                print("stopped: \(await group.shutdown(gracePeriod: .seconds(5)))")
                EventLoop.main.stop()
            }
        }

        try await withThrowingDiscardingTaskGroup { tasks in
            for try await connection in listener.connections {
                tasks.addTask(executorPreference: connection.loop) {   // on the connection's loop
                    do {
                        for try await event in connection.lines {
                            switch event {
                            case .line(let text): try await connection.send(line: "you said: \(text)")
                            case .tooLong, .invalidUTF8: try await connection.send(line: "ERR bad line")
                            case .endOfFile, .error: break
                            }
                        }
                    } catch {
                        // Reset, idle timeout, cancelled: this connection ends, the others go on.
                    }
                    connection.close()             // sends what is buffered, then closes
                }
            }
        }
    } catch {
        print("error: \(error)")                   // the port is in use, say
        EventLoop.main.stop()
    }
}

try EventLoop.main.run()
