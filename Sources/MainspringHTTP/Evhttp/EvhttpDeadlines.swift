// Slow-request deadlines. evhttp 2.1 has one timeout per connection, reset by any traffic, so a
// client trickling a head one byte at a time would never time out. The head guard stamps when a
// request head started arriving and when it was complete (`RequestHeadScan`); a repeating loop
// timer (`LoopEndpoint`) calls `sweep`, which closes the connections past their deadline as if
// evhttp's own timeout had fired, and lingers on those whose guard answer (431, 503…) is out: their
// write side shut, their input drained until the peer leaves, closed two seconds after the answer.
internal import CLibevent
import MainspringCore

extension EvhttpServer {
    /// Closes connections whose request is arriving too slowly (head or body past its timeout)
    /// and those the head guard answered two seconds after the answer (their write side shut
    /// once it is out: see `EvhttpConnection.startLingering`). Runs as a loop callback
    /// (a timer), not inside libevent. Returns whether a connection is still open.
    func sweep(now: UInt64) -> Bool {
        let header = limits.headerTimeout.clampedNanoseconds
        let body = limits.bodyTimeout.clampedNanoseconds
        var expired: [EvhttpConnection] = []
        for connection in connections.values where connection.current == nil {
            let head = connection.head
            if connection.answeredAt != 0 {
                // A lingering close: the answer out, the write side shut, input drained until the
                // peer leaves — for at most two seconds after the answer.
                if now &- connection.answeredAt > 2_000_000_000 {
                    expired.append(connection)
                } else if connection.outputIsEmpty {
                    connection.startLingering()
                }
            } else if head.bytes > 0 && !head.isComplete {
                if now &- head.startedAt > header { expired.append(connection) }
            } else if head.isComplete {
                if now &- head.bodyStartedAt > body { expired.append(connection) }
            }
        }
        for connection in expired { connection.closeForTimeout() }
        return !connections.isEmpty
    }
}

extension EvhttpConnection {
    /// Makes evhttp drop the connection as if the client had timed out (a loop callback).
    func closeForTimeout() {
        guard !isClosed, let filter else { return }
        timedOut = answeredAt == 0
        bufferevent_trigger_event(filter, Int16(BEV_EVENT_TIMEOUT | BEV_EVENT_READING), 0)
    }
}
