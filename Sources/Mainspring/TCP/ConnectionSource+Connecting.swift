/// Setting up the socket, and the outcome of a connect by name.
extension ConnectionSource {
    func configureSocket() {
        socket?.setReadHighWatermark(readLimit)
        if kept.idleTimeoutNanoseconds > 0 {
            socket?.setTimeouts(readNanoseconds: kept.idleTimeoutNanoseconds, writeNanoseconds: nil)
        }
    }

    /// The connect's outcome: the socket goes into the bufferevent (which writes what was
    /// buffered meanwhile), or the connection closes with the failure.
    func connectFinished(_ result: Result<Int32, EventLoopError>) {
        switch result {
        case .success(let fd):
            guard state.closeReason == nil, let socket else {
                closeDescriptor(fd)
                return
            }
            do {
                try socket.attach(fd: fd)
            } catch {
                finish(.error(error.errnoCode))
                return
            }
            if shutdownWhenConnected, socket.outputLength == 0 { socket.shutdownWrite() }
            handle(.connected, errno: 0)
        case .failure(let error):
            finish(.connectFailed(error))
        }
    }
}
