// A minimal HPACK (RFC 7541) for the HTTP/2 attack tests: a writer of hand-made field blocks
// (no Huffman unless asked, no dynamic table of its own: the test decides what the peer's table
// holds) and a reader of a server's field blocks (static and dynamic tables, Huffman strings).
// Frames live in HTTP2RawFrames.swift. Standard library only.

/// Writes an HPACK field block one representation at a time (RFC 7541 §6).
struct HPACKWriter: Sendable {
    /// The field block written so far.
    private(set) var bytes: [UInt8] = []

    /// An empty block.
    init() {}

    /// Indexed field (§6.1): a static (1...61) or dynamic (62...) table entry, by index.
    mutating func indexed(_ index: Int) {
        bytes += Self.encodedInteger(index, prefixBits: 7, pattern: 0x80)
    }

    /// Literal with incremental indexing and a new name (§6.2.1): the peer adds the field to its
    /// dynamic table (§4.4), evicting older entries.
    mutating func literalIndexed(name: String, value: String) {
        bytes.append(0x40)
        bytes += Self.encodedString(name) + Self.encodedString(value)
    }

    /// Literal with incremental indexing whose name is a table entry's (§6.2.1).
    mutating func literalIndexed(nameIndex: Int, value: String) {
        bytes += Self.encodedInteger(nameIndex, prefixBits: 6, pattern: 0x40)
        bytes += Self.encodedString(value)
    }

    /// Literal without indexing and a new name (§6.2.2): the peer's table does not change.
    mutating func literal(name: String, value: String) {
        bytes.append(0x00)
        bytes += Self.encodedString(name) + Self.encodedString(value)
    }

    /// Literal without indexing whose name is a table entry's (§6.2.2).
    mutating func literal(nameIndex: Int, value: String) {
        bytes += Self.encodedInteger(nameIndex, prefixBits: 4, pattern: 0x00)
        bytes += Self.encodedString(value)
    }

    /// Literal never indexed with a new name (§6.2.3).
    mutating func literalNeverIndexed(name: String, value: String) {
        bytes.append(0x10)
        bytes += Self.encodedString(name) + Self.encodedString(value)
    }

    /// A field without indexing (§6.1, §6.2.2), as short as the static table (Appendix A) makes
    /// it: the entry's index for an exact pair, else a literal with the name's index, else a
    /// literal with a new name. The peer's dynamic table does not change.
    mutating func field(name: String, value: String) {
        let table = HPACKReader.staticTable
        if let index = table.firstIndex(where: { $0.name == name && $0.value == value }) {
            indexed(index + 1)
        } else if let index = table.firstIndex(where: { $0.name == name }) {
            literal(nameIndex: index + 1, value: value)
        } else {
            literal(name: name, value: value)
        }
    }

    /// Dynamic table size update (§6.3); legal only at the start of a block (§4.2) and up to the
    /// peer's SETTINGS_HEADER_TABLE_SIZE.
    mutating func tableSizeUpdate(_ size: Int) {
        bytes += Self.encodedInteger(size, prefixBits: 5, pattern: 0x20)
    }

    /// Appends bytes as they are, to write what no representation allows.
    mutating func appendRaw(_ raw: [UInt8]) {
        bytes += raw
    }

    /// An integer with an N-bit prefix (§5.1): `value` (not negative) in the low `prefixBits`
    /// (1...8) bits of the first byte, whose high bits come from `pattern`, then 7 bits a byte.
    static func encodedInteger(_ value: Int, prefixBits: Int, pattern: UInt8 = 0) -> [UInt8] {
        precondition(value >= 0, "HPACK integers are unsigned")
        precondition((1...8).contains(prefixBits), "an HPACK prefix has 1 to 8 bits")
        let limit = (1 << prefixBits) - 1
        let high = pattern & ~UInt8(limit)
        guard value >= limit else { return [high | UInt8(value)] }
        var bytes = [high | UInt8(limit)]
        var rest = value - limit
        while rest >= 128 {
            bytes.append(UInt8(rest & 0x7f) | 0x80)
            rest >>= 7
        }
        bytes.append(UInt8(rest))
        return bytes
    }

