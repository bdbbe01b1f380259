import Foundation
import Synchronization

/// Simulated input with real file descriptors, to measure how responsive a loop stays.
///
/// A writer thread writes timestamped records into a pipe following a `Pattern`; the loop reads
/// them as an ordinary `.input` fd watcher. For every record, the latency from the write to the
/// start of its handling goes into `latencies` (both ends read `CLOCK_MONOTONIC`). An optional
/// `handlingCost` busy-waits per record, to simulate a handler that does real work.
///
/// ```swift
/// let input = try InputSimulator(loop: loop, pattern: .steady(every: .milliseconds(10)), count: 200)
/// input.start()
/// loop.spin(until: { input.isFinished })
/// print(input.latencies.percentile(0.99))
/// ```
///
/// ## Threads
/// Loop-bound: create, start, stop and read it on the loop's thread. The writer thread is its
/// own; it stops after `count` records, on `stop()`, or when the simulator is released.
///
/// ## What it measures (and what not)
/// A handler reads every record that is waiting (up to 256 at a time) and handles them one after
/// the other, so a record's latency includes the handling of the records before it in the same
/// read: as with any real input. The writer's lateness against its pattern (scheduling on a busy
/// machine) is not counted: a record is stamped just before it is written (a writer preempted
/// between the two does add that delay to its record's latency).
public final class InputSimulator {
    /// When records are written.
    /// The durations are periods: zero or negative stops the program when the simulator is made
    /// (see <doc:Durations>).
    public enum Pattern: Sendable, Hashable {
        /// One record every `every`, on a fixed grid (a late write does not shift the next one).
        case steady(every: Duration)
        /// Records at random, exponentially distributed intervals: `ratePerSecond` on average.
        case poisson(ratePerSecond: Double)
        /// `count` records back to back, every `every`.
        case burst(count: Int, every: Duration)
    }

    /// One handled record, as reported to `onEvent`.
    public struct Event: Sendable, Hashable {
        /// The record's number: 0, 1, 2, … in the order they were written.
        public let sequence: Int
        /// From its write to the start of its handling.
        public let latency: Duration
    }

    /// The loop that reads the records.
    public let loop: EventLoop
    /// When records are written.
    public let pattern: Pattern
    /// How many records to write; `nil` means until `stop()`.
    public let count: Int?
    /// Busy time spent handling each record.
    public let handlingCost: Duration

    private let pipe: RecordPipe
    private let writer: Writer
    private let reader: Reader
    private var hasStarted = false

    /// Creates the pipe and the loop's watcher; nothing is written until `start()`.
    ///
    /// Must be called on the loop's thread.
    /// - Parameters:
    ///   - loop: the loop that reads the records, as `.input`.
    ///   - pattern: when the writer thread writes records.
    ///   - count: records to write (negative counts as zero); `nil` for no limit.
    ///   - handlingCost: CPU time (busy-waited) spent on each record in the handler.
    ///   - onEvent: called on the loop for each record, after its handling cost.
    /// - Throws: `EventLoopError.wrongThread` off the loop's thread; `.system` when the pipe
    ///   cannot be made (out of file descriptors).
    public init(loop: EventLoop, pattern: Pattern, count: Int? = nil, handlingCost: Duration = .zero,
                onEvent: ((Event) -> Void)? = nil) throws(EventLoopError)
    {
        switch pattern {
        case .steady(let every): _ = requirePositive(every, "InputSimulator.Pattern.steady(every:)")
        case .burst(_, let every): _ = requirePositive(every, "InputSimulator.Pattern.burst(count:every:)'s every")
        case .poisson(let rate):
            requireUsage(rate.isFinite && rate > 0, "Mainspring: InputSimulator.Pattern.poisson(ratePerSecond:) must be positive and finite, not \(rate)")
        }
        self.loop = loop
        self.pattern = pattern
        self.count = count.map { max(0, $0) }
        self.handlingCost = handlingCost
        pipe = try RecordPipe()
        writer = Writer(pipe: pipe, pattern: pattern, count: self.count)
        reader = Reader(pipe: pipe, cost: handlingCost.clampedNanoseconds, onEvent: onEvent)
        let reader = self.reader
        let pipe = self.pipe
        reader.watcher = try loop.watch(pipe.readFD, for: .read, priority: .input) { _ in reader.readAvailable() }
    }

