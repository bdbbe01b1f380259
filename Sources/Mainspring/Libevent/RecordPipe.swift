internal import CLibevent
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

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
    /// `F_SETPIPE_SZ` (Linux; hidden behind `_GNU_SOURCE` in glibc's headers).
    private static let setPipeSize: Int32 = 1031

    init() throws(EventLoopError) {
        var fds: [Int32] = [-1, -1]
        guard ms_pipe2(&fds, Int32(O_CLOEXEC | O_NONBLOCK)) == 0 else {
            throw .system(function: "pipe2", errno: errno)
        }
        guard let stop = Optional(eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))), stop >= 0 else {
            let e = errno
            Glibc.close(fds[0])
            Glibc.close(fds[1])
            throw .system(function: "eventfd", errno: e)
        }
        readFD = fds[0]
        writeFD = fds[1]
        stopFD = stop
        // Room for 64 K records (best effort: the default 64 KB holds 4 K), so that a loop busy
        // for a while does not make the writer wait.
        _ = fcntl(writeFD, Self.setPipeSize, Int32(1 << 20))
    }

    deinit {
        closeRead()
        closeWrite()
        Glibc.close(stopFD)
    }

    // MARK: Writer thread

    /// Prepares the calling thread to be the writer: a 1 ns timer slack (so that a 100 µs pattern
    /// is kept to the microsecond) and `SIGPIPE` blocked (a write after the reader left fails
    /// with `EPIPE` instead of killing the process).
    func prepareWriterThread() {
        _ = ms_set_timer_slack(1)
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &set, nil)
    }

    /// Asks the writer to stop: wakes it from `sleep` or a wait for room. Any thread.
    func requestStop() {
        stopped.store(true, ordering: .releasing)
        var one: UInt64 = 1
        while Glibc.write(stopFD, &one, 8) < 0 && errno == EINTR {}
    }

    var isStopRequested: Bool { stopped.load(ordering: .acquiring) }

    /// Sleeps until `deadline` (`monotonicNanoseconds()` scale). Returns false when a stop was
    /// requested first. Waits longer than 2 ms watch the stop eventfd (`poll`, ms resolution);
    /// the last stretch is a precise `clock_nanosleep` (with the 1 ns slack: to the microsecond).
    func sleep(until deadline: UInt64) -> Bool {
        while !isStopRequested {
            let now = monotonicNanoseconds()
            if now >= deadline { return true }
            let remaining = deadline - now
            if remaining > 2_000_000 {
                if waitForStop(events: nil, timeoutMilliseconds: Int32(clamping: (remaining - 1_000_000) / 1_000_000)) {
                    return false
                }
            } else {
                var ts = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
                _ = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nil)
            }
        }
        return false
    }

    /// Writes one record. Returns false when the reader is gone, a stop was requested while the
    /// pipe was full, or the write failed.
    func write(_ record: InputRecord) -> Bool {
        var bytes = (record.sequence, record.stamp)
        while true {
            let n = withUnsafeBytes(of: &bytes) { Glibc.write(writeFD, $0.baseAddress, InputRecord.size) }
            if n == InputRecord.size { return true }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                // Full: wait for room or a stop.
                if waitForStop(events: (writeFD, Int16(POLLOUT)), timeoutMilliseconds: -1) { return false }
                continue
            }
            return false  // EPIPE (reader gone) or another failure
        }
    }

    /// Closes the write end: the reader then sees end of file. Idempotent.
    func closeWrite() {
        if !writeClosed.exchange(true, ordering: .acquiringAndReleasing) { Glibc.close(writeFD) }
    }

    /// Waits on the stop eventfd (and `events` on another fd), `timeoutMilliseconds` at most
    /// (-1: no limit). Returns true when a stop was requested.
    private func waitForStop(events: (Int32, Int16)?, timeoutMilliseconds: Int32) -> Bool {
        var fds = [pollfd(fd: stopFD, events: Int16(POLLIN), revents: 0)]
        if let (fd, wanted) = events { fds.append(pollfd(fd: fd, events: wanted, revents: 0)) }
        _ = poll(&fds, nfds_t(fds.count), timeoutMilliseconds)
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
        while true {
            let n = buffer.bytes.withUnsafeMutableBytes { raw -> Int in
                Glibc.read(readFD, raw.baseAddress! + buffer.carried, raw.count - buffer.carried)
            }
            if n > 0 {
                buffer.decode(newBytes: n)
                return .records(buffer.records.count)
            }
            if n == 0 { return .endOfFile }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            return .failure(e)
        }
    }

    /// Closes the read end. Idempotent.
    func closeRead() {
        if !readClosed.exchange(true, ordering: .acquiringAndReleasing) { Glibc.close(readFD) }
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
        bytes.withUnsafeBytes { raw in
            for i in 0..<whole {
                let offset = i * InputRecord.size
                records.append(InputRecord(
                    sequence: raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self),
                    stamp: raw.loadUnaligned(fromByteOffset: offset + 8, as: UInt64.self)))
            }
        }
        let rest = available - whole * InputRecord.size
        if rest > 0 {
            for i in 0..<rest { bytes[i] = bytes[whole * InputRecord.size + i] }
        }
        carried = rest
    }
}
