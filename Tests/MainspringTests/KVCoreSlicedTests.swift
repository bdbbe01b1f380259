import Testing
import KVCore
import MainspringTestSupport

/// The keys in a `*N` array reply of bulk strings.
private func kvArray(_ reply: String) -> [String] {
    let parts = reply.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
    return stride(from: 2, to: parts.count - 1, by: 2).map { parts[$0] }
}

@Suite("KVCore sliced commands")
struct KVCoreSlicedTests {
    private func start(_ client: KVTestClient, _ words: String...) -> KVSlicedReply? {
        var output: [UInt8] = []
        if case .sliced(let reply) = client.core.execute(words.map { Array($0.utf8) }, session: &client.session, into: &output) {
            #expect(output.isEmpty)
            return reply
        }
        return nil
    }

    @Test("small values and keyspaces run inline; large ones become sliced replies")
    func threshold() {
        let client = KVTestClient()
        for i in 0..<999 { client("SET", "k\(i)", "v") }
        #expect(client.execute([kvBytes("KEYS"), kvBytes("*")]).sliced == false)
        client("SET", "k999", "v")
        #expect(client.execute([kvBytes("KEYS"), kvBytes("*")]).sliced)
        client.run([kvBytes("RPUSH"), kvBytes("l")] + (0..<1500).map { kvBytes("\($0)") })
        #expect(client.execute([kvBytes("LRANGE"), kvBytes("l"), kvBytes("0"), kvBytes("998")]).sliced == false)
        #expect(client.execute([kvBytes("LRANGE"), kvBytes("l"), kvBytes("0"), kvBytes("999")]).sliced)
    }

    @Test("KEYS while keys come and go between slices: keys present throughout appear exactly once, new ones never")
    func keysUnderMutation() {
        let client = KVTestClient()
        for i in 0..<5000 { client("SET", "stable:\(i)", "v") }
        for i in 0..<2000 { client("SET", "doomed:\(i)", "v") }
        var reply = start(client, "KEYS", "*")!
        var output: [UInt8] = []
        var step = 0
        while !reply.step(budget: 100, into: &output) {
            #expect(output.isEmpty)  // the array comes whole at the end
            // Other clients' commands between slices.
            for j in 0..<20 {
                let n = step * 20 + j
                client("SET", "new:\(n)", "v")  // created after KEYS began
                if n < 2000 { client("DEL", "doomed:\(n)") }
                client("SET", "stable:\(n % 5000)", "changed")  // overwriting keeps the key
            }
            step += 1
        }
        #expect(step > 10)
        let keys = kvArray(kvText(output))
        let stable = keys.filter { $0.hasPrefix("stable:") }
        #expect(stable.count == 5000 && Set(stable).count == 5000)
        #expect(!keys.contains { $0.hasPrefix("new:") })
        #expect(Set(keys).count == keys.count)  // no key twice
        #expect(reply.step(budget: 100, into: &output))  // finished stays finished
    }

    @Test("a KEYS reply of many kilobytes comes whole inline, and a few hundred KiB per step when sliced")
    func keysReplyInPieces() {
        let client = KVTestClient()
        let padding = String(repeating: "x", count: 300)
        // Inline (under the slicing threshold), ~300 KB of matches: every key, once.
        for i in 0..<900 { client("SET", "\(padding):\(i)", "v") }
        let inline = client.execute([kvBytes("KEYS"), kvBytes("*")])
        #expect(inline.sliced == false)
        #expect(inline.reply.hasPrefix("*900\r\n"))
        #expect(Set(kvArray(inline.reply)).count == 900)
        // Sliced, ~1.2 MB of matches: the scan yields nothing, then the array in bounded steps.
        for i in 900..<4000 { client("SET", "\(padding):\(i)", "v") }
        var reply = start(client, "KEYS", "*")!
        var output: [UInt8] = []
        var emitting = 0
        while true {
            let before = output.count
            let done = reply.step(budget: 500, into: &output)
            if output.count > before {
                emitting += 1
                #expect(output.count - before <= 300 * 1024)
            }
            if done { break }
        }
        #expect(emitting >= 4)
        let keys = kvArray(kvText(output))
        #expect(kvText(Array(output.prefix(7))) == "*4000\r\n")
        #expect(keys.count == 4000 && Set(keys).count == 4000)
    }

