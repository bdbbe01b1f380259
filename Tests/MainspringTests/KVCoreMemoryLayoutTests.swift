import Testing
@testable import KVCore
import MainspringTestSupport

/// The keyspace's compact layout: `SmallBytes` (15 bytes inline, else a heap array), the
/// 16-byte `KVValue`, the 40-byte slot, expiry times kept apart from the slots, and `KEYS`
/// told of new keys instead of reading an epoch in every slot.
@Suite("KVCore keyspace layout")
struct KVCoreMemoryLayoutTests {
    private func bytes(count: Int, from first: UInt8 = 0x61) -> [UInt8] {
        (0..<count).map { first &+ UInt8(truncatingIfNeeded: $0) }
    }

    @Test("the sizes the layout is built on: 16-byte strings and values, 20-byte entries, 40-byte slots")
    func sizes() {
        #expect(MemoryLayout<SmallBytes>.size == 16)
        #expect(MemoryLayout<SmallBytes?>.size == 16)
        #expect(MemoryLayout<KVValue>.size == 16)
        #expect(MemoryLayout<KeyEntry>.size == 20)
        #expect(MemoryLayout<KeyEntry?>.size == 20)
        #expect(MemoryLayout<ByteMap<KeyEntry>.Slot>.stride == 40)
        // The inline data is the first 15 bytes, the count the last (`inlineStorage` relies on it).
        #expect(MemoryLayout<SmallBytes.InlineStorage>.size == 16)
        #expect(MemoryLayout<SmallBytes.InlineStorage>.offset(of: \.count) == 15)
    }

    @Test("inline up to exactly 15 bytes, on the heap from 16; the same bytes, count and hash either way")
    func boundary() {
        #expect(SmallBytes.inlineCapacity == 15)
        for count in [0, 1, 7, 8, 14, 15, 16, 17, 100] {
            let raw = bytes(count: count)
            let small = SmallBytes(raw)
            #expect(small.isInline == (count <= 15), "count \(count)")
            #expect(small.count == count)
            #expect(small.array == raw)
            #expect(small.equals(raw))
            #expect(ByteHash.hash(small) == ByteHash.hash(raw))
            #expect(raw.withUnsafeBytes { SmallBytes($0) } == small)
            #expect(!small.equals(raw + [0]))
            if count > 0 {
                #expect(!small.equals(Array(raw.dropLast())))
                var changed = raw
                changed[count - 1] ^= 1
                #expect(!small.equals(changed) && SmallBytes(changed) != small)
            }
        }
        #expect(SmallBytes(bytes(count: 15)) != SmallBytes(bytes(count: 16)))
        #expect(SmallBytes.empty.isEmpty && SmallBytes.empty == SmallBytes([]))
    }

    @Test("binary-safe: NUL bytes and invalid UTF-8, inline and on the heap, as keys and values")
    func binary() {
        let inlineKey: [UInt8] = [0x00, 0xff, 0xc3, 0x28, 0x00, 0x80]
        let heapKey: [UInt8] = inlineKey + [0x00, 0xfe, 0xed, 0xfa, 0xce, 0x00, 0x00, 0xc0, 0xaf, 0x00, 0x01]
        let inlineValue: [UInt8] = [0xed, 0xa0, 0x80, 0x00]  // a UTF-16 surrogate in UTF-8, and a NUL
        let heapValue: [UInt8] = Array(repeating: 0, count: 20) + [0xff]
        #expect(SmallBytes(inlineKey).isInline && !SmallBytes(heapKey).isInline)
        // Equal up to a trailing NUL is not equal: the count is part of the value.
        #expect(SmallBytes([0x61]) != SmallBytes([0x61, 0x00]))
        #expect(SmallBytes([0x00]) != SmallBytes([]))

        let client = KVTestClient()
        for (key, value) in [(inlineKey, inlineValue), (heapKey, heapValue), (inlineKey + [1], heapValue),
                             (heapKey + [1], inlineValue)] {
            #expect(client.run([kvBytes("SET"), key, value]) == "+OK\r\n")
        }
        for (key, value) in [(inlineKey, inlineValue), (heapKey, heapValue), (inlineKey + [1], heapValue),
                             (heapKey + [1], inlineValue)] {
            var expected = kvBytes("$\(value.count)\r\n")
            expected += value + kvBytes("\r\n")
            var output: [UInt8] = []
            _ = client.core.execute([kvBytes("GET"), key], session: &client.session, into: &output)
            #expect(output == expected)
        }
        // KEYS * returns the binary keys byte for byte.
        var output: [UInt8] = []
        _ = client.core.execute([kvBytes("KEYS"), kvBytes("*")], session: &client.session, into: &output)
        for key in [inlineKey, heapKey] {
            var encoded = kvBytes("$\(key.count)\r\n")
            encoded += key + kvBytes("\r\n")
            #expect(output.firstRange(of: encoded) != nil)
        }
        #expect(client.run([kvBytes("DEL"), inlineKey, heapKey]) == ":2\r\n")
        #expect(client("DBSIZE") == ":2\r\n")
    }

