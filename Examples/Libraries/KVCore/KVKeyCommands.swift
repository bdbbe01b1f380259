extension KVCore {
    func keys(_ a: [[UInt8]], _ output: inout [UInt8]) -> KVExecution {
        var scan = KVSlicedReply.KeysScan(
            pattern: GlobPattern(a[1]), generation: keyspaceGeneration,
            progress: KeysScanProgress(end: keyspace.slotCount))
        if keyspace.slotCount < configuration.slicingThreshold {
            _ = continueKeys(&scan, budget: Int.max / 2)
            RESP.appendArrayHeader(scan.count, to: &output)
            for piece in scan.pieces { output.append(contentsOf: piece) }
            output.append(contentsOf: scan.matches)
            return .replied
        }
        keysScans.append(WeakKeysScan(progress: scan.progress))
        return .sliced(KVSlicedReply(core: self, kind: .keys(scan)))
    }

    func scan(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard let cursor = a[1].first == UInt8(ascii: " ") || a[1].first == 9 ? nil : RedisInteger.parseCursor(a[1]) else {
            RESP.appendError("ERR invalid cursor", to: &output)
            return
        }
        var count = 10
        var pattern: GlobPattern?
        var type: [UInt8]?
        var index = 2
        while index < a.count {
            let remaining = a.count - index - 1
            if Self.equalsIgnoringCase(a[index], "count") && remaining >= 1 {
                guard let value = RedisInteger.parse(a[index + 1]) else {
                    replyNotInteger(&output)
                    return
                }
                if value < 1 {
                    replySyntaxError(&output)
                    return
                }
                count = Int(min(value, Int64(Int32.max)))
            } else if Self.equalsIgnoringCase(a[index], "match") && remaining >= 1 {
                let candidate = GlobPattern(a[index + 1])
                pattern = candidate.matchesEverything ? nil : candidate
            } else if Self.equalsIgnoringCase(a[index], "type") && remaining >= 1 {
                type = a[index + 1].map { $0 >= 0x41 && $0 <= 0x5a ? $0 | 0x20 : $0 }
            } else {
                replySyntaxError(&output)
                return
            }
            index += 2
        }
        var slot = cursor > UInt64(Int.max) ? Int.max : Int(cursor)
        var found: [[UInt8]] = []
        var visitedOccupied = 0
        var visited = 0
        let time = now
        // Looks at `count` occupied slots (and at most ten times as many slots in all).
        while slot < keyspace.slotCount && visitedOccupied < count && visited < count * 10 {
            let current = slot
            slot += 1
            visited += 1
            guard let entry = keyspace.value(at: current) else { continue }
            visitedOccupied += 1
            if entry.hasExpiry && time > expiring[Int(entry.expiryPosition)].expireAt {
                deleteExpired(slot: current)
                continue
            }
            let key = keyspace.key(at: current)
            if let pattern, !pattern.matches(key) { continue }
            if let type, !type.elementsEqual(String(describing: entry.value.typeName).utf8) { continue }
            found.append(key.array)
        }
        let next = slot >= keyspace.slotCount ? 0 : slot
        RESP.appendArrayHeader(2, to: &output)
        RESP.appendBulkString(RedisInteger.bytes(Int64(next)), to: &output)
        RESP.appendArray(of: found, to: &output)
    }

    func expire(_ a: [[UInt8]], milliseconds: Bool, _ output: inout [UInt8]) {
        var nx = false, xx = false, gt = false, lt = false
        for option in a.dropFirst(3) {
            if Self.equalsIgnoringCase(option, "nx") {
                nx = true
            } else if Self.equalsIgnoringCase(option, "xx") {
                xx = true
            } else if Self.equalsIgnoringCase(option, "gt") {
                gt = true
            } else if Self.equalsIgnoringCase(option, "lt") {
                lt = true
            } else {
                replyError(Array("ERR Unsupported option ".utf8), Self.cBytes(option), into: &output)
                return
            }
        }
        if (nx && xx) || (nx && (gt || lt)) {
            RESP.appendError("ERR NX and XX, GT or LT options at the same time are not compatible", to: &output)
            return
        }
        if gt && lt {
            RESP.appendError("ERR GT and LT options at the same time are not compatible", to: &output)
            return
        }
        guard var when = integerArgument(a[2], &output) else { return }
        let name = milliseconds ? "pexpire" : "expire"
        if !milliseconds {
            if when > Int64.max / 1000 || when < Int64.min / 1000 {
                RESP.appendError("ERR invalid expire time in '\(name)' command", to: &output)
                return
            }
            when *= 1000
        }
        if when > Int64.max - now {
            RESP.appendError("ERR invalid expire time in '\(name)' command", to: &output)
            return
        }
        when += now
        guard let slot = liveSlot(a[1]) else {
            RESP.appendInteger(0, to: &output)
            return
        }
        let current = expireAt(slot: slot)  // -1: none
        if (nx && current != KeyEntry.persistent) || (xx && current == KeyEntry.persistent)
            || (gt && (current == KeyEntry.persistent || when <= current))
            || (lt && current != KeyEntry.persistent && when >= current)
        {
            RESP.appendInteger(0, to: &output)
            return
        }
        if when <= now {
            deleteKey(slot: slot)
        } else {
            setExpiry(slot: slot, at: when)
        }
        RESP.appendInteger(1, to: &output)
    }

    func ttl(_ key: [UInt8], milliseconds: Bool, _ output: inout [UInt8]) {
        guard let slot = readSlot(key) else {
            RESP.appendInteger(-2, to: &output)
            return
        }
        let expireAt = expireAt(slot: slot)
        if expireAt == KeyEntry.persistent {
            RESP.appendInteger(-1, to: &output)
            return
        }
        let remaining = max(expireAt - now, 0)
        RESP.appendInteger(milliseconds ? remaining : (remaining + 500) / 1000, to: &output)
    }
}