    @Test("KEYS across a FLUSHALL between slices reports no key created after the flush")
    func keysAcrossFlush() {
        let client = KVTestClient()
        for i in 0..<3000 { client("SET", "old:\(i)", "v") }
        var reply = start(client, "KEYS", "*")!
        var output: [UInt8] = []
        #expect(!reply.step(budget: 500, into: &output))
        client("FLUSHALL")
        client("SET", "after", "v")
        while !reply.step(budget: 500, into: &output) {}
        let keys = kvArray(kvText(output))
        #expect(!keys.contains("after") && keys.count <= 500 && Set(keys).count == keys.count)
    }

    @Test("FLUSHALL swaps the keyspace at once; a SET between reclaim slices survives")
    func flushThenSet() {
        let client = KVTestClient()
        for i in 0..<20_000 { client("SET", "k\(i)", "v") }
        client.run([kvBytes("RPUSH"), kvBytes("biglist")] + (0..<5000).map { kvBytes("\($0)") })
        #expect(client("FLUSHALL") == "+OK\r\n")
        #expect(client("DBSIZE") == ":0\r\n" && client("GET", "k1") == "$-1\r\n")
        #expect(client.core.hasPendingReclamation)
        var slices = 0
        while !client.core.reclaim(budget: 1000) {
            if slices == 3 { client("SET", "k1", "fresh") }
            slices += 1
        }
        #expect(slices >= 20)
        #expect(!client.core.hasPendingReclamation)
        #expect(client("GET", "k1") == "$5\r\nfresh\r\n" && client("DBSIZE") == ":1\r\n")
    }

    @Test("DEL of a big list: the key is gone at once, the value freed in slices; a new list under the key stays intact")
    func delThenPush() {
        let client = KVTestClient()
        client.run([kvBytes("RPUSH"), kvBytes("l")] + (0..<50_000).map { kvBytes("\($0)") })
        #expect(client("DEL", "l") == ":1\r\n")
        #expect(client("EXISTS", "l") == ":0\r\n" && client.core.hasPendingReclamation)
        var slices = 0
        while !client.core.reclaim(budget: 1000) {
            if slices == 2 { client("LPUSH", "l", "new") }
            slices += 1
        }
        #expect(slices >= 40)
        #expect(client("LRANGE", "l", "0", "-1") == "*1\r\n$3\r\nnew\r\n")
        client.run([kvBytes("SADD"), kvBytes("s")] + (0..<3000).map { kvBytes("\($0)") })
        client.run([kvBytes("HSET"), kvBytes("h")] + (0..<3000).flatMap { [kvBytes("f\($0)"), kvBytes("v")] })
        client("UNLINK", "s", "h")
        client("SET", "s", "string now")
        while !client.core.reclaim(budget: 100) {}
        #expect(client("GET", "s") == "$10\r\nstring now\r\n" && client("EXISTS", "h") == ":0\r\n")
    }

    @Test("overwriting or expiring a big value frees it in slices too")
    func overwriteAndExpiry() {
        let client = KVTestClient()
        client.run([kvBytes("RPUSH"), kvBytes("l")] + (0..<5000).map { kvBytes("\($0)") })
        client("SET", "l", "v")
        #expect(client.core.hasPendingReclamation)
        while !client.core.reclaim(budget: 500) {}
        client.run([kvBytes("SADD"), kvBytes("s")] + (0..<5000).map { kvBytes("\($0)") })
        client("PEXPIRE", "s", "10")
        client.clock.now += 11
        #expect(client("SCARD", "s") == ":0\r\n" && client.core.hasPendingReclamation)
        while !client.core.reclaim(budget: 500) {}
    }

    @Test("LRANGE of a big list replies with the list as it was when it began, whatever is written between slices")
    func lrangeSnapshot() {
        let client = KVTestClient()
        client.run([kvBytes("RPUSH"), kvBytes("l")] + (0..<3000).map { kvBytes("\($0)") })
        var reply = start(client, "LRANGE", "l", "0", "-1")!
        var output: [UInt8] = []
        var slices = 0
        while !reply.step(budget: 250, into: &output) {
            client("LPUSH", "l", "front\(slices)")
            client("RPOP", "l")
            if slices == 5 { client("DEL", "l") }
            slices += 1
        }
        #expect(slices == 11)
        #expect(kvArray(kvText(output)) == (0..<3000).map { "\($0)" })
        #expect(kvText(output).hasPrefix("*3000\r\n"))
        while !client.core.reclaim(budget: 1000) {}  // the snapshot was handed back for freeing
    }

