@_spi(Simulation) import MainspringCore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What a stream's end tells the simulated network (its socket attached, closed, its timeouts),
/// the inactivity timeouts the network keeps for it, and what is still open (a deadlock report).
extension NetworkCore {
    // MARK: End-side events

    func attached(_ end: NetworkEnd) {
        if end.isReset {
            // Reset before its connection took it (still connecting, or accepted and on its
            // way to a loop): the connection fails at once, as a connect that meets an RST.
            end.socket?.deliverError(ECONNRESET)
            return
        }
        end.wasReading = false
        markDirty(end)
        if let peer = end.peer, peer.outgoing.isStalledOnReader {
            peer.outgoing.isStalledOnReader = false
            scheduleHead(of: peer)
        }
    }

    func closed(_ end: NetworkEnd, unreadInput: Bool) {
        // Input left unread (in the socket, or arrived and waiting for it) makes the close a
        // reset, as TCP's does; otherwise the peer reads the end after what was sent.
        let unread = unreadInput || end.peer?.outgoing.isStalledOnReader == true
        if !end.isReset, end.peer != nil {
            if unread {
                if !end.rstSent {
                    end.rstSent = true
                    end.outgoing.packets.append(Packet(kind: .reset, arrival: now &+ latency(of: end)))
                }
            } else if !end.finSent {
                end.finSent = true
                end.outgoing.packets.append(Packet(kind: .end, arrival: now &+ latency(of: end)))
            }
            scheduleHead(of: end)
        }
        if let peer = end.peer, peer.outgoing.isStalledOnReader {
            // What waited for this reader now meets a closed end (and gets a reset back).
            peer.outgoing.isStalledOnReader = false
            scheduleHead(of: peer)
        }
        ended(end)
    }

    func armReadTimeout(_ end: NetworkEnd) {
        guard let timeout = end.readTimeout, !end.readCheckScheduled else { return }
        end.readCheckScheduled = true
        schedule(at: end.lastRead &+ timeout) { [unowned self] in
            end.readCheckScheduled = false
            guard let socket = end.socket, let timeout = end.readTimeout, socket.isReading else { return }
            if now >= end.lastRead &+ timeout {
                end.wasReading = false
                socket.deliverTimeout(reading: true)
            } else {
                armReadTimeout(end)
            }
        }
    }

    func armWriteTimeout(_ end: NetworkEnd) {
        guard let timeout = end.writeTimeout, !end.writeCheckScheduled else { return }
        end.writeCheckScheduled = true
        schedule(at: end.lastWrite &+ timeout) { [unowned self] in
            end.writeCheckScheduled = false
            guard let socket = end.socket, let timeout = end.writeTimeout, socket.isWritePending else { return }
            if now >= end.lastWrite &+ timeout {
                socket.deliverTimeout(reading: false)
            } else {
                armWriteTimeout(end)
            }
        }
    }

    func timeoutsChanged(_ end: NetworkEnd) {
        end.lastRead = now
        end.lastWrite = now
        if end.socket?.isReading == true { armReadTimeout(end) }
        if end.socket?.isWritePending == true { armWriteTimeout(end) }
    }

    /// Open streams and listeners, for a deadlock report.
    var summary: String? {
        let streams = openEnds.count
        let listening = listeners.count
        let bound = datagramPorts.count
        guard streams + listening + bound > 0 else { return nil }
        var parts = ["\(streams) open stream end\(streams == 1 ? "" : "s")", "\(listening) listener\(listening == 1 ? "" : "s")"]
        if bound > 0 { parts.append("\(bound) UDP port\(bound == 1 ? "" : "s")") }
        return "network: " + parts.joined(separator: ", ")
    }
}
