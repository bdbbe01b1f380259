import ExampleServices
import Foundation
import Mainspring

/// The demo: one long job — counting the primes below a limit with a segmented sieve — run on
/// `EventLoop.main` in chunks, the input that steers and measures it, the progress display, and
/// the final report.
///
/// Everything happens on the main thread inside `EventLoop.main.run()`: the stdin reader, the
/// `InputSimulator`'s reader, the progress timer, the signal handler and the job's chunks are all
/// callbacks of that one loop, so the state below needs no lock (the class is `@MainActor`, and
/// the loop's callbacks do run on the main thread). `main.swift` makes one, calls `start()`, runs
/// the loop until the demo stops it, then calls `finish()`.
///
/// The job runs one of two ways:
/// - **fed** (the default): a `Feeder` runs the chunks a few per loop turn at `.background`
///   priority, polling for input between turns; `pause`, `resume`, `cancel` and `chunk <n>` act
///   on the running job.
/// - **naive** (`--naive`): every chunk is posted at once with `EventLoop.execute` (`.normal`).
///   Input still gets through — the loop polls at least every 2 ms and runs `.input` first — but
///   everything else at `.normal`, such as the progress timer, waits behind the whole job, and
///   chunks already posted cannot be paused or resized.
@MainActor
final class Demo {
    /// Lines longer than this are reported and skipped (a command is a few words).
    static let maxLineLength = 4_096
    /// How often the progress display is refreshed.
    static let tickInterval = Duration.milliseconds(100)
    /// The simulated input (and, when typing, the latency probe): a record every 10 ms.
    static let inputPattern = InputSimulator.Pattern.steady(every: .milliseconds(10))
    /// Bad input lines reported in a row before the rest are only counted.
    static let junkShown = 10

    let options: DemoOptions
    let console: Console
    let loop = EventLoop.main
    let clock = ContinuousClock()

    // The job.
    var sieve: PrimeSieve
    /// Numbers per chunk for the chunks still to come (fed mode).
    var chunkSize: Int
    var job: FeedJob?
    var flood: Flood?
    var outcome: FeedOutcome?
    var startedAt: ContinuousClock.Instant
    var finishedAt: ContinuousClock.Instant?
    var pausedSince: ContinuousClock.Instant?
    /// Time spent paused, in all.
    var pausedTotal = Duration.zero
    /// Time spent in pauses that ended with `resume` after the first chunk: it lies between two
    /// chunks, inside the work's elapsed time, and the report leaves it out.
    var resumedPauses = Duration.zero

    // Input.
    var stdinReader: Watcher?
    /// Simulated input, or (when typing) the probe whose latencies `stats` reports.
    var input: InputSimulator?
    var inputEnded = false
    var interruptWatcher: Watcher?
    var interrupted = false
    var junkInARow = 0
    var junkHidden = 0

    // Progress.
    var ticker: TimerHandle?
    var lastTick: ContinuousClock.Instant?
    var longestTickGap = Duration.zero
    var ticks = 0
    var lastDecile = 0

    /// The process exit status once the demo is over: 0, or 130 after Ctrl-C.
    private(set) var exitStatus: Int32 = 0

    init(options: DemoOptions, console: Console) {
        self.options = options
        self.console = console
        sieve = PrimeSieve(limit: options.limit)
        chunkSize = options.chunkSize
        startedAt = clock.now
    }

    // MARK: Running

    /// Sets up input, the progress timer and the job on `EventLoop.main`. Call it on the main
    /// thread, then run the loop.
    /// - Throws: when stdin cannot be read (interactive mode) or the simulator's pipe cannot be
    ///   made.
    func start() throws {
        interruptWatcher = try loop.onSignal(SIGINT) { [self] in interrupt() }
        if options.mode == .interactive {
            stdinReader = try loop.readLines(from: STDIN_FILENO, maxLineLength: Self.maxLineLength) { [self] event in
                handle(event)
            }
        }
        let input = try InputSimulator(loop: loop, pattern: Self.inputPattern)
        self.input = input
        announce()
        ticker = loop.schedule(every: Self.tickInterval) { [self] _ in tick() }
        startedAt = clock.now
        input.start()
        if options.naive { startFlood() } else { startFeeding() }
        showProgress()
    }

