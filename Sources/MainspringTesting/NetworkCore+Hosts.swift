@_spi(Simulation) import MainspringCore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The simulated network's hosts (a loop's address), its table of names, its ports.
extension NetworkCore {
    // MARK: Hosts and names

    func setHost(_ host: String, for loop: EventLoop) {
        hosts[ObjectIdentifier(loop)] = host
        knownHosts.insert(host)
    }

    func host(of loop: EventLoop) -> String { hosts[ObjectIdentifier(loop)] ?? "127.0.0.1" }

    func register(name: String, address: String) {
        names[name.lowercased(), default: []].append(address)
    }

    func resolve(_ name: String, port: UInt16) -> [SocketAddress]? {
        let key = name.lowercased()
        let addresses = names[key] ?? (key == "localhost" ? ["127.0.0.1"] : nil)
        // A registered address that is not an IP literal resolves to nothing (as a name
        // without records does): `register` documents dotted IPv4 addresses.
        return addresses?.compactMap { try? SocketAddress(ipAddress: $0, port: port) }
    }

    func isLoopback(_ address: String) -> Bool {
        address == "127.0.0.1" || address == "::1" || address == "localhost"
    }

    func takePort(on host: String, from first: UInt16) -> UInt16 {
        takeFreePort(&nextPort, on: host, from: first) { listeners[HostPort(host: host, port: $0)] != nil }
    }

    /// The first port from `first` (or after the last one `next` handed out on `host`) that
    /// `isTaken` says is free; `next` remembers it. TCP and UDP each keep their own `next`.
    func takeFreePort(_ next: inout [String: UInt16], on host: String, from first: UInt16,
                      isTaken: (UInt16) -> Bool) -> UInt16
    {
        var port = max(next[host] ?? first, first)
        while isTaken(port) { port &+= 1 }
        next[host] = port &+ 1
        return port
    }

    /// The host `loop` binds on for a bind to `host` (a wildcard, a loopback address, or the
    /// loop's own address); `EADDRNOTAVAIL`, naming `call`, for an address of another host.
    func bindingHost(_ host: String, port: UInt16, on loop: EventLoop, call: String) throws(EventLoopError) -> String {
        let own = self.host(of: loop)
        let wildcard = host == "0.0.0.0" || host == "::" || host.isEmpty
        guard wildcard || isLoopback(host) || host == own else {
            throw .system(function: "\(call) \(host):\(port)", errno: EADDRNOTAVAIL)
        }
        return own
    }

    /// A uniform draw in [0, 1) from the seed.
    func uniform() -> Double { Double(random.next() >> 11) / Double(UInt64(1) << 53) }
}
