@_spi(Simulation) import MainspringCore

/// A simulation's network (``Simulation/network``): the hosts of its loops, the names they
/// resolve, and the links between them — one-way latency, segment size, window, partitions,
/// resets — all on virtual time.
///
/// The library's own network code runs over it unchanged: a `Listener` on a simulated loop
/// listens on the loop's host, `Connection.connect(to:port:on:)` connects by address or by a
/// name registered here, `Connection.makePair(on:)` gives the two ends of one stream, and what
/// rides on connections (`HTTPClient`, your protocol) sees their bytes as a socket would. No
/// descriptor is involved: each end is a bufferevent without one, fed by the network.
///
/// ```swift
/// let simulation = try Simulation(seed: 7)
/// simulation.network.latency = .milliseconds(20)
/// simulation.network.maxSegmentSize = 1        // every parser sees every split
/// let upstream = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2")
/// simulation.network.register(name: "upstream.test", address: "10.0.0.2")
/// ```
///
/// ## Behaviour
/// - **Connecting** takes one round trip (a SYN, then its answer). A port nobody listens on is
///   refused (`ECONNREFUSED`) after a round trip; an address no host has, or a host across a
///   partition, answers nothing, and the connect fails with `ETIMEDOUT` after
///   ``connectTimeout`` (127 s, Linux's default) — unless healed before. A listener that stopped
///   accepting holds connects in its backlog.
/// - **Bytes** a connection writes leave in segments of at most ``maxSegmentSize`` and arrive
///   one ``latency`` later, in order; the loops run between two segments. What one direction
///   holds (in flight, or waiting for a reader that stopped reading) is bounded by ``window``:
///   beyond it the writer's output stays buffered, and its backpressure is real. Under TLS the
///   stream below the layer also holds a kernel's socket buffers, 64 KiB each way.
/// - **Closing** sends the end of the stream after the data; closing with input left unread
///   resets the stream instead, and data that reaches a closed end gets a reset back, which
///   follows what that end had sent and is taken whatever the reader's room — as TCP.
/// - **Unix stream sockets** (`Listener(.unix(path:), on:)`, `Connection.connect(unixPath:)`): each
///   host has its own namespace of paths (no file is made); a connect finishes at once, as a
///   Unix connect does (`ENOENT` when nobody listens at the path, `EAGAIN` when its backlog is
///   full); the bytes then travel as on any stream.
/// - **Inactivity timeouts** (`Connection.Options.idleTimeout`, `closeTimeout`) run on virtual
///   time.
/// - **Datagrams** (`DatagramSocket` on a simulated loop: a UDP port of the loop's host) arrive
///   one ``latency`` later, each whole, as sent — unless the seed loses one
///   (``datagramLoss``), delivers it twice (``datagramDuplication``) or holds it back so that
///   later ones overtake it (``datagramReordering``). A partition loses what crosses it; a
///   datagram to a port nobody binds gets a port-unreachable back, which a socket connected
///   to that address reports as `ECONNREFUSED`. What a socket has not read waits in its receive
///   buffer (`DatagramSocket.Options.receiveBufferSize`, default 208 KiB); beyond it, datagrams
///   are dropped, as the kernel drops them. Multicast is refused.
///
/// Use it on the thread that drives the simulation, or between steps.
public final class SimulatedNetwork: @unchecked Sendable {
    let simulation: SimulationCore
    var core: NetworkCore { simulation.networkCore }

    init(simulation: SimulationCore) { self.simulation = simulation }

    /// Makes `name` resolve to `address` (a dotted IPv4 address) on the simulation's loops; a
    /// name registered twice resolves to both. `localhost` is `127.0.0.1` unless registered.
    public func register(name: String, address: String) {
        simulation.withDriving { core.register(name: name, address: address) }
    }

    /// The one-way latency of every link (default zero). A negative duration counts as zero.
    public var latency: Duration {
        get { Duration(nanoseconds: core.latency) }
        set { simulation.withDriving { core.latency = newValue.clampedNanoseconds } }
    }

    /// The largest segment a link carries, in bytes (nil, the default: each write whole). Set
    /// it to 1 to make every parser see its input one byte at a time.
    public var maxSegmentSize: Int? {
        get { core.maxSegmentSize }
        set { simulation.withDriving { core.maxSegmentSize = newValue.map { max(1, $0) } } }
    }

    /// The bytes one direction of a stream holds — in flight, or arrived and not yet read —
    /// before the writer's output stays in its buffer (default 256 KiB).
    public var window: Int {
        get { core.window }
        set { simulation.withDriving { core.window = max(1, newValue) } }
    }

