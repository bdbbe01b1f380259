/// Connections without a listener: a connected pair for tests, and a descriptor the caller
/// already has.
extension Connection {
    /// Two connections on `loop`, connected to each other: what one writes, the other reads —
    /// protocol code tested without a listener or a port. Each is a full `Connection` (lines,
    /// exact reads, backpressure, half-close, close reasons) over one end of a Unix
    /// `socketpair`. Loop thread only.
    ///
    /// On a simulated loop (`MainspringTesting`) the two are ends of one stream of the
    /// simulation's network: its latency, segments and faults apply between them.
    /// - Throws: `EventLoopError.system` (`socketpair`: out of descriptors, say), `.wrongThread`,
    ///   `.simulatedLoop`.
    public static func makePair(on loop: EventLoop, options: Options = .init()) throws(EventLoopError)
        -> (Connection, Connection)
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Connection.makePair(on:options:)") }
        options.check("Connection.makePair")
        let (first, second) = try loop.world.makePair(on: loop)
        let one: ConnectionSource
        do {
            one = try ConnectionSource(loop: loop, endpoint: first, peer: "pair", options: options)
        } catch {
            second.release()
            throw error
        }
        do {
            let other = try ConnectionSource(loop: loop, endpoint: second, peer: "pair", options: options)
            return (Connection(source: one), Connection(source: other))
        } catch {
            one.close()
            throw error
        }
    }

    /// `makePair(on:options:)` from any task: made on `loop`'s thread.
    /// - Throws: as the callback form, and `.loopClosed`.
    public static func makePair(on loop: EventLoop, options: Options = .init()) async throws(EventLoopError)
        -> (Connection, Connection)
    {
        let made: Result<(Connection, Connection), EventLoopError> = await withUnsafeContinuation { continuation in
            loop.executeNowOrPost({
                continuation.resume(returning: Result { () throws(EventLoopError) in try makePair(on: loop, options: options) })
            }, orElse: { continuation.resume(returning: .failure(.loopClosed)) })
        }
        return try made.get()
    }

    /// A connection over `descriptor`, a connected stream socket the caller already has (one
    /// end of a `socketpair`, a socket inherited from a parent), as ``Listener`` adopts a
    /// listening one. Made non-blocking and close-on-exec; from then on the connection owns the
    /// descriptor and closes it. When a check fails the descriptor is left open, still the
    /// caller's (once checked, a failure to register it with the loop closes it). Loop thread
    /// only.
    /// - Throws: `EventLoopError.notConnectedSocket` naming what the descriptor is instead (a
    ///   file, a pipe, a datagram or listening socket, an unconnected one), `.badDescriptor`,
    ///   `.system`, `.wrongThread`, `.simulatedLoop`.
    public static func adopting(descriptor: Int32, on loop: EventLoop, options: Options = .init())
        throws(EventLoopError) -> Connection
    {
        guard loop.claimThread() else { throw .wrongThread(function: "Connection.adopting(descriptor:on:options:)") }
        options.check("Connection.adopting(descriptor:)")
        let endpoint = try loop.world.adopt(descriptor: descriptor)
        return Connection(source: try ConnectionSource(loop: loop, endpoint: endpoint, peer: "descriptor \(descriptor)",
                                                       options: options))
    }
}