    /// After the loop has stopped: lets the simulator's last records arrive, then prints the
    /// summary (or, with `--json`, only the report).
    func finish() {
        ticker?.cancel()
        stdinReader?.cancel()
        interruptWatcher?.cancel()
        if let input {
            input.stop()
            loop.spin(until: { input.isFinished }, timeout: .seconds(2))
        }
        console.removeBar()
        let report = fairnessReport()
        if options.json {
            console.line(json(report))
            return
        }
        var lines = resultLines()
        if options.mode == .simulate {
            lines.append("fairness report (input: a record every 10 ms through a pipe):")
            lines += report.table.split(separator: "\n").map { "  " + $0 }
        } else {
            lines += fairnessSummary(report)
        }
        lines.append(tickSummary())
        if options.naive {
            lines.append("--naive: \(grouped(flood?.posted ?? 0)) chunks were posted at once at .normal priority. Input")
            lines.append("(.input) still came first, but the progress timer (.normal) waited behind them.")
        }
        console.lines(lines)
    }

    func announce() {
        var lines = ["Counting the primes below \(grouped(sieve.limit)) on the main thread's event loop,"]
        if options.naive {
            lines.append("every chunk of \(grouped(chunkSize)) numbers posted at once with execute (--naive).")
        } else {
            lines.append("fed in chunks of \(grouped(chunkSize)) numbers (Feeder, \(options.pacing.label)).")
        }
        switch options.mode {
        case .interactive:
            lines.append("Commands: status, pause, resume, cancel, chunk <n>, stats, help, quit.")
            lines.append(options.cancelOnEndOfInput
                ? "End of input (Ctrl-D) cancels the job (--cancel-on-eof)."
                : "End of input (Ctrl-D) lets the job finish.")
        case .simulate:
            guard !options.json else { return }
            lines.append("Simulated input: a timestamped record every 10 ms through a pipe, read by")
            lines.append("the same loop (stdin is not read; --interactive to type commands).")
        }
        console.lines(lines)
    }

    // MARK: The job

    /// Feeds the sieve to the loop one chunk at a time, for as long as it has numbers left. Each
    /// chunk reads `chunkSize` when it runs, so `chunk <n>` applies from the next chunk on.
    func startFeeding() {
        let feeder = Feeder(loop: loop, pacing: options.pacing)
        // One element per chunk still needed: the feeder asks for the next one after each chunk.
        let chunks = AnyIterator { [self] in sieve.isDone ? nil : () }
        let job = feeder.feed(chunks) { [self] _ in sieve.sieveNext(chunkSize) }
        job.onCompletion { [self] outcome in jobFinished(outcome) }
        self.job = job
    }

    /// `--naive`: cuts the job into chunks and posts them all at once with `execute`, the way a
    /// program without a feeder would.
    func startFlood() {
        let size = chunkSize
        let count = max(1, (sieve.limit - sieve.position + size - 1) / size)
        flood = Flood(posted: count)
        for _ in 0..<count {
            loop.execute { [self] in
                MainActor.assumeIsolated { runFloodChunk(size) }
            }
        }
    }

    func runFloodChunk(_ size: Int) {
        guard var flood else { return }
        if !flood.isCancelled {
            let start = clock.now
            sieve.sieveNext(size)
            flood.record(start: start, end: clock.now)
        }
        flood.remaining -= 1
        self.flood = flood
        if flood.remaining == 0 { jobFinished(flood.isCancelled ? .cancelled : .completed) }
    }