    /// How long a connect that gets no answer (nobody has the address, a partition) waits
    /// before it fails with `ETIMEDOUT` (default 127 s).
    public var connectTimeout: Duration {
        get { Duration(nanoseconds: core.connectTimeout) }
        set { simulation.withDriving { core.connectTimeout = max(1, newValue.clampedNanoseconds) } }
    }

    /// The chance, from 0 to 1, that a datagram is lost on its way (default 0). Each datagram
    /// draws from the seed, so a run replays exactly.
    public var datagramLoss: Double {
        get { core.datagramLoss }
        set { simulation.withDriving { core.datagramLoss = min(1, max(0, newValue)) } }
    }

    /// The chance, from 0 to 1, that a datagram arrives twice (default 0).
    public var datagramDuplication: Double {
        get { core.datagramDuplication }
        set { simulation.withDriving { core.datagramDuplication = min(1, max(0, newValue)) } }
    }

    /// The chance, from 0 to 1, that a datagram is held back on its way — by up to two more
    /// latencies and a millisecond — so that datagrams sent after it can arrive first (default 0).
    public var datagramReordering: Double {
        get { core.datagramReordering }
        set { simulation.withDriving { core.datagramReordering = min(1, max(0, newValue)) } }
    }

    /// Cuts the links between hosts `one` and `other` (addresses): bytes between them are held —
    /// neither delivered nor failed — and connects between them get no answer, until
    /// ``heal(_:_:)``. Datagrams between them are lost.
    public func partition(_ one: String, _ other: String) {
        simulation.withDriving { core.partition(one, other) }
    }

    /// Restores the links between `one` and `other`: what was held arrives one latency later,
    /// in order.
    public func heal(_ one: String, _ other: String) {
        simulation.withDriving { core.heal(one, other) }
    }

    /// Resets every open stream between hosts `one` and `other` at once: both ends close with
    /// `.error(ECONNRESET)` (their connections see it when their loops next run). `one` and
    /// `other` may be the same host.
    public func reset(_ one: String, _ other: String) {
        simulation.withDriving { core.reset(one, other) }
    }

    /// Injects faults at random, chosen by the simulation's seed, from now until `duration`
    /// has passed — for soak tests whose oracle checks that the program survives them:
    /// - resets of one open stream between two of `hosts` (both ends see `ECONNRESET`),
    ///   `resetsPerMinute` on average;
    /// - partitions between two of `hosts`, `partitionsPerMinute` on average, each healed
    ///   after half to one and a half times `partitionDuration` (all healed by the end);
    /// - junk, `junkPerMinute` on average: 1 to 64 random bytes (newlines, NULs, invalid
    ///   UTF-8 among them) slipped into one direction of an open stream between two segments,
    ///   as if its writer had sent them — for parsers' bad-input tests.
    ///
    /// ``faults`` counts what was injected, by kind.
    public func injectFaults(resetsPerMinute: Double = 0, partitionsPerMinute: Double = 0,
                             partitionDuration: Duration = .seconds(2), junkPerMinute: Double = 0,
                             between hosts: [String], for duration: Duration)
    {
        simulation.withDriving {
            core.injectFaults(resetsPerMinute: max(0, resetsPerMinute), partitionsPerMinute: max(0, partitionsPerMinute),
                              partitionDuration: partitionDuration.clampedNanoseconds,
                              junkPerMinute: max(0, junkPerMinute), hosts: hosts,
                              until: core.now &+ duration.clampedNanoseconds)
        }
    }

    /// Stream ends whose connection has not closed them yet: 0 once every connection of the
    /// program has closed (a leak check).
    public var openStreamEnds: Int { core.openEnds.count }

    /// The bytes of junk slipped into streams so far (``faults``' "junk" counts the runs): a
    /// parser's oracle adds them to what the writers sent to account for every byte read.
    public var junkBytes: Int { core.junkBytes }

    /// UDP ports bound and not closed yet: 0 once every `DatagramSocket` of the program has
    /// closed (a leak check).
    public var boundDatagramPorts: Int { core.datagramPorts.count }

    /// The faults injected so far, by kind: "partition" (each partition of two hosts), "reset"
    /// (each stream reset), "junk" (each run of random bytes slipped in), "datagram-loss",
    /// "datagram-duplicate" and "datagram-reorder" (each datagram the seed chose for one).
    public var faults: [String: Int] { core.faults }
}
