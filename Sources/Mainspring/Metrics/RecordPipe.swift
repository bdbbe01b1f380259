import Synchronization

/// One simulated input event on the wire: its sequence number and when it was written
/// (`CLOCK_MONOTONIC` ns, `monotonicNanoseconds()`). 16 bytes: well under `PIPE_BUF`, so a
/// record is written and read whole.
struct InputRecord: Sendable {
    var sequence: UInt64
    var stamp: UInt64
    static let size = 16
}

/// The pipe between an `InputSimulator`'s writer thread and its loop, and an eventfd that cuts
/// the writer's waits short when it is told to stop.
///
/// The writer side (`sleep`, `write`, `closeWrite`) belongs to the writer thread; the reader
/// side (`read`, `closeRead`) to the loop's thread. Each end is closed at most once (atomic
/// flags), and both are closed in `deinit` at the latest. Both ends are non-blocking, so
/// nothing here can hang a thread: a full pipe makes the writer wait for room *or* a stop.
final class RecordPipe: Sendable {
    let readFD: Int32
    private let writeFD: Int32
    private let stopFD: Int32
    private let readClosed = Atomic<Bool>(false)
    private let writeClosed = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)

    init() throws(EventLoopError) {
        let (readEnd, writeEnd) = try makeNonBlockingPipe()
        do {
            stopFD = try makeEventCounter()
        } catch {
            closeDescriptor(readEnd)
            closeDescriptor(writeEnd)
            throw error
        }
        readFD = readEnd
        writeFD = writeEnd
        // Room for 64 K records (best effort: the default 64 KB holds 4 K), so that a loop busy
        // for a while does not make the writer wait.
        setPipeCapacity(writeFD, bytes: 1 << 20)
    }

    deinit {
        closeRead()
        closeWrite()
        closeDescriptor(stopFD)
    }

    // MARK: Writer thread

    /// Prepares the calling thread to be the writer: a 1 ns timer slack (so that a 100 µs pattern
    /// is kept to the microsecond) and `SIGPIPE` blocked (a write after the reader left fails
    /// with `EPIPE` instead of killing the process).
    func prepareWriterThread() {
        setTimerSlack(nanoseconds: 1)
        blockBrokenPipeSignalInCurrentThread()
    }

    /// Asks the writer to stop: wakes it from `sleep` or a wait for room. Any thread.
    func requestStop() {
        stopped.store(true, ordering: .releasing)
        incrementEventCounter(stopFD)
    }

    var isStopRequested: Bool { stopped.load(ordering: .acquiring) }

    /// Sleeps until `deadline` (`monotonicNanoseconds()` scale). Returns false when a stop was
    /// requested first. Waits longer than 2 ms watch the stop eventfd (`poll`, ms resolution);
    /// the last stretch is a precise `clock_nanosleep` (with the 1 ns slack: to the microsecond).
    func sleep(until deadline: UInt64) -> Bool {
        // Real time: the writer thread of a real pipe (a simulated loop's input simulator has
        // no pipe and no thread; it schedules on the loop's clock).
        while !isStopRequested {
            let now = monotonicNanoseconds()
            if now >= deadline { return true }
            let remaining = deadline - now
            if remaining > 2_000_000 {
                if waitForStop(events: nil, timeoutMilliseconds: Int32(clamping: (remaining - 1_000_000) / 1_000_000)) {
                    return false
                }
            } else {
                sleepUntil(monotonicNanoseconds: deadline)
            }
        }
        return false
    }

    /// Writes one record. Returns false when the reader is gone, a stop was requested while the
    /// pipe was full, or the write failed.
    func write(_ record: InputRecord) -> Bool {
        while true {
            switch writeOnce(writeFD, bytesOf: (record.sequence, record.stamp)) {
            case .bytes(let n):
                return n == InputRecord.size  // a record is below PIPE_BUF: written whole or not at all
            case .wouldBlock:
                // Full: wait for room or a stop.
                if waitForStop(events: (writeFD, pollWritable), timeoutMilliseconds: -1) { return false }
            case .failure:
                return false  // EPIPE (reader gone) or another failure
            }
        }
    }

    /// Closes the write end: the reader then sees end of file. Idempotent.
    func closeWrite() {
        if !writeClosed.exchange(true, ordering: .acquiringAndReleasing) { closeDescriptor(writeFD) }
    }

    /// Waits on the stop eventfd (and `events` on another fd), `timeoutMilliseconds` at most
    /// (-1: no limit). Returns true when a stop was requested.
    private func waitForStop(events: (fd: Int32, events: Int16)?, timeoutMilliseconds: Int32) -> Bool {
        waitForReadiness([(stopFD, pollReadable)] + (events.map { [$0] } ?? []), timeoutMilliseconds: timeoutMilliseconds)
        return isStopRequested
    }

    // MARK: Loop thread

    enum ReadResult {
        case records(Int)
        case wouldBlock
        case endOfFile
        case failure(Int32)
    }

    /// Reads whole records into `buffer` (at most its capacity), carrying a partial record over
    /// to the next call. Loop thread.
    func read(into buffer: inout RecordBuffer) -> ReadResult {
        switch readOnce(readFD, into: &buffer.bytes, from: buffer.carried) {
        case .bytes(0):
            return .endOfFile
        case .bytes(let n):
            buffer.decode(newBytes: n)
            return .records(buffer.records.count)
        case .wouldBlock:
            return .wouldBlock
        case .failure(let code):
            return .failure(code)
        }
    }

    /// Closes the read end. Idempotent.
    func closeRead() {
        if !readClosed.exchange(true, ordering: .acquiringAndReleasing) { closeDescriptor(readFD) }
    }
}

/// The reader's buffer: raw bytes from the pipe and the records decoded from them.
struct RecordBuffer {
    fileprivate var bytes: [UInt8]
    fileprivate var carried = 0
    /// The records of the last `read`.
    private(set) var records: [InputRecord] = []

    init(capacity: Int) {
        bytes = [UInt8](repeating: 0, count: max(1, capacity) * InputRecord.size)
        records.reserveCapacity(max(1, capacity))
    }

    fileprivate mutating func decode(newBytes: Int) {
        records.removeAll(keepingCapacity: true)
        let available = carried + newBytes
        let whole = available / InputRecord.size
        for i in 0..<whole {
            let offset = i * InputRecord.size
            records.append(InputRecord(
                sequence: loadUInt64(from: bytes, at: offset), stamp: loadUInt64(from: bytes, at: offset + 8)))
        }
        let rest = available - whole * InputRecord.size
        if rest > 0 {
            for i in 0..<rest { bytes[i] = bytes[whole * InputRecord.size + i] }
        }
        carried = rest
    }
}
