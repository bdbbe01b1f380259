import Foundation

// The opening handshake (RFC 6455 §4): the `Sec-WebSocket-Accept` value, and what a server
// checks in an upgrade request before it answers `101`.
enum WebSocketHandshake {
    /// The GUID RFC 6455 appends to the client's key.
    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// `Sec-WebSocket-Accept` for `key`: base64 of the SHA-1 of the key and the GUID.
    static func acceptValue(forKey key: String) -> String {
        Data(sha1(Array((key + guid).utf8))).base64EncodedString()
    }

    /// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64.
    static func makeKey() -> String {
        var generator = SystemRandomNumberGenerator()
        return Data((0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) }).base64EncodedString()
    }

    /// What is wrong with an upgrade request, as the response to send (which closes the
    /// connection); nil when it is a valid WebSocket opening handshake. `426` with
    /// `Sec-WebSocket-Version: 13` for another version (or none); `400` for the rest.
    static func problem(with request: HTTPRequest) -> HTTPResponse? {
        guard var response = check(request) else { return nil }
        response.headers.set("Connection", "close")
        return response
    }

    private static func check(_ request: HTTPRequest) -> HTTPResponse? {
        guard request.method == .get else { return .text("WebSocket upgrade needs GET\n", status: 400) }
        guard HTTPHeaders.list(request.headers.values(of: "Upgrade"), contains: "websocket") else {
            return .text("expected Upgrade: websocket\n", status: 426, headers: ["Upgrade": "websocket"])
        }
        guard HTTPHeaders.list(request.headers.values(of: "Connection"), contains: "upgrade") else {
            return .text("expected Connection: Upgrade\n", status: 400)
        }
        guard request.headers["Sec-WebSocket-Version"]?.trimmingCharacters(in: .whitespaces) == "13" else {
            return .text("unsupported WebSocket version (13 only)\n", status: 426, headers: ["Sec-WebSocket-Version": "13"])
        }
        let keys = request.headers.values(of: "Sec-WebSocket-Key")
        guard keys.count == 1, let decoded = Data(base64Encoded: keys[0].trimmingCharacters(in: .whitespaces)),
              decoded.count == 16
        else {
            return .text("missing or invalid Sec-WebSocket-Key\n", status: 400)
        }
        return nil
    }
}

extension HTTPRequest {
    /// The subprotocols a WebSocket upgrade request offers (`Sec-WebSocket-Protocol`), in the
    /// client's order of preference: what a `WebSocket.Upgrade.accept(subprotocol:)` chooses from.
    public var webSocketSubprotocols: [String] {
        headers.values(of: "Sec-WebSocket-Protocol").flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }
}
