extension KVCore {
    /// `GET`'s reply for the key in `slot` (or nil); false when the key is not a string
    /// (WRONGTYPE replied).
    @inline(__always)
    @discardableResult
    func replyString(at slot: Int?, _ output: inout [UInt8]) -> Bool {
        guard let slot else {
            RESP.appendNullBulk(to: &output)
            return true
        }
        guard case .string(let bytes) = keyspace.slots[slot].value!.value else {
            replyWrongType(&output)
            return false
        }
        RESP.appendBulkString(bytes, to: &output)
        return true
    }

    func get(_ a: [[UInt8]], _ output: inout [UInt8]) {
        replyString(at: readSlot(a[1]), &output)
    }

    func set(_ a: [[UInt8]], _ output: inout [UInt8]) {
        var nx = false, xx = false, get = false, keepTTL = false
        var unit: (argument: [UInt8], seconds: Bool, absolute: Bool)?
        var index = 3
        while index < a.count {
            let option = a[index]
            let hasNext = index + 1 < a.count
            if Self.equalsIgnoringCase(option, "nx") && !xx {
                nx = true
            } else if Self.equalsIgnoringCase(option, "xx") && !nx {
                xx = true
            } else if Self.equalsIgnoringCase(option, "get") {
                get = true
            } else if Self.equalsIgnoringCase(option, "keepttl") && unit == nil {
                keepTTL = true
            } else if hasNext && !keepTTL, let kind = Self.expiryOption(option),
                unit == nil || (unit!.seconds == kind.seconds && unit!.absolute == kind.absolute)
            {
                unit = (a[index + 1], kind.seconds, kind.absolute)
                index += 1
            } else {
                replySyntaxError(&output)
                return
            }
            index += 1
        }
        var expireAt: Int64?
        if let unit {
            guard let value = RedisInteger.parse(unit.argument) else {
                replyNotInteger(&output)
                return
            }
            if value <= 0 || (unit.seconds && value > Int64.max / 1000) {
                RESP.appendError("ERR invalid expire time in 'set' command", to: &output)
                return
            }
            var milliseconds = unit.seconds ? value * 1000 : value
            if !unit.absolute {
                if milliseconds > Int64.max - now {
                    RESP.appendError("ERR invalid expire time in 'set' command", to: &output)
                    return
                }
                milliseconds += now
            }
            expireAt = milliseconds
        }
        let key = a[1]
        let existing = liveSlot(key)
        if get {
            guard replyString(at: existing, &output) else { return }
        }
        if (nx && existing != nil) || (xx && existing == nil) {
            if !get { RESP.appendNullBulk(to: &output) }
            return
        }
        let slot = store(key, .string(SmallBytes(a[2])), keepTTL: keepTTL)
        if let expireAt { setExpiry(slot: slot, at: expireAt) }
        if !get { RESP.appendOK(to: &output) }
    }

    /// `EX`, `PX`, `EXAT`, `PXAT`: whether in seconds and whether absolute.
    static func expiryOption(_ option: [UInt8]) -> (seconds: Bool, absolute: Bool)? {
        if equalsIgnoringCase(option, "ex") { return (true, false) }
        if equalsIgnoringCase(option, "px") { return (false, false) }
        if equalsIgnoringCase(option, "exat") { return (true, true) }
        if equalsIgnoringCase(option, "pxat") { return (false, true) }
        return nil
    }

    func getset(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard replyString(at: liveSlot(a[1]), &output) else { return }
        store(a[1], .string(SmallBytes(a[2])))
    }

    func mset(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard a.count % 2 == 1 else {
            replyArity("mset", into: &output)
            return
        }
        var index = 1
        while index < a.count {
            store(a[index], .string(SmallBytes(a[index + 1])))
            index += 2
        }
        RESP.appendOK(to: &output)
    }

    func mget(_ a: [[UInt8]], _ output: inout [UInt8]) {
        RESP.appendArrayHeader(a.count - 1, to: &output)
        for key in a.dropFirst() {
            if let slot = readSlot(key), case .string(let bytes) = entry(at: slot).value {
                RESP.appendBulkString(bytes, to: &output)
            } else {
                RESP.appendNullBulk(to: &output)
            }
        }
    }

    enum IncrementOutcome {
        case value(Int64)
        case wrongType
        case notInteger
        case overflow
    }

    func incrementBy(_ key: [UInt8], _ delta: Int64, _ output: inout [UInt8]) {
        let hash = ByteHash.hash(key)
        guard let slot = liveSlot(key, hash: hash) else {
            insertKey(key, hash: hash, value: .string(SmallBytes.decimal(delta)))
            RESP.appendInteger(delta, to: &output)
            return
        }
        let outcome = modifyValue(at: slot) { value -> IncrementOutcome in
            guard case .string(let bytes) = value else { return .wrongType }
            guard let old = bytes.withUnsafeBufferPointer({ RedisInteger.parse($0) }) else { return .notInteger }
            let (sum, overflow) = old.addingReportingOverflow(delta)
            if overflow { return .overflow }
            value = .string(SmallBytes.decimal(sum))  // inline: no allocation for a counter
            return .value(sum)
        }
        switch outcome {
        case .value(let sum): RESP.appendInteger(sum, to: &output)
        case .wrongType: replyWrongType(&output)
        case .notInteger: replyNotInteger(&output)
        case .overflow: RESP.appendError("ERR increment or decrement would overflow", to: &output)
        }
    }

    func append(_ a: [[UInt8]], _ output: inout [UInt8]) {
        let key = a[1]
        let hash = ByteHash.hash(key)
        guard let slot = liveSlot(key, hash: hash) else {
            insertKey(key, hash: hash, value: .string(SmallBytes(a[2])))
            RESP.appendInteger(a[2].count, to: &output)
            return
        }
        let limit = configuration.protoMaxBulkLength
        let length = modifyValue(at: slot) { value -> Int? in
            guard case .string(var bytes) = value else { return nil }
            if bytes.count + a[2].count > limit { return -1 }
            value = .placeholder
            var array = bytes.takeArray()  // the only reference now: a heap string grows in place
            array.append(contentsOf: a[2])
            value = .string(SmallBytes(array))
            return array.count
        }
        switch length {
        case nil: replyWrongType(&output)
        case -1: RESP.appendError("ERR string exceeds maximum allowed size (proto-max-bulk-len)", to: &output)
        case let length?: RESP.appendInteger(length, to: &output)
        }
    }

    func strlen(_ a: [[UInt8]], _ output: inout [UInt8]) {
        guard let slot = readSlot(a[1]) else {
            RESP.appendInteger(0, to: &output)
            return
        }
        guard case .string(let bytes) = entry(at: slot).value else {
            replyWrongType(&output)
            return
        }
        RESP.appendInteger(bytes.count, to: &output)
    }
}