    func jobFinished(_ outcome: FeedOutcome) {
        self.outcome = outcome
        let now = clock.now
        finishedAt = now
        if let pausedSince {
            pausedTotal += now - pausedSince
            self.pausedSince = nil
        }
        recordTick(at: now)
        ticker?.cancel()
        input?.stop()
        if options.mode == .interactive && !inputEnded {
            console.lines(resultLines() + ["('stats' for the fairness report; 'quit' or Ctrl-D to exit)"])
        }
        showProgress()
        stopWhenDone()
    }

    /// Stops the loop once the job is over and no more input is expected.
    func stopWhenDone() {
        if outcome != nil && (inputEnded || options.mode == .simulate) { loop.stop() }
    }

    enum Phase: String {
        case running, paused, completed, cancelled
    }

    var phase: Phase {
        switch outcome {
        case .completed?: return .completed
        case .cancelled?: return .cancelled
        case nil: return job?.isPaused == true ? .paused : .running
        }
    }

    var chunksRun: Int { job?.progress.completed ?? flood?.chunks ?? 0 }

    var elapsed: Duration { (finishedAt ?? clock.now) - startedAt }

    // MARK: Input

    func handle(_ event: LineEvent) {
        switch event {
        case .line(let text):
            console.inputLineEntered()
            switch DemoCommand.parse(text) {
            case nil:
                break
            case .success(let command)?:
                reportHiddenJunk()
                perform(command)
            case .failure(let error)?:
                complain("\(error) (type 'help' for the commands)")
            }
        case .tooLong(let bytes):
            console.inputLineEntered()
            complain("ignored a line of \(byteCount(bytes)) (commands are at most \(grouped(Self.maxLineLength)) bytes)")
        case .invalidUTF8(let bytes):
            console.inputLineEntered()
            complain("ignored a line of \(byteCount(bytes)) that is not valid UTF-8")
        case .endOfFile:
            endOfInput("end of input")
        case .error(let code):
            endOfInput("cannot read stdin (\(String(cString: strerror(code))))")
        }
        showProgress()
    }

    func perform(_ command: DemoCommand) {
        switch command {
        case .status: console.lines(statusLines())
        case .pause: pause()
        case .resume: resume()
        case .cancel: cancel(because: "cancel")
        case .chunk(let size): setChunkSize(size)
        case .stats:
            let report = fairnessReport()
            var lines = ["fairness so far (input: a probe record every 10 ms through a pipe):"]
            lines += report.table.split(separator: "\n").map { "  " + $0 }
            if resumedPauses > .zero { lines.append("  (time paused is left out of work elapsed)") }
            console.lines(lines)
        case .help:
            console.lines(["commands:"] + DemoCommand.helpText.split(separator: "\n").map { "  " + $0 })
        case .quit:
            inputEnded = true
            stdinReader?.cancel()
            if outcome == nil { cancel(because: "quit") } else { console.line("quit") }
            stopWhenDone()
        }
    }

    func pause() {
        if let outcome { return console.line("pause: the job has already \(outcome)") }
        guard let job else {
            return console.line("pause: impossible with --naive: every chunk is queued already (a Feeder avoids that)")
        }
        if job.isPaused { return console.line("pause: already paused") }
        job.pause()
        pausedSince = clock.now
        console.line("paused at \(formatPercent(sieve.progress)); input is still answered ('resume' goes on)")
    }

    func resume() {
        if let outcome { return console.line("resume: the job has already \(outcome)") }
        guard let job else { return console.line("resume: nothing to resume with --naive (it cannot pause)") }
        guard job.isPaused, let pausedSince else { return console.line("resume: not paused") }
        job.resume()
        let pause = clock.now - pausedSince
        pausedTotal += pause
        // Inside the work's elapsed time (first chunk's start to last chunk's end) only if a chunk
        // ran before it; the job goes on after it.
        if job.progress.completed > 0 { resumedPauses += pause }
        self.pausedSince = nil
        console.line("resumed at \(formatPercent(sieve.progress))")
    }

