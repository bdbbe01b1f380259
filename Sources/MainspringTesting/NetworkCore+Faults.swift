@_spi(Simulation) import MainspringCore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Faults of the simulated network: partitions, resets, and a random schedule of them (with junk
/// bytes) drawn from the seed.
extension NetworkCore {
    // MARK: Faults

    func isPartitioned(_ one: String, _ other: String) -> Bool {
        one != other && partitions.contains(HostPair(one, other))
    }

    func partition(_ one: String, _ other: String) {
        if partitions.insert(HostPair(one, other)).inserted { faults["partition", default: 0] += 1 }
    }

    func heal(_ one: String, _ other: String) {
        guard partitions.remove(HostPair(one, other)) != nil else { return }
        for end in ends.values where end.outgoing.isStalledByPartition && HostPair(end.host, end.peer?.host ?? "") == HostPair(one, other) {
            end.outgoing.isStalledByPartition = false
            scheduleHead(of: end, notBefore: now &+ latency)
        }
    }

    /// Fails every open stream between the two hosts at once: both ends see `ECONNRESET`.
    func reset(_ one: String, _ other: String) {
        let pair = HostPair(one, other)
        let hit = ends.values.filter { end in
            !end.isPipe && openEnds.contains(ObjectIdentifier(end)) && HostPair(end.host, end.peer?.host ?? "") == pair
        }.sorted { $0.key < $1.key }
        faults["reset", default: 0] += Set(hit.map { min($0.key, $0.peer?.key ?? $0.key) }).count  // streams
        for end in hit { resetEnd(end) }
    }

    /// One end of a reset stream: what it had on its way is dropped, and its connection fails
    /// with `ECONNRESET`.
    private func resetEnd(_ end: NetworkEnd) {
        end.outgoing.packets.removeAll()
        end.outgoing.bytes = 0
        end.isReset = true
        end.socket?.deliverError(ECONNRESET)
    }

    // MARK: A random fault schedule

    /// Injects faults at random (from the seed) until `until`: resets of one open stream
    /// between `hosts`, and partitions between two of them that heal after about
    /// `partitionDuration` (half to one and a half times it; every partition is healed by
    /// `until`).
    func injectFaults(resetsPerMinute: Double, partitionsPerMinute: Double, partitionDuration: UInt64,
                      junkPerMinute: Double = 0, hosts: [String], until: UInt64)
    {
        let hosts = Array(Set(hosts)).sorted()
        if junkPerMinute > 0 { scheduleRandomJunk(rate: junkPerMinute, hosts: Set(hosts), until: until) }
        if resetsPerMinute > 0 { scheduleRandomReset(rate: resetsPerMinute, hosts: Set(hosts), until: until) }
        if partitionsPerMinute > 0, hosts.count >= 2 {
            scheduleRandomPartition(rate: partitionsPerMinute, duration: partitionDuration, hosts: hosts, until: until)
        }
    }

    /// An exponentially distributed wait for a fault that comes `perMinute` times a minute.
    private func randomWait(perMinute: Double) -> UInt64 {
        UInt64(-log(1 - uniform()) * 60e9 / perMinute) + 1
    }

    private func scheduleRandomReset(rate: Double, hosts: Set<String>, until: UInt64) {
        let at = now &+ randomWait(perMinute: rate)
        guard at < until else { return }
        schedule(at: at) { [unowned self] in
            let candidates = ends.values.filter { end in
                guard !end.isPipe, let peer = end.peer, end.key < peer.key, hosts.contains(end.host), hosts.contains(peer.host)
                else { return false }
                return openEnds.contains(ObjectIdentifier(end)) && openEnds.contains(ObjectIdentifier(peer))
                    && !end.isReset && !peer.isReset
            }.sorted { $0.key < $1.key }
            if !candidates.isEmpty {
                let end = candidates[Int(random.next() % UInt64(candidates.count))]
                faults["reset", default: 0] += 1
                for side in [end, end.peer!] { resetEnd(side) }
            }
            scheduleRandomReset(rate: rate, hosts: hosts, until: until)
        }
    }

    /// Junk: 1 to 64 random bytes (any value: newlines, NULs, invalid UTF-8) slipped into one
    /// direction of an open stream between `hosts`, between two of its segments, as if its
    /// writer had sent them.
    private func scheduleRandomJunk(rate: Double, hosts: Set<String>, until: UInt64) {
        let at = now &+ randomWait(perMinute: rate)
        guard at < until else { return }
        schedule(at: at) { [unowned self] in
            let candidates = ends.values.filter { end in
                guard !end.isPipe, let peer = end.peer, hosts.contains(end.host), hosts.contains(peer.host) else { return false }
                return end.socket != nil && !end.isReset && !end.finSent && !peer.isClosed
            }.sorted { $0.key < $1.key }
            if !candidates.isEmpty {
                let end = candidates[Int(random.next() % UInt64(candidates.count))]
                let junk = (0..<(1 + Int(random.next() % 64))).map { _ in UInt8(truncatingIfNeeded: random.next()) }
                faults["junk", default: 0] += 1
                junkBytes += junk.count
                end.outgoing.packets.append(Packet(kind: .data(junk), arrival: now &+ latency))
                end.outgoing.bytes += junk.count
                scheduleHead(of: end)
            }
            scheduleRandomJunk(rate: rate, hosts: hosts, until: until)
        }
    }

    private func scheduleRandomPartition(rate: Double, duration: UInt64, hosts: [String], until: UInt64) {
        let at = now &+ randomWait(perMinute: rate)
        guard at < until else { return }
        schedule(at: at) { [unowned self] in
            let first = Int(random.next() % UInt64(hosts.count))
            var second = Int(random.next() % UInt64(hosts.count - 1))
            if second >= first { second += 1 }
            let (one, other) = (hosts[first], hosts[second])
            if !isPartitioned(one, other) {
                partition(one, other)
                let length = UInt64(Double(duration) * (0.5 + uniform()))
                schedule(at: min(now &+ max(1, length), until)) { [unowned self] in heal(one, other) }
            }
            scheduleRandomPartition(rate: rate, duration: duration, hosts: hosts, until: until)
        }
    }
}