    deinit {
        // The writer stops and closes its end; the reader then sees end of file and closes the
        // watcher and its end (when the loop runs again).
        writer.pipe.requestStop()
        if !hasStarted { writer.pipe.closeWrite() }
    }

    /// Starts the writer thread. Idempotent.
    public func start() {
        guard !hasStarted else { return }
        hasStarted = true
        let writer = self.writer
        let thread = Thread { writer.run() }
        thread.name = "mainspring.input-simulator"
        thread.start()
    }

    /// Stops the writer (promptly, even mid-wait). Records already written are still read and
    /// measured; `isFinished` turns true once they have been. Idempotent; any time.
    public func stop() {
        writer.pipe.requestStop()
        if !hasStarted {
            hasStarted = true
            writer.pipe.closeWrite()
        }
    }

    /// Write-to-handling latency of every record handled so far.
    public var latencies: LatencyHistogram { reader.latencies }

    /// Records handled so far.
    public var received: Int { reader.received }

    /// Records written so far (by the writer thread).
    public var sent: Int { writer.sent.load(ordering: .acquiring) }

    /// Whether the writer has finished (after `count` records, or `stop()`) and the loop has
    /// handled everything it wrote.
    public var isFinished: Bool { reader.sawEnd }

    // MARK: The two sides

    /// The writer thread's side.
    private final class Writer: Sendable {
        let pipe: RecordPipe
        let pattern: Pattern
        let count: Int?
        let sent = Atomic<Int>(0)

        init(pipe: RecordPipe, pattern: Pattern, count: Int?) {
            self.pipe = pipe
            self.pattern = pattern
            self.count = count
        }

        func run() {
            pipe.prepareWriterThread()
            defer { pipe.closeWrite() }
            let start = monotonicNanoseconds()
            var next = start
            var sequence = 0
            var generator = SystemRandomNumberGenerator()
            while count.map({ sequence < $0 }) ?? true {
                switch pattern {
                case .steady(let every):
                    next = start &+ UInt64(sequence + 1) &* every.clampedNanoseconds
                case .poisson(let rate):
                    let u = Double.random(in: 0..<1, using: &generator)
                    let mean = rate.isFinite && rate > 0 ? 1e9 / rate : 0
                    next = next &+ UInt64(min(-log1p(-u) * mean, 1e12))
                case .burst(let size, let every):
                    next = start &+ UInt64(sequence / max(1, size) + 1) &* every.clampedNanoseconds
                }
                guard pipe.sleep(until: next) else { return }
                let record = InputRecord(sequence: UInt64(sequence), stamp: monotonicNanoseconds())
                guard pipe.write(record) else { return }
                sequence += 1
                sent.store(sequence, ordering: .releasing)
            }
        }
    }

    /// The loop's side: the watcher's handler and what it measured. Loop thread only.
    private final class Reader {
        let pipe: RecordPipe
        let cost: UInt64
        let onEvent: ((Event) -> Void)?
        var watcher: Watcher?
        var buffer = RecordBuffer(capacity: 256)
        var latencies = LatencyHistogram()
        var received = 0
        var sawEnd = false

        init(pipe: RecordPipe, cost: UInt64, onEvent: ((Event) -> Void)?) {
            self.pipe = pipe
            self.cost = cost
            self.onEvent = onEvent
        }

        func readAvailable() {
            switch pipe.read(into: &buffer) {
            case .records:
                for record in buffer.records {
                    let start = monotonicNanoseconds()
                    let latency = start > record.stamp ? start - record.stamp : 0
                    latencies.record(nanoseconds: latency)
                    if cost > 0 { while monotonicNanoseconds() &- start < cost {} }
                    received += 1
                    onEvent?(Event(sequence: Int(record.sequence), latency: Duration(nanoseconds: latency)))
                }
            case .wouldBlock:
                break
            case .endOfFile, .failure:
                sawEnd = true
                watcher?.cancel()
                watcher = nil
                pipe.closeRead()
            }
        }
    }
}

@available(*, unavailable)
extension InputSimulator: Sendable {}
