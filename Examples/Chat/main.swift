import ExampleServices
import Foundation
import Mainspring

// A chat room on loopback: every line a client sends goes to every other client; fan-out
// stays bounded, whatever the clients do (see ChatRoom). `/stats` answers the counters.
//
//   mainspring-chat [--port P] [--loops N] [--slow-consumer drop|disconnect] [--grace-ms MS]
//                   [--output-limit BYTES]
//
// Prints `listening on 127.0.0.1:PORT` first; SIGTERM or SIGINT prints the counters and exits 0.
var port: UInt16 = 7000
var loops = ProcessInfo.processInfo.activeProcessorCount
var policy = ChatRoom.SlowConsumerPolicy.drop
var grace = Duration.seconds(2)
var outputLimit = 256 << 10
var arguments = CommandLine.arguments.dropFirst()
func usage(_ problem: String) -> Never {
    FileHandle.standardError.write(Data("mainspring-chat: \(problem)\nusage: mainspring-chat [--port P] [--loops N] [--slow-consumer drop|disconnect] [--grace-ms MS] [--output-limit BYTES]\n".utf8))
    exit(2)
}
while let flag = arguments.popFirst() {
    guard let value = arguments.popFirst() else { usage("\(flag) needs a value") }
    switch flag {
    case "--port": port = UInt16(value) ?? { usage("bad port '\(value)'") }()
    case "--loops": loops = Int(value).flatMap { $0 > 0 ? $0 : nil } ?? { usage("bad loop count '\(value)'") }()
    case "--slow-consumer": policy = ChatRoom.SlowConsumerPolicy(rawValue: value) ?? { usage("bad policy '\(value)'") }()
    case "--grace-ms": grace = .milliseconds(Int(value).flatMap { $0 >= 0 ? $0 : nil } ?? { usage("bad grace '\(value)'") }())
    case "--output-limit": outputLimit = Int(value).flatMap { $0 > 0 ? $0 : nil } ?? { usage("bad limit '\(value)'") }()
    default: usage("unknown option \(flag)")
    }
}

let group = try EventLoopGroup(loopCount: loops)
let signals = try EventLoop.main.signals([SIGTERM, SIGINT])
let room = ChatRoom(policy: policy, grace: grace)

Task { @MainActor in
    do {
        let listener = try await Listener(.tcp(port: port), on: group.loops[0], group: group,
                                          options: .init(maxLineLength: 64 << 10, outputLimit: outputLimit))
        print("listening on \(listener.localAddress)")
        fflush(nil)
        Task { @MainActor in
            for await _ in signals {
                listener.close()
                print("stats \(room.statistics)")
                _ = await group.shutdown(gracePeriod: .seconds(2))
                EventLoop.main.stop()
            }
        }
        await withDiscardingTaskGroup { tasks in
            do {
                for try await connection in listener.connections {
                    tasks.addTask(executorPreference: connection.loop) { await room.serve(connection) }
                }
            } catch {
                // The listener was cancelled: no more members.
            }
        }
    } catch {
        FileHandle.standardError.write(Data("mainspring-chat: \(error)\n".utf8))
        exit(1)
    }
}

try EventLoop.main.run()