    /// Cancels the job: no chunk runs after this (the chunks `--naive` queued run as no-ops).
    func cancel(because reason: String) {
        if let outcome { return console.line("\(reason): the job has already \(outcome)") }
        if let job {
            if job.isPaused, let pausedSince {
                pausedTotal += clock.now - pausedSince
                self.pausedSince = nil
            }
            job.cancel()  // it finishes (as .cancelled) on the loop, promptly: see jobFinished
        } else if flood != nil {
            flood?.isCancelled = true
        }
        console.line("\(reason): cancelling the job at \(formatPercent(sieve.progress))")
    }

    func setChunkSize(_ size: Int) {
        if let outcome { return console.line("chunk: the job has already \(outcome)") }
        guard job != nil else {
            return console.line("chunk: impossible with --naive: the chunks were cut when they were posted")
        }
        let old = chunkSize
        chunkSize = size
        console.line("chunk size: \(grouped(size)) numbers (was \(grouped(old))), from the next chunk on")
    }

    func endOfInput(_ what: String) {
        reportHiddenJunk()
        inputEnded = true
        stdinReader = nil  // the reader cancels itself after the end of file or an error
        if outcome == nil {
            if options.cancelOnEndOfInput {
                cancel(because: "\(what) (--cancel-on-eof)")
            } else {
                console.line("\(what): letting the job finish (--cancel-on-eof would cancel it)")
            }
        }
        stopWhenDone()
    }

    /// Ctrl-C: cancels the job and ends the demo (with the summary); a second Ctrl-C exits at once.
    func interrupt() {
        if interrupted { exit(130) }
        interrupted = true
        exitStatus = 130
        inputEnded = true
        stdinReader?.cancel()
        if outcome == nil { cancel(because: "interrupted") }
        stopWhenDone()
    }

    /// Reports bad input in one line; after `junkShown` in a row, only counts it until the next
    /// good command, so a binary file piped in cannot flood the screen.
    func complain(_ message: String) {
        junkInARow += 1
        if junkInARow < Self.junkShown {
            console.line("error: " + printable(message))
        } else if junkInARow == Self.junkShown {
            console.line("error: " + printable(message) + " — more bad lines are counted, not shown, until a good command")
        } else {
            junkHidden += 1
        }
    }

    func reportHiddenJunk() {
        if junkHidden > 0 { console.line("(ignored \(grouped(junkHidden)) more bad lines)") }
        junkInARow = 0
        junkHidden = 0
    }

    // MARK: Progress

    func tick() {
        if outcome == nil { recordTick(at: clock.now) }
        ticks += 1
        showProgress()
    }

    /// Tracks the longest gap between two progress ticks while the job runs (the last one ends
    /// when the job does): a timer at `.normal` priority shows how long other work waited.
    func recordTick(at now: ContinuousClock.Instant) {
        longestTickGap = max(longestTickGap, now - (lastTick ?? startedAt))
        lastTick = now
    }

    /// The bar on a terminal; otherwise a line every 10% while the job runs.
    func showProgress() {
        guard !options.json else { return }
        if console.isTerminal {
            console.showBar(barText())
        } else if outcome == nil {
            let decile = Int(sieve.progress * 10)
            if decile > lastDecile && decile < 10 {
                lastDecile = decile
                console.line("progress: \(decile * 10)% (\(grouped(sieve.count)) primes so far, \(formatSeconds(elapsed.seconds)))")
            }
        }
    }

    func barText() -> String {
        let cells = 20
        let fraction = sieve.progress
        let filled = min(cells, Int(fraction * Double(cells)))
        let bar = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: cells - filled) + "]"
        let spinner = ["|", "/", "-", "\\"][ticks % 4]
        let state = phase == .running ? spinner : phase.rawValue
        return "\(bar) \(formatPercent(fraction))  \(grouped(sieve.count)) primes  \(state)"
    }
}
