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
        case .failure(.system(_, let code)):
            finish(.error(code))
        case .failure(let error):
            finish(.connectFailed(error))
        }
    }
}

/// Connecting over a simulation's network (`MainspringTesting`): the name resolved in the
/// simulation's table, the stream made by the network on virtual time.
extension ConnectionSource {
    func connectOverSimulatedNetwork(host: String, port: UInt16, options: Connection.Options) throws(EventLoopError) {
        let loop = self.loop
        let network: any SimulatedNetworking
        do throws(EventLoopError) {
            if numericAddress(host, port: port) == nil, !isPlausibleHostName(host) { throw EventLoopError.invalidAddress(host) }
            network = try loop.requireSimulatedNetwork(for: "a connection to \(remoteAddress)")
            socket = try BufferedSocket(simulatedOn: loop.base, end: nil, target: self)
        } catch {
            close()
            throw error
        }
        configureSocket()
        loop.resolveAddresses(host, port: port, timeout: options.resolveTimeout) { [weak self] resolved in
            guard let self else { return }
            switch resolved {
            case .failure(let error):
                self.finish(.connectFailed(error))
            case .success(let addresses):
                let named = numericAddress(host, port: port) == nil
                network.connect(from: loop, to: addresses[0]) { [weak self] result in
                    guard let self else {
                        if case .success(let end) = result { end.socketClosed(unreadInput: false) }
                        return
                    }
                    // Failures as a real connect reports them: a literal's errno, or a name's
                    // `.connectFailed` naming the address tried.
                    self.simulatedConnectFinished(result.mapError { error in
                        guard named, case .system(_, let code) = error else { return error }
                        return .connectFailed(host: host, port: port,
                                              attempts: [.init(address: addresses[0].description, errno: code)])
                    })
                }
            }
        }
    }

    /// The simulated connect's outcome (see `connectFinished`).
    private func simulatedConnectFinished(_ result: Result<any SimulatedStreamEnd, EventLoopError>) {
        switch result {
        case .success(let end):
            guard state.closeReason == nil, let socket else {
                end.socketClosed(unreadInput: false)
                return
            }
            socket.attach(simulated: end)
            if shutdownWhenConnected, socket.outputLength == 0 { socket.shutdownWrite() }
            handle(.connected, errno: 0)
        case .failure(let error):
            finish(.connectFailed(error))
        }
    }
}