    /// A string literal (§5.2): a 7-bit-prefix length with the H bit, then the octets, raw
    /// (H = 0) or Huffman-coded (H = 1, Appendix B).
    static func encodedString(_ octets: [UInt8], huffman: Bool = false) -> [UInt8] {
        let body = huffman ? HPACKHuffman.encode(octets) : octets
        return encodedInteger(body.count, prefixBits: 7, pattern: huffman ? 0x80 : 0) + body
    }

    /// A string literal of `text`'s UTF-8 (§5.2).
    static func encodedString(_ text: String, huffman: Bool = false) -> [UInt8] {
        encodedString(Array(text.utf8), huffman: huffman)
    }

    /// A request's field block (RFC 9113 §8.3.1): :method, :scheme, :path, :authority as
    /// `field(name:value:)` writes them (:method GET is index 2, POST 3; :scheme http 6, https 7;
    /// :path / 4, /index.html 5), then `extra` in order as literals without indexing with new
    /// names (§6.2.2).
    static func request(
        method: String = "GET", path: String, authority: String = "localhost",
        scheme: String = "http", extra: [(String, String)] = []
    ) -> [UInt8] {
        var writer = HPACKWriter()
        writer.field(name: ":method", value: method)
        writer.field(name: ":scheme", value: scheme)
        writer.field(name: ":path", value: path)
        writer.field(name: ":authority", value: authority)
        for (name, value) in extra { writer.literal(name: name, value: value) }
        return writer.bytes
    }
}