    /// The value stored for `key`, from the keyspace itself.
    private func stored(_ client: KVTestClient, _ key: String) -> SmallBytes? {
        guard let slot = client.core.keyspace.find(kvBytes(key)) else { return nil }
        guard case .string(let bytes) = client.core.entry(at: slot).value else { return nil }
        return bytes
    }

    @Test("overwriting an inline value with a heap one and back; APPEND and INCR across the boundary")
    func overwrite() {
        let client = KVTestClient()
        let fifteen = String(repeating: "x", count: 15)
        let sixteen = String(repeating: "y", count: 16)
        client("SET", "k", fifteen)
        #expect(stored(client, "k")?.isInline == true)
        client("SET", "k", sixteen)
        #expect(stored(client, "k")?.isInline == false)
        #expect(client("GET", "k") == "$16\r\n\(sixteen)\r\n")
        client("SET", "k", "short")
        #expect(stored(client, "k")?.isInline == true)
        #expect(client("GET", "k") == "$5\r\nshort\r\n")
        #expect(client("GETSET", "k", sixteen) == "$5\r\nshort\r\n")
        #expect(stored(client, "k")?.isInline == false)
        client("MSET", "k", fifteen, "m", sixteen)
        #expect(stored(client, "k")?.isInline == true && stored(client, "m")?.isInline == false)

        // APPEND: 10 + 5 = 15 stays inline, one more byte moves it to the heap, and it grows there.
        client("SET", "a", "0123456789")
        #expect(client("APPEND", "a", "abcde") == ":15\r\n")
        #expect(stored(client, "a")?.isInline == true)
        #expect(client("APPEND", "a", "f") == ":16\r\n")
        #expect(stored(client, "a")?.isInline == false)
        #expect(client("APPEND", "a", "gh") == ":18\r\n")
        #expect(client("GET", "a") == "$18\r\n0123456789abcdefgh\r\n")
        #expect(client("APPEND", "new", "fresh") == ":5\r\n" && stored(client, "new")?.isInline == true)

        // INCR: counters stay inline up to 15 digits; Int64's extremes (19-20 bytes) go to the heap.
        #expect(client("INCR", "n") == ":1\r\n" && stored(client, "n")?.isInline == true)
        client("SET", "n", "99999999999999")  // 14 digits
        #expect(client("INCR", "n") == ":100000000000000\r\n" && stored(client, "n")?.isInline == true)
        #expect(client("INCR", "n") == ":100000000000001\r\n")
        client("SET", "n", "999999999999999")  // 15 digits, inline
        #expect(client("INCR", "n") == ":1000000000000000\r\n" && stored(client, "n")?.isInline == false)
        #expect(client("GET", "n") == "$16\r\n1000000000000000\r\n")
        #expect(client("DECRBY", "n", "1000000000000001") == ":-1\r\n" && stored(client, "n")?.isInline == true)
        client("SET", "n", "-9223372036854775807")
        #expect(client("DECR", "n") == ":-9223372036854775808\r\n")
        #expect(client("GET", "n") == "$20\r\n-9223372036854775808\r\n")
        #expect(client("DECR", "n") == "-ERR increment or decrement would overflow\r\n")
        #expect(client("STRLEN", "n") == ":20\r\n")
        #expect(SmallBytes.decimal(0).array == kvBytes("0") && SmallBytes.decimal(-42).array == kvBytes("-42"))
        #expect(SmallBytes.decimal(Int64.max).array == kvBytes("\(Int64.max)"))
    }

    @Test("expiry lives beside the slots: TTLs stay right as keys with TTLs come and go")
    func expiry() {
        let client = KVTestClient()
        for i in 0..<100 { client("SET", "k\(i)", "v\(i)", "PX", "\(10_000 + i)") }
        #expect(client.core.expiringKeyCount == 100)
        // Deleting, persisting and overwriting some moves others in the list of keys with a TTL.
        for i in stride(from: 0, to: 100, by: 3) { client("DEL", "k\(i)") }
        for i in stride(from: 1, to: 100, by: 3) { client("PERSIST", "k\(i)") }
        client("SET", "k2", "overwritten")  // drops the TTL
        client("SET", "k5", "kept", "KEEPTTL")
        for i in 0..<100 {
            let expected: String
            if i % 3 == 0 {
                expected = ":-2\r\n"
            } else if i % 3 == 1 || i == 2 {
                expected = ":-1\r\n"
            } else {
                expected = ":\(10_000 + i)\r\n"
            }
            #expect(client("PTTL", "k\(i)") == expected, "k\(i)")
        }
        #expect(client.core.expiringKeyCount == 32)
        for record in client.core.expiring {  // every record points at a key that knows its place
            let position = client.core.entry(at: Int(record.slot)).expiryPosition
            #expect(position >= 0 && client.core.expiring[Int(position)].slot == record.slot)
        }
        client("EXPIRE", "k5", "5")
        #expect(client("PTTL", "k5") == ":5000\r\n")
        client.clock.now += 5_001
        #expect(client("GET", "k5") == "$-1\r\n")  // lazy expiry
        #expect(client("GET", "k4") == "$2\r\nv4\r\n")
        client.clock.now += 10_000
        let cycle = client.core.activeExpireCycle(budget: 1_000)
        #expect(cycle.expired == 31 && client.core.expiringKeyCount == 0)
        #expect(client("DBSIZE") == ":34\r\n")
    }

