import Foundation
@_spi(MainspringHTTP) import MainspringCore
import Synchronization

extension WebSocket {
    /// Connects to a `ws://` or `wss://` URL (`ws://host:port/path?query`) from `loop` and
    /// completes the opening handshake; returns the open WebSocket. Any task.
    ///
    /// The handshake is checked: status `101`, `Upgrade: websocket`, `Connection: upgrade`,
    /// `Sec-WebSocket-Accept` matching the random key sent, a subprotocol only among those
    /// offered, permessage-deflate only if `configuration.compression` offered it. The handshake has
    /// `configuration.handshakeTimeout` once connected; connecting has the connection's own
    /// limits (a name's resolve timeout, the system's connect timeout). Frames sent are masked
    /// with a fresh random key each.
    ///
    /// `wss://` runs over `secureConnector`, which `MainspringTLS` provides (this module does not
    /// link OpenSSL): `secureConnector: .tls(context)`, the server's certificate checked against
    /// the URL's host as the context's configuration says.
    /// - Parameters:
    ///   - url: `ws://host[:port][/path][?query]` (port 80 by default) or `wss://…` (443).
    ///   - loop: the loop the WebSocket lives on (its connection, its timers).
    ///   - configuration: limits and timeouts, `handshakeTimeout` among them.
    ///   - subprotocols: offered in `Sec-WebSocket-Protocol`, in order of preference; the
    ///     server's choice is `subprotocol`.
    ///   - headers: added to the upgrade request (`Origin`, `Authorization`, …).
    ///   - secureConnector: how a `wss://` URL is connected (TLS); nil refuses `wss://`.
    /// - Throws: `WebSocketError.invalidURL` (not `ws://` or `wss://` with a host, or `wss://`
    ///   without a `secureConnector`), `.connectFailed`, `.tlsFailed` (`wss://`), `.handshakeFailed`, `.cancelled` when
    ///   the calling task is cancelled (the connection is closed).
    public static func connect(to url: String, on loop: EventLoop, configuration: Configuration = .init(),
                               subprotocols: [String] = [], headers: HTTPHeaders = [:],
                               secureConnector: HTTPClient.Connector? = nil) async throws(WebSocketError) -> WebSocket
    {
        guard let parts = URLComponents(string: url), let scheme = parts.scheme?.lowercased(), scheme == "ws" || scheme == "wss",
              let host = parts.host, !host.isEmpty
        else {
            throw .invalidURL(url)
        }
        let secure = scheme == "wss"
        let connector: HTTPClient.Connector
        if secure {
            guard let secureConnector else { throw .invalidURL("\(url) (wss:// needs a secureConnector: MainspringTLS's .tls(context))") }
            connector = secureConnector
        } else {
            connector = .tcp
        }
        let port = parts.port ?? (secure ? 443 : 80)
        guard (1...65_535).contains(port) else { throw .invalidURL(url) }
        var path = parts.percentEncodedPath.isEmpty ? "/" : parts.percentEncodedPath
        if let query = parts.percentEncodedQuery { path += "?" + query }
        return try await open(host: host, port: UInt16(port), defaultPort: secure ? 443 : 80, path: path, on: loop,
                              configuration: configuration, subprotocols: subprotocols, headers: headers, connector: connector)
    }

    /// Connects to `host:port` (a literal or a name) and asks for a WebSocket on `path` (the
    /// request target, query included), over plain TCP; `connect(to:on:configuration:subprotocols:headers:secureConnector:)`
    /// otherwise.
    public static func connect(host: String, port: UInt16, path: String = "/", on loop: EventLoop,
                               configuration: Configuration = .init(), subprotocols: [String] = [],
                               headers: HTTPHeaders = [:]) async throws(WebSocketError) -> WebSocket
    {
        try await open(host: host, port: port, defaultPort: 80, path: path, on: loop, configuration: configuration,
                       subprotocols: subprotocols, headers: headers, connector: .tcp)
    }

    private static func open(host: String, port: UInt16, defaultPort: UInt16, path: String, on loop: EventLoop,
                             configuration: Configuration, subprotocols: [String], headers: HTTPHeaders,
                             connector: HTTPClient.Connector) async throws(WebSocketError) -> WebSocket
    {
        configuration.check("WebSocket.connect")
        let connection: Connection
        do {
            connection = try await connector.connect(
                host, port, host, loop, .init(outputLimit: configuration.outputLimit, closeTimeout: configuration.closeTimeout))
        } catch {
            if Task.isCancelled { throw .cancelled }
            switch HTTPClient.Connector.Failure(error) {
            case .cancelled: throw .cancelled
            case .notConnected(let connectError): throw .connectFailed("\(connectError)")
            case .notSecured(let tlsError): throw .tlsFailed(tlsError)
            }
        }
        let deadline = HandshakeDeadline(connection: connection)
        loop.execute { deadline.arm(after: configuration.handshakeTimeout) }
        do throws(WebSocketError) {
            let (subprotocol, agreement) = try await handshake(
                connection, host: host, port: port, defaultPort: defaultPort, path: path, subprotocols: subprotocols,
                headers: headers, compression: configuration.compression, deadline: deadline)
            let core = WebSocketCore(connection: connection, configuration: SharedWebSocketConfiguration(configuration),
                                     isClient: true, agreement: agreement)
            let started: Bool = await withUnsafeContinuation { continuation in
                loop.executeNowOrPostForHTTP({
                    guard deadline.disarm() else { return continuation.resume(returning: false) }
                    core.start(leftover: [])
                    continuation.resume(returning: true)
                }, orElse: { continuation.resume(returning: false) })
            }
            guard started else { throw WebSocketError.handshakeFailed("no 101 within \(configuration.handshakeTimeout)") }
            return WebSocket(core: core, subprotocol: subprotocol, request: nil)
        } catch {
            connection.close()
            if deadline.hasFired { throw .handshakeFailed("no 101 within \(configuration.handshakeTimeout)") }
            if Task.isCancelled { throw .cancelled }
            throw error
        }
    }

