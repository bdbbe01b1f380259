import MainspringCore
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP request method.
public enum HTTPMethod: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case get = "GET"
    case head = "HEAD"
    case post = "POST"
    case put = "PUT"
    case delete = "DELETE"
    case patch = "PATCH"
    case options = "OPTIONS"
    case trace = "TRACE"
    case connect = "CONNECT"

    public var description: String { rawValue }

    /// Whether requests with this method may be repeated with the effect of one (RFC 9110
    /// §9.2.2): `GET`, `HEAD`, `PUT`, `DELETE`, `OPTIONS`, `TRACE`. What a client retries on its own.
    public var isIdempotent: Bool {
        switch self {
        case .get, .head, .put, .delete, .options, .trace: return true
        case .post, .patch, .connect: return false
        }
    }
}

/// Header fields in order, with case-insensitive lookup (`headers["content-type"]`).
///
/// A value type; lookups are linear in the number of fields (requests carry a handful).
public struct HTTPHeaders: Sendable, Equatable, Sequence, ExpressibleByDictionaryLiteral, CustomStringConvertible {
    /// The fields, in the order received or added.
    public private(set) var fields: [(name: String, value: String)]

    /// Empty headers.
    public init() { fields = [] }

    /// Headers from name–value pairs, in order.
    public init(_ fields: [(String, String)]) { self.fields = fields.map { (name: $0.0, value: $0.1) } }

    /// Headers taking `fields` as they are (no copy).
    init(fields: [(name: String, value: String)]) { self.fields = fields }

    public init(dictionaryLiteral elements: (String, String)...) { self.init(elements) }

    /// The first value of the field `name` (any case), or nil.
    public subscript(name: String) -> String? {
        fields.first { $0.name.caseInsensitiveEquals(name) }?.value
    }

    /// Every value of the field `name` (any case), in order.
    public func values(of name: String) -> [String] {
        fields.filter { $0.name.caseInsensitiveEquals(name) }.map(\.value)
    }

    /// Adds a field (keeps existing ones of the same name).
    public mutating func add(_ name: String, _ value: String) { fields.append((name: name, value: value)) }

    /// Replaces every field `name` (any case) with one field.
    public mutating func set(_ name: String, _ value: String) {
        remove(name)
        fields.append((name: name, value: value))
    }

    /// Removes every field `name` (any case).
    public mutating func remove(_ name: String) { fields.removeAll { $0.name.caseInsensitiveEquals(name) } }

    /// Whether a field `name` (any case) is present.
    public func contains(_ name: String) -> Bool { self[name] != nil }

    public func makeIterator() -> IndexingIterator<[(name: String, value: String)]> { fields.makeIterator() }

    public static func == (lhs: HTTPHeaders, rhs: HTTPHeaders) -> Bool {
        lhs.fields.elementsEqual(rhs.fields) { $0.name == $1.name && $0.value == $1.value }
    }

    public var description: String { fields.map { "\($0.name): \($0.value)" }.joined(separator: "\n") }
}

extension HTTPHeaders {
    /// Whether a comma-separated list field (`Connection`, `Upgrade`, `Transfer-Encoding`)
    /// names `token` (ASCII, any case; optional whitespace around each item) in any of its
    /// `values`. Reads bytes: no string is made.
    static func list(_ values: [String], contains token: String) -> Bool {
        let wanted = token.utf8
        func lowered(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5A ? byte + 0x20 : byte }
        for value in values {
            var rest = value.utf8[...]
            while !rest.isEmpty {
                let comma = rest.firstIndex(of: 44) ?? rest.endIndex
                let item = trimmingOptionalWhitespace(rest[..<comma])
                if item.count == wanted.count && zip(item, wanted).allSatisfy({ lowered($0) == lowered($1) }) {
                    return true
                }
                rest = comma == rest.endIndex ? rest[rest.endIndex...] : rest[rest.index(after: comma)...]
            }
        }
        return false
    }
}

/// `bytes` without the optional whitespace of HTTP (spaces and tabs) at either end.
func trimmingOptionalWhitespace<Bytes: BidirectionalCollection>(_ bytes: Bytes) -> Bytes.SubSequence
    where Bytes.Element == UInt8
{
    var trimmed = bytes[...]
    while let first = trimmed.first, first == 32 || first == 9 { trimmed = trimmed.dropFirst() }
    while let last = trimmed.last, last == 32 || last == 9 { trimmed = trimmed.dropLast() }
    return trimmed
}