    @Test("DEL and FLUSHALL free what the keys held: the slots, and the boxed collections")
    func freeing() {
        let client = KVTestClient()
        client("SET", "inline", "v")
        client("SET", "heap", String(repeating: "h", count: 100))
        client("RPUSH", "list", "a", "b")
        client("HSET", "hash", "f", "v")
        client("SADD", "set", "m")
        weak var listBox: CollectionBox<ListValue>?
        weak var hashBox: CollectionBox<ByteMap<[UInt8]>>?
        do {
            guard case .list(let list) = client.core.entry(at: client.core.keyspace.find(kvBytes("list"))!).value,
                  case .hash(let hash) = client.core.entry(at: client.core.keyspace.find(kvBytes("hash"))!).value
            else {
                Issue.record("not a list and a hash")
                return
            }
            listBox = list
            hashBox = hash
        }
        #expect(listBox != nil && hashBox != nil)
        #expect(client("DEL", "list", "inline", "heap") == ":3\r\n")
        #expect(listBox == nil)  // a small value is freed at once
        #expect(client.core.keyspace.count == 2)
        client("FLUSHALL")
        #expect(client.core.keyspace.count == 0 && client.core.keyspace.slotCount == 0)
        #expect(client.core.hasPendingReclamation)
        while !client.core.reclaim(budget: 1) {}
        #expect(hashBox == nil)  // the old keyspace went, a slot at a time
        // Freed slots: the array keeps only up to the highest live slot.
        for i in 0..<10 { client("SET", "k\(i)", "v") }
        for i in 0..<10 { client("DEL", "k\(9 - i)") }
        #expect(client.core.keyspace.slotCount == 0)
    }

    @Test("a list value copied and then changed: the copy keeps the old contents; unshared, the box changes in place")
    func boxesAreValues() {
        func box(_ value: KVValue) -> ObjectIdentifier? {
            if case .list(let box) = value { return ObjectIdentifier(box) }
            return nil
        }
        func count(_ value: KVValue) -> Int {
            if case .list(let box) = value { return box.collection.count }
            return -1
        }
        var list = ListValue()
        list.pushBack(kvBytes("a"))
        var value = KVValue.list(CollectionBox(list))
        let copy = value
        _ = value.withList { $0.pushBack(kvBytes("b")) }
        #expect(count(value) == 2 && count(copy) == 1)
        #expect(box(value) != box(copy))
        let before = box(value)
        _ = value.withList { $0.pushBack(kvBytes("c")) }
        #expect(box(value) == before && count(value) == 3)
        #expect(count(copy) == 1)
    }

    @Test("KEYS skips a key created in a slot freed ahead of its cursor, and forgets a scan dropped unfinished")
    func keysCreatedAhead() {
        let client = KVTestClient()
        for i in 0..<3000 { client("SET", "old:\(i)", "v") }
        var output: [UInt8] = []
        guard case .sliced(var reply) = client.core.execute([kvBytes("KEYS"), kvBytes("*")],
                                                           session: &client.session, into: &output) else {
            Issue.record("KEYS was not sliced")
            return
        }
        #expect(client.core.keysScans.count == 1)
        #expect(!reply.step(budget: 1000, into: &output))  // slots 0..<1000 scanned
        // Free slots ahead of the cursor and behind it; new keys take the lowest free ones.
        client("DEL", "old:10", "old:2000", "old:2500")
        client("SET", "new:behind", "v")  // slot 10: behind the cursor, never scanned again
        client("SET", "new:ahead1", "v")  // slot 2000
        client("SET", "new:ahead2", "v")  // slot 2500
        client("DEL", "new:ahead2")
        client("SET", "new:ahead3", "v")  // slot 2500 again
        client("SET", "old:2000", "again")  // deleted and created anew: a new key, not reported
        client("SET", "new:end", "v")  // past the end of the scan
        while !reply.step(budget: 1000, into: &output) {}
        let text = kvText(output)
        #expect(!text.contains("new:"))
        #expect(!text.contains("old:2000\r") && !text.contains("old:2500\r"))
        #expect(text.contains("old:10\r"))  // reached before it was deleted
        #expect(text.hasPrefix("*2998\r\n"))
        #expect(client.core.keysScans.isEmpty)  // finished: no longer told of insertions

        // A scan whose reply is dropped before its end (its client went away) is forgotten.
        do {
            var output: [UInt8] = []
            guard case .sliced(var dropped) = client.core.execute([kvBytes("KEYS"), kvBytes("*")],
                                                                 session: &client.session, into: &output) else {
                Issue.record("KEYS was not sliced")
                return
            }
            _ = dropped.step(budget: 10, into: &output)
        }
        #expect(client.core.keysScans.count == 1)
        client("SET", "after:drop", "v")
        #expect(client.core.keysScans.isEmpty)
    }
}
