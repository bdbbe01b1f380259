/// What a connection is made over, as the loop's world (`LoopWorld`) hands it out: a connected
/// socket's descriptor (the kernel's), or one end of a stream of a simulation's network
/// (`MainspringTesting`). The connection makes its socket over it and owns it from then on; one
/// never used is released.
package enum StreamEndpoint {
    case descriptor(Int32)
    case simulated(any SimulatedStreamEnd)

    /// The connection's socket over this endpoint, its events to `target`. On a failure the
    /// endpoint is released (the descriptor closed, the stream's end closed).
    func makeSocket(on base: EventBase, target: NativeEventTarget) throws(EventLoopError) -> BufferedSocket {
        switch self {
        case .descriptor(let fd):
            do {
                return try BufferedSocket(base: base, fd: fd, target: target)
            } catch {
                closeDescriptor(fd)
                throw error
            }
        case .simulated(let end):
            do {
                return try BufferedSocket(simulatedOn: base, end: end, target: target)
            } catch {
                end.socketClosed(unreadInput: false)
                throw error
            }
        }
    }

    /// Gives the endpoint back unused: the descriptor closed, the stream's end closed (its peer
    /// reads the end of the stream).
    package func release() {
        switch self {
        case .descriptor(let fd): closeDescriptor(fd)
        case .simulated(let end): end.socketClosed(unreadInput: false)
        }
    }
}
