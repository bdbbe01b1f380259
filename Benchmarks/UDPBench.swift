import CBaselines
import Foundation
import Mainspring

/// udp: echoed datagrams per second on loopback. One C client (`ms_udp_echo_client`, on the
/// calling thread) keeps a window of 64 datagrams of 64 bytes in flight for 1.5 s and counts
/// the echoes it gets back; only those count (loopback UDP drops under overload). The servers,
/// each on a thread of its own: `mainspring` (a `DatagramSocket` whose `onReceive` handler
/// collects each readiness's datagrams and sends them back with one `trySend(contentsOf:)`,
/// that is one `sendmmsg`), `libevent-c` (a libevent read event, one `recvfrom` and one
/// `sendto` per datagram) and `libevent-c-mmsg` (batches of 32 per `recvmmsg`, one `sendmmsg`
/// per batch).
let udpScenario = Scenario(
    name: "udp",
    summary: "UDP echo datagrams/s: DatagramSocket vs C libevent recvfrom/sendto vs recvmmsg/sendmmsg"
) { runs in
    var samples = Samples()
    let durationMs: Int32 = sized(1_500, smoke: 100)
    let window: Int32 = 64
    let payload: Int32 = 64
    func drive(_ port: UInt16) -> [(String, Double)] {
        var sent: Int64 = 0
        var timeouts: Int64 = 0
        let received = ms_udp_echo_client(port, window, payload, durationMs, &sent, &timeouts)
        let seconds = Double(durationMs) / 1_000
        return [("datagrams_per_s", Double(received) / seconds),
                ("lost_percent", sent > 0 ? Double(max(0, sent - received - Int64(window))) / Double(sent) * 100 : 0)]
    }
    for _ in 0..<runs {
        samples.add("mainspring", {
            let group = try! EventLoopGroup(loopCount: 1)
            let loop = group.loops[0]
            let socket = blockingAwait {
                try! await loop.submit { () throws -> DatagramSocket in
                    let socket = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
                    // The echoes of one readiness go out together: the first datagram of a
                    // batch posts one flush, which runs after the readiness's handlers.
                    let replies = EchoReplies()
                    try socket.onReceive { event in
                        guard case .datagram(let datagram) = event else { return }
                        if replies.pending.isEmpty {
                            loop.execute(priority: .input) {
                                _ = try? socket.trySend(contentsOf: replies.pending)
                                replies.pending.removeAll(keepingCapacity: true)
                            }
                        }
                        replies.pending.append(Datagram(datagram.bytes, to: datagram.address))
                    }
                    return socket
                }
            }
            let figures = drive(socket.localAddress.port)
            loop.execute { socket.close() }
            group.shutdownBlocking(gracePeriod: .seconds(1))
            return figures
        }())
        for (variant, useBatches) in [("libevent-c", Int32(0)), ("libevent-c-mmsg", Int32(1))] {
            samples.add(variant, {
                var port: UInt16 = 0
                let handle = ms_baseline_udp_echo_start(useBatches, &port)
                let figures = drive(port)
                ms_baseline_udp_echo_stop(handle)
                return figures
            }())
        }
    }
    return samples.records(scenario: "udp")
}

/// The echo server's replies of the current readiness (loop thread only).
private final class EchoReplies: @unchecked Sendable {
    var pending: [Datagram] = []
}