extension StringProtocol {
    func caseInsensitiveEquals(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        return zip(utf8, other.utf8).allSatisfy { a, b in
            (a >= 0x41 && a <= 0x5A ? a + 0x20 : a) == (b >= 0x41 && b <= 0x5A ? b + 0x20 : b)
        }
    }
}

/// Why an `HTTPServer` could not start.
public enum HTTPServerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The host could not be parsed or resolved.
    case invalidAddress(String)
    /// A system call failed (`bind` when the port is in use, say).
    case system(function: String, errno: Int32)
    /// libevent could not create what was asked; `errno` is what the operating system reported
    /// (0 when libevent set none).
    case libevent(function: String, errno: Int32 = 0)
    /// The server (or its loop) is closed.
    case closed
    /// A loop of the server did not run the setup posted to it within the blocking
    /// initialiser's wait (it is not running, or stuck in a callback); `index` is its place in
    /// the server's loops. The async initialiser waits as long as it takes instead.
    case loopNotRunning(index: Int, waited: Duration)
    /// `Configuration.unixPath` names a file that exists and is not a stale socket: a socket a
    /// server listens on, or a file of another kind (`reason` says which). It is left alone.
    case unixSocketPathInUse(path: String, reason: String)

    public var description: String {
        switch self {
        case .invalidAddress(let text): return "invalid address \(text)"
        case .system(let function, let code): return "\(function) failed: \(errnoDescription(code))"
        case .libevent(let function, let code):
            return code == 0 ? "libevent: \(function) failed"
                : "libevent: \(function) failed: \(errnoDescription(code))"
        case .closed: return "the server is closed"
        case .loopNotRunning(let index, let waited):
            return "loop \(index) of the server did not set up its share within \(waited) (not running, or stuck in a callback)"
        case .unixSocketPathInUse(let path, let reason):
            return "cannot listen on unix socket \(path): it exists and is \(reason)"
        }
    }
}

extension HTTPServerError {
    /// The core's error of making or binding a listening socket, as the server reports it (the
    /// shared listening socket's and its loops' listeners' on real loops, the simulated
    /// listener's on simulated ones, alike).
    init(listening error: EventLoopError) {
        switch error {
        case .invalidAddress(let text): self = .invalidAddress(text)
        case .system(let function, let code): self = .system(function: function, errno: code)
        case .unixSocketPathInUse(let path, let reason): self = .unixSocketPathInUse(path: path, reason: reason)
        case .libevent(let function, let code): self = .libevent(function: function, errno: code)
        case .loopClosed: self = .closed
        default: self = .invalidAddress(error.description)
        }
    }
}

/// The reason phrase of a status code.
func reasonPhrase(_ status: Int) -> String {
    switch status {
    case 100: return "Continue"
    case 200: return "OK"
    case 201: return "Created"
    case 202: return "Accepted"
    case 204: return "No Content"
    case 206: return "Partial Content"
    case 301: return "Moved Permanently"
    case 302: return "Found"
    case 303: return "See Other"
    case 304: return "Not Modified"
    case 307: return "Temporary Redirect"
    case 308: return "Permanent Redirect"
    case 400: return "Bad Request"
    case 401: return "Unauthorized"
    case 403: return "Forbidden"
    case 404: return "Not Found"
    case 405: return "Method Not Allowed"
    case 408: return "Request Timeout"
    case 409: return "Conflict"
    case 410: return "Gone"
    case 411: return "Length Required"
    case 413: return "Content Too Large"
    case 414: return "URI Too Long"
    case 415: return "Unsupported Media Type"
    case 417: return "Expectation Failed"
    case 422: return "Unprocessable Content"
    case 429: return "Too Many Requests"
    case 431: return "Request Header Fields Too Large"
    case 500: return "Internal Server Error"
    case 501: return "Not Implemented"
    case 502: return "Bad Gateway"
    case 503: return "Service Unavailable"
    case 504: return "Gateway Timeout"
    case 505: return "HTTP Version Not Supported"
    default:
        switch status / 100 {
        case 1: return "Informational"
        case 2: return "Success"
        case 3: return "Redirection"
        case 4: return "Client Error"
        default: return "Server Error"
        }
    }
}
