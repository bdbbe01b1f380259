/// A header list to submit: names (lower case) and values in one buffer. Pseudo-header fields
/// first.
struct HTTP2Fields {
    private(set) var bytes: [UInt8] = []
    private(set) var spans: [(name: Int, nameCount: Int, value: Int, valueCount: Int)] = []

    init() {
        bytes.reserveCapacity(256)
        spans.reserveCapacity(8)
    }

    var count: Int { spans.count }

    mutating func append(_ name: some Collection<UInt8>, _ value: some Collection<UInt8>) {
        let nameStart = bytes.count
        bytes.append(contentsOf: name)
        let valueStart = bytes.count
        bytes.append(contentsOf: value)
        spans.append((nameStart, valueStart - nameStart, valueStart, bytes.count - valueStart))
    }

    /// Appends `name` (lower-cased: HTTP/2 field names are) and `value`.
    mutating func append(lowercasing name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) {
        let nameStart = bytes.count
        bytes.append(contentsOf: name)
        for index in nameStart..<bytes.count where bytes[index] >= 0x41 && bytes[index] <= 0x5A { bytes[index] |= 0x20 }
        let valueStart = bytes.count
        bytes.append(contentsOf: value)
        spans.append((nameStart, valueStart - nameStart, valueStart, bytes.count - valueStart))
    }

    /// Appends `name` (lower-cased) and `value`.
    mutating func append(lowercasing name: String, _ value: String) {
        var name = name, value = value
        name.withUTF8 { name in value.withUTF8 { value in append(lowercasing: name, value) } }
    }

    /// Appends `content-length: length`.
    mutating func appendContentLength(_ length: Int) {
        let nameStart = bytes.count
        bytes.append(contentsOf: UnsafeBufferPointer(start: Self.contentLengthName.utf8Start,
                                                     count: Self.contentLengthName.utf8CodeUnitCount))
        let valueStart = bytes.count
        appendDecimal(max(0, length), to: &bytes)
        spans.append((nameStart, valueStart - nameStart, valueStart, bytes.count - valueStart))
    }

    private static let contentLengthName: StaticString = "content-length"

    /// Appends every field of `other`.
    mutating func append(contentsOf other: HTTP2Fields) {
        let base = bytes.count
        bytes.append(contentsOf: other.bytes)
        for span in other.spans {
            spans.append((span.name + base, span.nameCount, span.value + base, span.valueCount))
        }
    }

    /// Whether `name` is one of the connection-specific fields HTTP/2 forbids (RFC 9113
    /// §8.2.2): `Connection`, `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`,
    /// `Upgrade`, in any case. The server's responses and the client's requests leave them out.
    static func isConnectionSpecific(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        func named(_ text: StaticString) -> Bool {
            name.count == text.utf8CodeUnitCount
                && zip(name, UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
                .allSatisfy { ($0 | 0x20) == $1 }
        }
        switch name.count {
        case 7: return named("upgrade")
        case 10: return named("connection") || named("keep-alive")
        case 16: return named("proxy-connection")
        case 17: return named("transfer-encoding")
        default: return false
        }
    }
}
