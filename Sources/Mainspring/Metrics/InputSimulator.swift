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
/// ## On a simulated loop
/// On a loop of a `MainspringTesting` simulation there is no pipe and no thread: each record is
/// "written" at its instant on the pattern's grid, in virtual time, and becomes ready for the
/// loop's next poll at or after that instant, as `.input`; its latency is from that instant to
/// the start of its handling, and `handlingCost` is modelled CPU (virtual time), not a busy
/// wait. `.poisson` draws its intervals from a fixed seed, so runs repeat exactly. A record
/// counts in `sent` once it is ready to be read.
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

    /// What writes and reads the records: a pipe between a writer thread and the loop, or (on
    /// a simulated loop) one source of the simulation's time — as the loop's world makes it.
    private let driver: any InputDriver

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
        driver = try loop.world.makeInputDriver(on: loop, pattern: pattern, count: self.count,
                                                cost: handlingCost.clampedNanoseconds, onEvent: onEvent)
    }

    deinit {
        // The writer stops and closes its end; the reader then sees end of file and closes the
        // watcher and its end (when the loop runs again).
        driver.stopForDeinit()
    }

    /// Starts the writer thread. Idempotent.
    public func start() { driver.start() }

    /// Stops the writer (promptly, even mid-wait). Records already written are still read and
    /// measured; `isFinished` turns true once they have been. Idempotent; any time.
    public func stop() { driver.stop() }

    /// Write-to-handling latency of every record handled so far.
    public var latencies: LatencyHistogram { driver.latencies }

    /// Records handled so far.
    public var received: Int { driver.received }

    /// Records written so far (by the writer thread).
    public var sent: Int { driver.sent }

    /// Whether the writer has finished (after `count` records, or `stop()`) and the loop has
    /// handled everything it wrote.
    public var isFinished: Bool { driver.isFinished }

    // MARK: The two sides

    /// The writer thread's side.
    fileprivate final class Writer: Sendable {
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
            // Real time: this thread writes a real pipe, which a simulated loop never has.
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
    fileprivate final class Reader {
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

/// What writes an `InputSimulator`'s records and reads them on the loop, as the loop's world
/// makes it (`LoopWorld.makeInputDriver`). Loop thread only, as the simulator.
protocol InputDriver: AnyObject {
    func start()
    func stop()
    /// The simulator goes: the writer stops (what it wrote is still read).
    func stopForDeinit()
    var latencies: LatencyHistogram { get }
    var received: Int { get }
    var sent: Int { get }
    var isFinished: Bool { get }
}

/// The kernel's records: a writer thread writes them into a pipe, the loop watches its read end.
final class PipeInputDriver: InputDriver {
    private let writer: InputSimulator.Writer
    private let reader: InputSimulator.Reader
    private var hasStarted = false

    init(loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
         onEvent: ((InputSimulator.Event) -> Void)?) throws(EventLoopError)
    {
        let pipe = try RecordPipe()
        let reader = InputSimulator.Reader(pipe: pipe, cost: cost, onEvent: onEvent)
        writer = InputSimulator.Writer(pipe: pipe, pattern: pattern, count: count)
        self.reader = reader
        reader.watcher = try loop.watch(pipe.readFD, for: .read, priority: .input) { _ in reader.readAvailable() }
    }

    func start() {
        guard !hasStarted else { return }
        hasStarted = true
        let writer = self.writer
        let thread = Thread { writer.run() }
        thread.name = "mainspring.input-simulator"
        thread.start()
    }

    func stop() {
        writer.pipe.requestStop()
        if !hasStarted {
            hasStarted = true
            writer.pipe.closeWrite()
        }
    }

    func stopForDeinit() {
        writer.pipe.requestStop()
        if !hasStarted { writer.pipe.closeWrite() }
    }

    var latencies: LatencyHistogram { reader.latencies }
    var received: Int { reader.received }
    var sent: Int { writer.sent.load(ordering: .acquiring) }
    var isFinished: Bool { reader.sawEnd }
}

/// `InputSimulator` on a simulated loop: the pattern's records on virtual time, read as an
/// `.input` source at the first poll at or after each record's instant. Loop thread only.
final class SimulatedInputSource: DeadlineSource, InputDriver {
    private let pattern: InputSimulator.Pattern
    private let count: Int?
    private let cost: UInt64
    private let onEvent: ((InputSimulator.Event) -> Void)?
    private var startedAt: UInt64 = 0
    /// The next record's number and instant (virtual ns).
    private var sequence = 0
    private var nextInstant: UInt64 = 0
    private var isWriting = false
    private var random = SeededIntervals(seed: 0x5EED_1E55)
    var latencies = LatencyHistogram()
    var received = 0
    var sent = 0
    var sawEnd = false

    init(loop: EventLoop, pattern: InputSimulator.Pattern, count: Int?, cost: UInt64,
         onEvent: ((InputSimulator.Event) -> Void)?)
    {
        self.pattern = pattern
        self.count = count
        self.cost = cost
        self.onEvent = onEvent
        super.init(loop: loop, priority: .input)
    }

    func start() { startWriting() }
    func stop() { stopWriting() }
    func stopForDeinit() { stopWriting() }
    var isFinished: Bool { sawEnd }

    func startWriting() {
        guard !isWriting, !sawEnd else { return }
        isWriting = true
        startedAt = loop.monotonicNow()
        nextInstant = startedAt
        advanceToNextRecord()
        armOrEnd()
    }

    func stopWriting() {
        isWriting = false
        sawEnd = true
        close()
    }

    /// Arms the source for record `sequence`'s instant (`nextInstant`), or ends once `count`
    /// records were written.
    private func armOrEnd() {
        if let count, sequence >= count {
            stopWriting()
            return
        }
        arm(at: nextInstant)
    }

    /// Moves `nextInstant` from the previous record's instant (or the start) to record
    /// `sequence`'s.
    private func advanceToNextRecord() {
        switch pattern {
        case .steady(let every):
            nextInstant = startedAt &+ UInt64(sequence + 1) &* every.clampedNanoseconds
        case .poisson(let rate):
            nextInstant = nextInstant &+ random.exponential(mean: 1e9 / rate)
        case .burst(let size, let every):
            nextInstant = startedAt &+ UInt64(sequence / max(1, size) + 1) &* every.clampedNanoseconds
        }
    }

    override func perform(_ readiness: Readiness) {
        guard isWriting else { return }
        // Everything written by the time the loop polled is read in one go, as from the pipe.
        let polled = withLoop { $0.monotonicNow() }
        var batch: [(Int, UInt64)] = []
        // At most 256 records a read, as the real reader's buffer.
        while nextInstant <= polled, batch.count < 256, count.map({ sequence < $0 }) ?? true {
            batch.append((sequence, nextInstant))
            sequence += 1
            sent += 1
            advanceToNextRecord()
        }
        for (number, instant) in batch {
            let begin = withLoop { $0.monotonicNow() }
            let latency = begin > instant ? begin - instant : 0
            latencies.record(nanoseconds: latency)
            if cost > 0 { withLoop { $0.simulation?.clock.advance(by: cost) } }
            received += 1
            onEvent?(InputSimulator.Event(sequence: number, latency: Duration(nanoseconds: latency)))
        }
        if isWriting { armOrEnd() }  // records still waiting make the source ready again at once
    }
}

/// Exponentially distributed intervals from a fixed seed, so a simulated Poisson pattern
/// repeats exactly.
private struct SeededIntervals {
    private var generator: SplitMix64

    init(seed: UInt64) { generator = SplitMix64(seed: seed) }

    mutating func exponential(mean: Double) -> UInt64 {
        let u = Double(generator.next() >> 11) / Double(1 << 53)
        return UInt64(min(-log1p(-u) * mean, 1e12))
    }
}