    /// Sends the upgrade request and checks the answer; returns the subprotocol chosen.
    private static func handshake(_ connection: Connection, host: String, port: UInt16, defaultPort: UInt16, path: String,
                                  subprotocols: [String],
                                  headers: HTTPHeaders, compression: Compression?,
                                  deadline: HandshakeDeadline) async throws(WebSocketError) -> (String?, DeflateAgreement?)
    {
        let key = WebSocketHandshake.makeKey()
        let hostField = (host.contains(":") ? "[\(host)]" : host) + (port == defaultPort ? "" : ":\(port)")
        var request = "GET \(path) HTTP/1.1\r\nHost: \(hostField)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        request += "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n"
        if !subprotocols.isEmpty { request += "Sec-WebSocket-Protocol: \(subprotocols.joined(separator: ", "))\r\n" }
        if let compression { request += "Sec-WebSocket-Extensions: \(DeflateAgreement.offer(compression))\r\n" }
        for field in headers.fields where !(field.name + field.value).utf8.contains(where: { $0 == 0x0D || $0 == 0x0A }) {
            request += "\(field.name): \(field.value)\r\n"
        }
        request += "\r\n"
        let head: [UInt8]
        do {
            try await connection.send(request)
            switch try await connection.read(until: [0x0D, 0x0A, 0x0D, 0x0A], limit: 16_384) {
            case .found(let bytes): head = bytes
            case .tooLong: throw WebSocketError.handshakeFailed("response head over 16 KiB")
            case nil: throw WebSocketError.handshakeFailed("the server closed the connection")
            }
        } catch let error as WebSocketError {
            throw error
        } catch {
            throw .handshakeFailed(deadline.hasFired ? "timed out" : "\(error)")
        }
        let lines = String(decoding: head, as: UTF8.self).components(separatedBy: "\r\n")
        let status = lines.first ?? ""
        let statusParts = status.split(separator: " ", maxSplits: 2)
        guard statusParts.count >= 2, statusParts[0].hasPrefix("HTTP/1."), statusParts[1] == "101" else {
            throw .handshakeFailed("status \(status.isEmpty ? "missing" : status)")
        }
        var fields = HTTPHeaders()
        for line in lines.dropFirst() where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":") else { throw .handshakeFailed("malformed header line") }
            fields.add(String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        guard HTTPHeaders.list(fields.values(of: "Upgrade"), contains: "websocket") else {
            throw .handshakeFailed("no Upgrade: websocket")
        }
        guard HTTPHeaders.list(fields.values(of: "Connection"), contains: "upgrade") else {
            throw .handshakeFailed("no Connection: upgrade")
        }
        guard fields["Sec-WebSocket-Accept"] == WebSocketHandshake.acceptValue(forKey: key) else {
            throw .handshakeFailed("Sec-WebSocket-Accept does not match the key")
        }
        var agreement: DeflateAgreement?
        let extensions = fields.values(of: "Sec-WebSocket-Extensions")
        if !extensions.isEmpty {
            guard let compression, let agreed = DeflateAgreement.accepted(extensions, settings: compression) else {
                throw .handshakeFailed("extensions not offered or not valid: \(extensions.joined(separator: ", "))")
            }
            agreement = agreed
        }
        guard let chosen = fields["Sec-WebSocket-Protocol"] else { return (nil, agreement) }
        guard subprotocols.contains(chosen) else { throw .handshakeFailed("subprotocol \(chosen) was not offered") }
        return (chosen, agreement)
    }
}

/// The client handshake's deadline: a loop timer that closes the connection. Loop thread only,
/// except `hasFired`.
private final class HandshakeDeadline: @unchecked Sendable {
    private let connection: Connection
    private var timer: TimerHandle?
    private var isDisarmed = false
    private let fired = Atomic(false)

    init(connection: Connection) { self.connection = connection }

    var hasFired: Bool { fired.load(ordering: .acquiring) }

    func arm(after timeout: Duration) {
        guard !isDisarmed else { return }
        timer = connection.loop.schedule(after: timeout) { [self] in
            guard !isDisarmed else { return }
            fired.store(true, ordering: .releasing)
            connection.close()
        }
    }

    /// Stops the timer; false when it fired first.
    func disarm() -> Bool {
        isDisarmed = true
        timer?.cancel()
        timer = nil
        return !hasFired
    }
}
