import Foundation
import MainspringCore

/// A request as the server read it: a value, safe to keep and to pass to any thread.
///
/// The server read it whole (request line, header fields, a chunked or sized body) before its
/// handler runs; reading a field costs nothing further.
public struct HTTPRequest: Sendable {
    /// The method. A `HEAD` request is routed to the `GET` handler (its body is not sent).
    public var method: HTTPMethod
    /// The protocol the request came in: HTTP/1.0, HTTP/1.1 or HTTP/2. The only difference a
    /// handler can see: an HTTP/2 request's header field names are lower case (lookups ignore
    /// case anyway) and its `:authority` is its `host` field.
    public var version: HTTPVersion
    /// The path, percent-decoded (`/files/a b` for `/files/a%20b`).
    public var path: String
    /// The path as sent, still percent-encoded.
    public var rawPath: String
    /// The request target as sent (path and query).
    public var uri: String
    /// The query items, decoded, in order (`?a=1&b=x%20y` → `[("a", "1"), ("b", "x y")]`).
    public var queryItems: [(name: String, value: String)]
    /// The header fields (case-insensitive lookup).
    public var headers: HTTPHeaders
    /// The body (empty when there is none).
    public var body: [UInt8]
    /// The client, `host:port` (`[::1]:port` for IPv6).
    public var remoteAddress: String
    /// The loop this request is served on: where synchronous handlers run and where a
    /// `Feeder` for its work belongs.
    public var loop: EventLoop
    /// The counters of the server that read the request (for `/metrics`).
    public var server: HTTPServerStatistics

    /// The first query item named `name`, if any.
    public func query(_ name: String) -> String? { queryItems.first { $0.name == name }?.value }

    /// The body as UTF-8 text (invalid sequences replaced).
    public var text: String { String(decoding: body, as: UTF8.self) }

    /// Decodes the body as JSON.
    /// - Throws: `DecodingError` for a body that is not a `T` (a route can turn it into 400 with
    ///   `HTTPError.badRequest`).
    public func decode<T: Decodable>(_ type: T.Type, decoder: JSONDecoder = JSONDecoder()) throws -> T {
        try decoder.decode(type, from: Data(body))
    }
}

/// An HTTP protocol version: what ``HTTPRequest/version`` says a request came in.
public struct HTTPVersion: Sendable, Hashable, CustomStringConvertible {
    /// The major version: 1 or 2.
    public var major: Int
    /// The minor version: 0 or 1 for HTTP/1, 0 for HTTP/2.
    public var minor: Int

    /// The version `major.minor`.
    public init(major: Int, minor: Int) {
        self.major = major
        self.minor = minor
    }

    /// HTTP/1.0.
    public static let http1_0 = HTTPVersion(major: 1, minor: 0)
    /// HTTP/1.1.
    public static let http1_1 = HTTPVersion(major: 1, minor: 1)
    /// HTTP/2.
    public static let http2 = HTTPVersion(major: 2, minor: 0)

    /// `HTTP/1.1`, `HTTP/2`.
    public var description: String { major >= 2 && minor == 0 ? "HTTP/\(major)" : "HTTP/\(major).\(minor)" }
}

/// A response: status, header fields, body.
public struct HTTPResponse: Sendable {
    /// The status code (200, 404, …).
    public var status: Int
    /// The header fields. `Content-Length` is the server's (one set here is replaced by the
    /// body's length); `Date` is added by the server unless set here. No `Content-Type` is
    /// added: `text`, `json` and `status` set theirs, a response made with raw bytes has none
    /// unless it names one.
    public var headers: HTTPHeaders
    /// The body bytes.
    public var body: [UInt8]

    /// A response with raw bytes (no `Content-Type` unless `headers` has one).
    public init(status: Int = 200, headers: HTTPHeaders = [:], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A `text/plain; charset=utf-8` response.
    public static func text(_ text: String, status: Int = 200, headers: HTTPHeaders = [:]) -> HTTPResponse {
        var headers = headers
        if !headers.contains("Content-Type") { headers.add("Content-Type", "text/plain; charset=utf-8") }
        return HTTPResponse(status: status, headers: headers, body: Array(text.utf8))
    }

    /// An `application/json` response with `value` encoded (sorted keys).
    /// - Throws: `EncodingError` when `value` cannot be encoded.
    public static func json<T: Encodable>(_ value: T, status: Int = 200, headers: HTTPHeaders = [:],
                                          encoder: JSONEncoder? = nil) throws -> HTTPResponse
    {
        let encoder = encoder ?? {
            let made = JSONEncoder()
            made.outputFormatting = [.sortedKeys]
            return made
        }()
        var headers = headers
        if !headers.contains("Content-Type") { headers.add("Content-Type", "application/json") }
        return HTTPResponse(status: status, headers: headers, body: Array(try encoder.encode(value)))
    }

    /// A response with just a status and its reason phrase as a text body.
    public static func status(_ status: Int, headers: HTTPHeaders = [:]) -> HTTPResponse {
        .text("\(reasonPhrase(status))\n", status: status, headers: headers)
    }
}

/// An error a handler can throw to answer with a status of its choice (the message is sent as
/// the body). Any other error thrown by a handler becomes `500 Internal Server Error`, with no
/// detail of the error in the body.
public struct HTTPError: Error, Sendable {
    public var status: Int
    public var message: String
    public var headers: HTTPHeaders

    public init(status: Int, message: String? = nil, headers: HTTPHeaders = [:]) {
        self.status = status
        self.message = message ?? reasonPhrase(status)
        self.headers = headers
    }

    /// 400 with `message`.
    public static func badRequest(_ message: String) -> HTTPError { HTTPError(status: 400, message: message) }

    var response: HTTPResponse { .text(message.hasSuffix("\n") ? message : message + "\n", status: status, headers: headers) }
}