/// Decodes a peer's field blocks (RFC 7541 §3), keeping the dynamic table between blocks as
/// the peer's encoder does. One reader per connection direction.
struct HPACKReader: Sendable {
    /// The static table (Appendix A): entry `i` is at `[i - 1]`.
    static let staticTable: [(name: String, value: String)] = [
        (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
        (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
        (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
        (":status", "404"), (":status", "500"), ("accept-charset", ""),
        ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
        ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
        ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
        ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
        ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
        ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
        ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
        ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
        ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
        ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
        ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
        ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
    ]

    /// The dynamic table (§2.3.2), newest entry first: index 62 is `entries[0]`.
    private var entries: [(name: [UInt8], value: [UInt8])] = []
    /// The dynamic table's size (§4.1): each entry's name and value octets plus 32.
    private(set) var tableSize = 0
    /// The table's current maximum size, as the last size update set it (§4.2, §6.3).
    private(set) var maxTableSize: Int
    /// The ceiling a size update may not pass: our SETTINGS_HEADER_TABLE_SIZE (§4.2).
    let tableSizeLimit: Int

    /// A reader whose table may hold `maxTableSize` octets (4096 is the protocol default).
    init(maxTableSize: Int = 4096) {
        self.maxTableSize = maxTableSize
        tableSizeLimit = maxTableSize
    }

    /// How many entries the dynamic table holds.
    var dynamicEntryCount: Int { entries.count }

    /// The fields of one complete field block, in order, updating the dynamic table; nil when
    /// the block is malformed (bad index, truncated integer or string, bad Huffman code, size
    /// update past the limit or after a field). After nil the table is unreliable.
    mutating func decode(_ block: [UInt8]) -> [(name: String, value: String)]? {
        var cursor = Cursor(bytes: block)
        var fields: [(name: String, value: String)] = []
        while let first = cursor.peek() {
            if first & 0x80 != 0 {  // indexed field, §6.1
                guard let index = cursor.integer(prefixBits: 7), let field = entry(at: index) else {
                    return nil
                }
                fields.append(Self.text(field))
            } else if first & 0xc0 == 0x40 {  // literal with incremental indexing, §6.2.1
                guard let field = literal(&cursor, prefixBits: 6) else { return nil }
                insert(field)
                fields.append(Self.text(field))
            } else if first & 0xe0 == 0x20 {  // dynamic table size update, §6.3
                guard fields.isEmpty, let size = cursor.integer(prefixBits: 5), size <= tableSizeLimit
                else { return nil }
                maxTableSize = size
                evict(toFit: 0)
            } else {  // literal without indexing (§6.2.2) or never indexed (§6.2.3)
                guard let field = literal(&cursor, prefixBits: 4) else { return nil }
                fields.append(Self.text(field))
            }
        }
        return fields
    }

    /// A table entry by index (§2.3.3): static 1...61, then dynamic; nil if out of range.
    private func entry(at index: Int) -> (name: [UInt8], value: [UInt8])? {
        if (1...Self.staticTable.count).contains(index) {
            let field = Self.staticTable[index - 1]
            return (Array(field.name.utf8), Array(field.value.utf8))
        }
        let dynamicIndex = index - Self.staticTable.count - 1
        return entries.indices.contains(dynamicIndex) ? entries[dynamicIndex] : nil
    }

    /// A literal representation's name (indexed, or new when the index is 0) and value (§6.2).
    private func literal(_ cursor: inout Cursor, prefixBits: Int) -> (name: [UInt8], value: [UInt8])? {
        guard let nameIndex = cursor.integer(prefixBits: prefixBits) else { return nil }
        let name = nameIndex == 0 ? cursor.string() : entry(at: nameIndex)?.name
        guard let name, let value = cursor.string() else { return nil }
        return (name, value)
    }

    /// Adds a field to the front of the dynamic table, evicting from the end first (§4.4); a
    /// field larger than the whole table empties it and is not added.
    private mutating func insert(_ field: (name: [UInt8], value: [UInt8])) {
        let size = field.name.count + field.value.count + 32
        evict(toFit: size)
        guard size <= maxTableSize else { return }
        entries.insert(field, at: 0)
        tableSize += size
    }

    /// Evicts the oldest entries until `incoming` more octets fit the maximum size (§4.3, §4.4).
    private mutating func evict(toFit incoming: Int) {
        while tableSize + incoming > maxTableSize, let oldest = entries.popLast() {
            tableSize -= oldest.name.count + oldest.value.count + 32
        }
    }

    /// A field's octets as text; invalid UTF-8 becomes U+FFFD.
    private static func text(
        _ field: (name: [UInt8], value: [UInt8])
    ) -> (name: String, value: String) {
        (String(decoding: field.name, as: UTF8.self), String(decoding: field.value, as: UTF8.self))
    }

    /// Reads HPACK primitives from a field block, front to back.
    private struct Cursor {
        /// The whole block.
        let bytes: [UInt8]
        /// The next octet to read.
        var position = 0

        /// The next octet without consuming it, or nil at the end.
        func peek() -> UInt8? { position < bytes.count ? bytes[position] : nil }

        /// Consumes an integer with an N-bit prefix (§5.1); nil when truncated or past 2^35.
        mutating func integer(prefixBits: Int) -> Int? {
            guard let first = peek() else { return nil }
            position += 1
            let limit = (1 << prefixBits) - 1
            var value = Int(first) & limit
            guard value == limit else { return value }
            var shift = 0
            while let byte = peek(), shift <= 28 {
                position += 1
                value += Int(byte & 0x7f) << shift
                if byte & 0x80 == 0 { return value }
                shift += 7
            }
            return nil
        }

        /// Consumes a string literal (§5.2), Huffman-decoded when H is set; nil when truncated
        /// or badly coded.
        mutating func string() -> [UInt8]? {
            guard let first = peek(), let length = integer(prefixBits: 7),
                  length <= bytes.count - position else { return nil }
            let octets = Array(bytes[position..<(position + length)])
            position += length
            return first & 0x80 != 0 ? HPACKHuffman.decode(octets) : octets
        }
    }
}

/// The static Huffman code of RFC 7541 Appendix B, with an encoder and a decoder (§5.2).
enum HPACKHuffman: Sendable {
    /// Each symbol's code (right-aligned, the RFC's "code as hex" column) and bit length:
    /// octets 0...255, then EOS at 256. The comment on a row is its first symbol.
    static let codes: [(code: UInt32, length: Int)] = [
        (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),  // 0
        (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),  // 4
        (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),  // 8
        (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),  // 12
        (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),  // 16
        (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),  // 20
        (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),  // 24
        (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),  // 28
        (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),  // 32
        (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),  // 36
        (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),  // 40
        (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),  // 44
        (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),  // 48
        (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),  // 52
        (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),  // 56
        (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),  // 60
        (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),  // 64
        (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),  // 68
        (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),  // 72
        (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),  // 76
        (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),  // 80
        (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),  // 84
        (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),  // 88
        (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),  // 92
        (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),  // 96
        (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),  // 100
        (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),  // 104
        (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),  // 108
        (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),  // 112
        (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),  // 116
        (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),  // 120
        (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),  // 124
        (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),  // 128
        (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),  // 132
        (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),  // 136
        (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),  // 140
        (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),  // 144
        (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),  // 148
        (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),  // 152
        (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),  // 156
        (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),  // 160
        (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),  // 164
        (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),  // 168
        (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),  // 172
        (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),  // 176
        (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),  // 180
        (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),  // 184
        (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),  // 188
        (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),  // 192
        (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),  // 196
        (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),  // 200
        (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),  // 204
        (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),  // 208
        (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),  // 212
        (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),  // 216
        (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),  // 220
        (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),  // 224
        (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),  // 228
        (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),  // 232
        (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),  // 236
        (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),  // 240
        (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),  // 244
        (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),  // 248
        (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),  // 252
        (0x3fffffff, 30),  // 256
    ]

    /// The decoding tree: node `n`'s children are `tree[2n]` (bit 0) and `tree[2n + 1]` (bit 1).
    /// A positive child is a node index, a negative one the leaf of symbol `-child - 1`; node 0
    /// is the root. The code is complete (every bit string reaches a leaf), so no child is 0.
    private static let tree: [Int] = {
        var tree = [0, 0]
        for (symbol, entry) in codes.enumerated() {
            var node = 0
            for bitIndex in stride(from: entry.length - 1, through: 0, by: -1) {
                let slot = 2 * node + Int(entry.code >> UInt32(bitIndex) & 1)
                if bitIndex == 0 {
                    tree[slot] = -symbol - 1
                } else {
                    if tree[slot] == 0 {
                        tree[slot] = tree.count / 2
                        tree += [0, 0]
                    }
                    node = tree[slot]
                }
            }
        }
        return tree
    }()

    /// The octets of a Huffman-coded string (§5.2); nil when it holds EOS, or ends in padding
    /// longer than 7 bits or not made of EOS's leading 1 bits.
    static func decode(_ coded: [UInt8]) -> [UInt8]? {
        var octets: [UInt8] = []
        var node = 0
        var pendingBits = 0
        var pendingAllOnes = true
        for byte in coded {
            for shift in stride(from: 7, through: 0, by: -1) {
                let bit = Int(byte >> UInt8(shift) & 1)
                let child = tree[2 * node + bit]
                pendingBits += 1
                pendingAllOnes = pendingAllOnes && bit == 1
                guard child < 0 else {
                    node = child
                    continue
                }
                let symbol = -child - 1
                guard symbol < 256 else { return nil }
                octets.append(UInt8(symbol))
                node = 0
                pendingBits = 0
                pendingAllOnes = true
            }
        }
        return pendingBits <= 7 && pendingAllOnes ? octets : nil
    }

    /// `octets` Huffman-coded (§5.2), padded to a whole octet with EOS's leading 1 bits.
    static func encode(_ octets: [UInt8]) -> [UInt8] {
        var coded: [UInt8] = []
        var pending: UInt64 = 0
        var pendingBits = 0
        for octet in octets {
            let entry = codes[Int(octet)]
            pending = pending << entry.length | UInt64(entry.code)
            pendingBits += entry.length
            while pendingBits >= 8 {
                pendingBits -= 8
                coded.append(UInt8(truncatingIfNeeded: pending >> pendingBits))
            }
            pending &= (1 << pendingBits) - 1
        }
        if pendingBits > 0 {
            coded.append(UInt8(truncatingIfNeeded: pending << (8 - pendingBits)) | 0xff >> pendingBits)
        }
        return coded
    }
}
