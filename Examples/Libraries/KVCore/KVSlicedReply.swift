/// What `KVCore.execute` did with a command.
public enum KVExecution {
    /// The reply is in the output buffer.
    case replied
    /// The reply is in the output buffer; close the connection once it is written (`QUIT`).
    case close
    /// A command on large data: produce its reply by stepping the value (see `KVSlicedReply`).
    case sliced(KVSlicedReply)
}

/// The reply of a command on large data, produced a slice at a time.
///
/// Call `step(budget:into:)` until it returns true; each call appends part of the reply (or,
/// for `KEYS`, all of it at the end) and does at most about `budget` units of work: a key
/// scanned, or an element encoded. Between calls the server may run other clients' commands;
/// the client's own next commands wait, so replies stay in order. What the reply shows is
/// described on `KVCore` (*Consistency of sliced commands*): `KEYS` reports the keys that
/// existed when it began and still exist when reached; `LRANGE`, `HGETALL`, `SMEMBERS` show
/// the value as it was when the command began.
///
/// Not `Sendable`: it belongs to the core's thread.
public struct KVSlicedReply {
    enum Kind {
        case keys(KeysScan)
        case list(ListValue, next: Int, end: Int)
        case hash(ByteMap<[UInt8]>, cursor: Int)
        case set(ByteMap<Void>, cursor: Int)
        case finished
    }

    struct KeysScan {
        let pattern: GlobPattern
        let generation: UInt64
        /// The cursor, the end, and the slots given a new key ahead of the cursor since the
        /// scan began (the core records those: `KVCore.noteInsertion`).
        let progress: KeysScanProgress
        /// The matches' encoded bulk strings, in pieces of about `pieceSize` bytes (so that no
        /// step copies the whole reply or grows one huge buffer), and the piece being filled.
        var pieces: [[UInt8]] = []
        var matches: [UInt8] = []
        var count = 0
        /// After the scan: the next piece to append to the output.
        var emitting = false
        var nextPiece = 0

        static let pieceSize = 64 * 1024

        /// Moves the piece being filled to `pieces` once it is full (or at the end).
        mutating func sealPiece(force: Bool = false) {
            guard matches.count >= Self.pieceSize || (force && !matches.isEmpty) else { return }
            pieces.append(matches)
            matches = []
            if !force { matches.reserveCapacity(Self.pieceSize + 256) }
        }
    }

    let core: KVCore
    var kind: Kind
    var started = false

    init(core: KVCore, kind: Kind) {
        self.core = core
        self.kind = kind
    }

    /// Whether the reply is complete.
    public var isFinished: Bool {
        if case .finished = kind { return true }
        return false
    }

    /// Appends the next part of the reply, doing at most about `budget` units of work; returns
    /// true when the reply is complete (later calls do nothing and return true).
    public mutating func step(budget: Int, into output: inout [UInt8]) -> Bool {
        let budget = max(budget, 1)
        var current = Kind.finished
        swap(&current, &kind)  // work on the state with no second reference to the snapshot
        defer { swap(&current, &kind) }
        switch current {
        case .finished:
            return true
        case .keys(var scan):
            current = .finished
            if !scan.emitting {
                guard core.continueKeys(&scan, budget: budget) else {
                    current = .keys(scan)
                    return false
                }
                // The scan is over: the header, then the matches a few pieces per step.
                scan.sealPiece(force: true)
                scan.emitting = true
                RESP.appendArrayHeader(scan.count, to: &output)
            }
            var bytes = 0
            while scan.nextPiece < scan.pieces.count && bytes < 4 * KeysScan.pieceSize {
                output.append(contentsOf: scan.pieces[scan.nextPiece])
                bytes += scan.pieces[scan.nextPiece].count
                scan.pieces[scan.nextPiece] = []
                scan.nextPiece += 1
            }
            if scan.nextPiece == scan.pieces.count { return true }
            current = .keys(scan)
            return false
        case .list(let list, var next, let end):
            if !started {
                started = true
                RESP.appendArrayHeader(end - next, to: &output)
            }
            let stop = min(end, next + budget)
            while next < stop {
                RESP.appendBulkString(list[next], to: &output)
                next += 1
            }
            if next == end {
                current = .finished
                core.reclaimer.add(list: list)
                return true
            }
            current = .list(list, next: next, end: end)
            return false
        case .hash(let map, var cursor):
            if !started {
                started = true
                RESP.appendArrayHeader(map.count * 2, to: &output)
            }
            var work = 0
            let slots = map.slotCount
            while cursor < slots && work < budget {
                if let value = map.value(at: cursor) {
                    RESP.appendBulkString(map.key(at: cursor), to: &output)
                    RESP.appendBulkString(value, to: &output)
                }
                cursor += 1
                work += 1
            }
            if cursor >= slots {
                current = .finished
                core.reclaimer.add(hash: map)
                return true
            }
            current = .hash(map, cursor: cursor)
            return false
        case .set(let map, var cursor):
            if !started {
                started = true
                RESP.appendArrayHeader(map.count, to: &output)
            }
            var work = 0
            let slots = map.slotCount
            while cursor < slots && work < budget {
                if map.isOccupied(cursor) {
                    RESP.appendBulkString(map.key(at: cursor), to: &output)
                }
                cursor += 1
                work += 1
            }
            if cursor >= slots {
                current = .finished
                core.reclaimer.add(set: map)
                return true
            }
            current = .set(map, cursor: cursor)
            return false
        }
    }

    /// Runs the reply to its end at once.
    public mutating func finish(into output: inout [UInt8]) {
        while !step(budget: Int.max / 2, into: &output) {}
    }
}

extension KVCore {
    /// Scans up to `budget` slots of a sliced `KEYS`; true when done.
    func continueKeys(_ scan: inout KVSlicedReply.KeysScan, budget: Int) -> Bool {
        let progress = scan.progress
        if scan.generation != keyspaceGeneration {  // flushed: no old key is left
            endKeysScan(progress)
            return true
        }
        cachedNow = nil
        let time = now
        let end = min(progress.end, keyspace.slotCount)
        var cursor = progress.cursor
        let stop = min(end, cursor &+ budget)
        let slots = keyspace.slots
        let expiring = self.expiring
        let checksCreated = !progress.createdAhead.isEmpty
        while cursor < stop {
            let slot = cursor
            cursor += 1
            // Created after the scan began (into a slot freed ahead of the cursor): not reported.
            let created = checksCreated && progress.createdAhead.remove(slot) != nil
            guard !created, let entry = slots[slot].value else { continue }
            if entry.hasExpiry && time > expiring[Int(entry.expiryPosition)].expireAt { continue }
            let key = slots[slot].key
            if scan.pattern.matches(key) {
                RESP.appendBulkString(key, to: &scan.matches)
                scan.count += 1
                scan.sealPiece()
            }
        }
        progress.cursor = cursor
        if cursor >= end {
            endKeysScan(progress)
            return true
        }
        return false
    }
}