    @Test("HGETALL and SMEMBERS of big values reply with the value as it was when they began")
    func hashAndSetSnapshots() {
        let client = KVTestClient()
        client.run([kvBytes("HSET"), kvBytes("h")] + (0..<2000).flatMap { [kvBytes("f\($0)"), kvBytes("v\($0)")] })
        client.run([kvBytes("SADD"), kvBytes("s")] + (0..<2000).map { kvBytes("m\($0)") })
        var hash = start(client, "HGETALL", "h")!
        var set = start(client, "SMEMBERS", "s")!
        var hashOutput: [UInt8] = []
        var setOutput: [UInt8] = []
        var round = 0
        var hashDone = false
        var setDone = false
        while !(hashDone && setDone) {
            if !hashDone { hashDone = hash.step(budget: 100, into: &hashOutput) }
            if !setDone { setDone = set.step(budget: 100, into: &setOutput) }
            client("HSET", "h", "f\(round)", "changed", "extra\(round)", "x")
            client("HDEL", "h", "f\(1999 - round)")
            client("SREM", "s", "m\(round)")
            client("SADD", "s", "new\(round)")
            round += 1
        }
        let pairs = kvArray(kvText(hashOutput))
        var map: [String: String] = [:]
        for i in stride(from: 0, to: pairs.count, by: 2) { map[pairs[i]] = pairs[i + 1] }
        #expect(pairs.count == 4000 && map.count == 2000)
        #expect(map == Dictionary(uniqueKeysWithValues: (0..<2000).map { ("f\($0)", "v\($0)") }))
        #expect(Set(kvArray(kvText(setOutput))) == Set((0..<2000).map { "m\($0)" }))
        #expect(client("HGET", "h", "f0") == "$7\r\nchanged\r\n")  // the writes themselves happened
        #expect(client("SISMEMBER", "s", "m0") == ":0\r\n")
    }

    @Test("active expiry removes a mass of expired keys in slices and says when more is left")
    func activeExpiry() {
        let client = KVTestClient()
        for i in 0..<100_000 { client("SET", "e\(i)", "v", "PX", "100") }
        for i in 0..<1000 { client("SET", "keep\(i)", "v", "EX", "1000") }
        for i in 0..<1000 { client("SET", "plain\(i)", "v") }
        #expect(client.core.expiringKeyCount == 101_000)
        let early = client.core.activeExpireCycle(budget: 1000)
        #expect(early.expired == 0 && !early.hasMore && early.checked == 20)  // a clean sample stops the cycle
        client.clock.now += 101
        var cycles = 0
        var expired = 0
        while true {
            let result = client.core.activeExpireCycle(budget: 1000)
            #expect(result.checked <= 1000)
            expired += result.expired
            cycles += 1
            if !result.hasMore { break }
        }
        #expect(cycles >= 100)
        #expect(expired >= 99_000)
        // The rest goes lazily or in later cycles; the survivors are all there.
        for _ in 0..<20 { client.core.activeExpireCycle(budget: 10_000) }
        #expect(client("DBSIZE") == ":2000\r\n")
        #expect(client.core.expiringKeyCount == 1000)
        #expect(client("INFO", "keyspace").contains("db0:keys=2000,expires=1000,avg_ttl="))
        #expect(client("INFO", "stats").contains("expired_keys:100000\r\n"))
    }

    @Test("a SCAN iteration reports every key that stays, exactly once, while others are added and deleted")
    func scanUnderMutation() {
        let client = KVTestClient()
        for i in 0..<3000 { client("SET", "stable:\(i)", "v") }
        var seen: [String] = []
        var cursor = "0"
        var n = 0
        repeat {
            let parts = client("SCAN", cursor, "COUNT", "50").split(separator: "\r\n").map(String.init)
            cursor = parts[2]
            seen += stride(from: 5, to: parts.count, by: 2).map { parts[$0] }
            for _ in 0..<30 {
                client("SET", "churn:\(n)", "v")
                client("DEL", "churn:\(n - 7)")
                n += 1
            }
        } while cursor != "0"
        let stable = seen.filter { $0.hasPrefix("stable:") }
        #expect(stable.count == 3000 && Set(stable).count == 3000)
    }
}
