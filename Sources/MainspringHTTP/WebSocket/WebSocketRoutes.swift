import MainspringCore

/// A WebSocket route: its configuration, its upgrade decision, its handler.
struct WebSocketRoute: Sendable {
    /// The configuration, one value for all the route's WebSockets.
    let sharedConfiguration: SharedWebSocketConfiguration
    var configuration: WebSocket.Configuration { sharedConfiguration.value }
    let shouldUpgrade: (@Sendable (HTTPRequest) -> WebSocket.Upgrade)?
    let handler: @Sendable (WebSocket) async throws -> Void
}

extension HTTPRoutes {
    /// A WebSocket endpoint (RFC 6455) on `path`: a `GET` with a valid opening handshake is
    /// answered `101 Switching Protocols` (with `Sec-WebSocket-Accept`), and `handler` runs with
    /// the WebSocket in a task that prefers the request's loop (as an `async` route's handler
    /// does). When it returns the WebSocket closes (1000; 1011 if it threw).
    ///
    /// ```swift
    /// routes.webSocket("/ws/echo") { socket in
    ///     for await message in socket.messages { try await socket.send(message) }
    /// }
    /// ```
    ///
    /// - A request that is not an upgrade, or whose `Connection` lacks `upgrade`, or whose
    ///   `Sec-WebSocket-Key` is missing or not 16 bytes of base64, gets `400`; one without
    ///   `Upgrade: websocket` `426`; a `Sec-WebSocket-Version` other than 13 `426` with
    ///   `Sec-WebSocket-Version: 13`.
    /// - `shouldUpgrade` (on the request's loop, before the `101`; keep it short) checks what
    ///   the application cares about — the `Origin` (a browser's cross-site request), a token —
    ///   and chooses a subprotocol among `request.webSocketSubprotocols`: `.refuse(response)`
    ///   answers with that response instead. nil accepts every valid upgrade, with no
    ///   subprotocol. Choosing a subprotocol the client did not offer answers `500`. A refused
    ///   or invalid upgrade's response closes the connection.
    /// - Over HTTPS (an `HTTPServer` made with `tls:`) the WebSocket is `wss://`: the
    ///   connection keeps its TLS session.
    ///
    /// Once upgraded, the connection is the WebSocket's: it leaves the server's connection
    /// count and timeouts, takes the configuration's `outputLimit` and `closeTimeout`, and lives
    /// until either side closes it — or the server's `close()`, which starts the closing
    /// handshake of every WebSocket it upgraded (1001, "server closing") without waiting for it.
    /// - Complexity: the upgrade hands the request's connection itself to the WebSocket, on the
    ///   same loop (no new socket; over HTTPS, the same session), with what the client sent after
    ///   the request; each frame costs its header and, from a client, its unmasking.
    public mutating func webSocket(_ path: String, match: PathMatch = .exact,
                                   configuration: WebSocket.Configuration = .init(),
                                   shouldUpgrade: (@Sendable (HTTPRequest) -> WebSocket.Upgrade)? = nil,
                                   _ handler: @escaping @Sendable (WebSocket) async throws -> Void)
    {
        configuration.check("HTTPRoutes.webSocket(\(path))")
        add([.get], path, match: match,
            .webSocket(WebSocketRoute(sharedConfiguration: SharedWebSocketConfiguration(configuration), shouldUpgrade: shouldUpgrade, handler: handler)))
    }
}

extension LoopEndpoint {
    /// Answers an upgrade request on a WebSocket route: an error response, or `101` and the
    /// WebSocket. Loop thread.
    func upgradeToWebSocket(_ route: WebSocketRoute, _ request: HTTPRequest, _ raw: any ServerExchange) {
        if let problem = WebSocketHandshake.problem(with: request) {
            reply(problem, to: raw, method: request.method)
            return
        }
        var subprotocol: String?
        var extra = HTTPHeaders()
        switch route.shouldUpgrade?(request) ?? .accept() {
        case .refuse(var response):
            response.headers.set("Connection", "close")
            reply(response, to: raw, method: request.method)
            return
        case .accept(let chosen, let headers):
            if let chosen, !request.webSocketSubprotocols.contains(chosen) {
                reply(.text("WebSocket subprotocol \(chosen) was not offered\n", status: 500), to: raw, method: request.method)
                return
            }
            subprotocol = chosen
            extra = headers
        }
        var head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        head += "Sec-WebSocket-Accept: \(WebSocketHandshake.acceptValue(forKey: request.headers["Sec-WebSocket-Key"] ?? ""))\r\n"
        if let subprotocol { head += "Sec-WebSocket-Protocol: \(subprotocol)\r\n" }
        var agreement: DeflateAgreement?
        if let compression = route.configuration.compression,
           let (response, agreed) = DeflateAgreement.answer(offers: request.headers.values(of: "Sec-WebSocket-Extensions"),
                                                            settings: compression)
        {
            head += "Sec-WebSocket-Extensions: \(response)\r\n"
            agreement = agreed
        }
        for field in extra where !(field.name + field.value).utf8.contains(where: { $0 == 0x0D || $0 == 0x0A }) {
            head += "\(field.name): \(field.value)\r\n"
        }
        head += "\r\n"
        let configuration = route.configuration
        let options = Connection.Options(outputLimit: configuration.outputLimit, closeTimeout: configuration.closeTimeout)
        let taken = raw.takeOverConnection(options: options) { [self] connection, leftover in
            startWebSocket(route, request, connection: connection, head: head, leftover: leftover,
                           subprotocol: subprotocol, agreement: agreement)
        }
        if !taken && raw.isConnectionOpen { reply(.status(500), to: raw, method: request.method) }
    }

    /// The upgraded connection: the `101` goes out, and the route's handler gets its WebSocket.
    /// Loop thread.
    private func startWebSocket(_ route: WebSocketRoute, _ request: HTTPRequest, connection: Connection, head: String,
                                leftover: [UInt8], subprotocol: String?, agreement: DeflateAgreement?)
    {
        statistics.recordResponse(status: 101)
        connection.write(head)
        let core = WebSocketCore(connection: connection, configuration: route.sharedConfiguration, isClient: false,
                                 agreement: agreement)
        core.server = self
        core.start(leftover: leftover)
        // Counted open until it closes; if the server began closing after this upgrade's
        // request was read, it goes as the others went.
        openWebSockets[ObjectIdentifier(core)] = core
        if isDraining { closeLateWebSocket(core) }
        let socket = WebSocket(core: core, subprotocol: subprotocol, request: request)
        let handler = route.handler
        Task(executorPreference: loop) {
            do {
                try await handler(socket)
                await socket.closeAndWait(code: .normalClosure)
            } catch {
                await socket.closeAndWait(code: .internalError)
            }
        }
    }
}
