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
            if shutdownWhenConnected, socket.outputLength == 0 { halfClose(socket) }
            handle(.connected, errno: 0)
        case .failure(let error):
            connectFailed(error)
        }
    }

    /// A connect that failed, reported as `startConnecting` documents it on real and simulated
    /// loops alike: a literal's errno as `.error(errno)` (`ECONNREFUSED`), anything else (a
    /// name's every address tried, a name not found) as `.connectFailed`.
    func connectFailed(_ error: EventLoopError) {
        if case .system(_, let code) = error {
            finish(.error(code))
        } else {
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
            network = try loop.simulatedNetwork(forConnectingTo: host, port: port)
            socket = try BufferedSocket(simulatedOn: loop.base, end: nil, target: self)
        } catch {
            close()
            throw error
        }
        configureSocket()
        loop.connectSimulatedStream(to: host, port: port, options: options, network: network) { [weak self] result in
            guard let self else {
                if case .success(let end) = result { end.socketClosed(unreadInput: false) }
                return
            }
            self.simulatedConnectFinished(result)
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
            if shutdownWhenConnected, socket.outputLength == 0 { halfClose(socket) }
            handle(.connected, errno: 0)
        case .failure(let error):
            connectFailed(error)
        }
    }
}

extension EventLoop {
    /// On a simulated loop (`MainspringTesting`): connects a stream of the simulation's network
    /// to `host:port` — the name resolved in the simulation's table — as `connectSocket`
    /// connects a socket, for a layer that puts its own bufferevent over the stream
    /// (MainspringTLS). `done` runs on this loop's thread once: with the stream's end (now the
    /// caller's to close), or the error a real connect reports (a literal's errno, a name's
    /// `.connectFailed` naming the address tried, `.hostNotFound`). Loop thread only.
    package func connectSimulatedStream(to host: String, port: UInt16, options: Connection.Options,
                                        _ done: @escaping (Result<any SimulatedStreamEnd, EventLoopError>) -> Void)
    {
        do throws(EventLoopError) {
            connectSimulatedStream(to: host, port: port, options: options,
                                   network: try simulatedNetwork(forConnectingTo: host, port: port), done)
        } catch {
            done(.failure(error))
        }
    }

    /// The simulation's network for a connect to `host:port`, once the host is known to be one
    /// (an address literal or a plausible name). Throws `.invalidAddress`, or `.simulatedLoop`
    /// without a network.
    fileprivate func simulatedNetwork(forConnectingTo host: String, port: UInt16) throws(EventLoopError)
        -> any SimulatedNetworking
    {
        if numericAddress(host, port: port) == nil, !isPlausibleHostName(host) { throw .invalidAddress(host) }
        return try requireSimulatedNetwork(for: "a connection to \(hostAndPort(host, port))")
    }

    fileprivate func connectSimulatedStream(to host: String, port: UInt16, options: Connection.Options,
                                            network: any SimulatedNetworking,
                                            _ done: @escaping (Result<any SimulatedStreamEnd, EventLoopError>) -> Void)
    {
        resolveAddresses(host, port: port, timeout: options.resolveTimeout) { [self] resolved in
            switch resolved {
            case .failure(let error):
                done(.failure(error))
            case .success(let addresses):
                let named = numericAddress(host, port: port) == nil
                network.connect(from: self, to: addresses[0]) { result in
                    // Failures as a real connect reports them: a literal's errno, or a name's
                    // `.connectFailed` naming the address tried.
                    done(result.mapError { error in
                        guard named, case .system(_, let code) = error else { return error }
                        return .connectFailed(host: host, port: port,
                                              attempts: [.init(address: addresses[0].description, errno: code)])
                    })
                }
            }
        }
    }
}
