import Foundation
import Mainspring
import Synchronization

// A batch of asynchronous saves, on Linux: save N records with an asynchronous API whose
// callbacks are delivered on the main thread, one `AsyncOperation` per record, and get back to
// the main thread once all are done — first with `TrackedOperationQueue.onDrained` (what Darwin
// code does by observing `operationCount` with KVO), then with
// `waitUntilAllOperationsAreFinished(spinning:)` (a wait on the main thread that does not
// deadlock although every callback needs the main thread).
//
// The "server" is a child process (/bin/sh) spoken to over pipes: one request line in, one reply
// line out. It rejects records with an empty value, so some saves fail. Runs with no stdin, ends
// by itself, and exits 0 when every operation reported back.
//
// Usage: mainspring-operations [count]   (default 12)

/// A record store served by a child process. `save` works from any thread; the request is
/// written and the reply (or a time-out) delivered on `loop` — like the many client SDKs whose
/// `saveInBackground`-style calls deliver their callbacks on the main queue.
///
/// Thread safety by confinement: everything below `loop` is touched only on `loop`'s thread.
final class RecordStore: @unchecked Sendable {
    enum Failure: Error, Sendable, CustomStringConvertible {
        case rejected(String)
        case timedOut
        case closed

        var description: String {
            switch self {
            case .rejected(let reason): return "rejected (\(reason))"
            case .timedOut: return "no reply in time"
            case .closed: return "the store closed"
            }
        }
    }

    typealias Completion = @Sendable (Result<Void, Failure>) -> Void

    let loop: EventLoop
    private let server = Process()
    private let requests: FileHandle
    private let replies: FileHandle
    private var reader: Watcher?
    private var waiting: [Int: (timer: TimerHandle, completion: Completion)] = [:]
    private var isClosed = false

    /// Starts the server. Call it on `loop`'s thread.
    init(loop: EventLoop) throws {
        self.loop = loop
        let script = """
            while read -r verb id value; do
              if [ "$verb" = save ] && [ -n "$value" ]; then echo "ok $id"
              else echo "error $id empty record"; fi
            done
            """
        let input = Pipe()
        let output = Pipe()
        server.executableURL = URL(fileURLWithPath: "/bin/sh")
        server.arguments = ["-c", script]
        server.standardInput = input
        server.standardOutput = output
        server.standardError = FileHandle.nullDevice
        try server.run()
        requests = input.fileHandleForWriting
        replies = output.fileHandleForReading
        reader = try loop.readLines(from: replies.fileDescriptor) { [unowned self] event in
            self.handle(event)
        }
    }

    /// Saves `value` as record `id`; `completion` runs on `loop`. Any thread.
    func save(id: Int, value: String, completion: @escaping Completion) {
        loop.execute { self.send(id: id, value: value, completion: completion) }
    }

    /// Closes the server's input and waits (spinning the loop) until it has exited.
    func close() {
        try? requests.close()
        loop.spin(until: { self.isClosed }, timeout: .seconds(5))
        // Reap the child: Foundation's Process keeps itself alive until it has seen the exit.
        server.waitUntilExit()
    }

    private func send(id: Int, value: String, completion: @escaping Completion) {
        guard !isClosed else { return completion(.failure(.closed)) }
        let timer = loop.schedule(after: .seconds(2)) { [unowned self] in
            waiting.removeValue(forKey: id)?.completion(.failure(.timedOut))
        }
        waiting[id] = (timer, completion)
        do {
            try requests.write(contentsOf: Data("save \(id) \(value)\n".utf8))
        } catch {
            timer.cancel()
            waiting.removeValue(forKey: id)?.completion(.failure(.closed))
        }
    }

    private func handle(_ event: LineEvent) {
        switch event {
        case .line(let line):
            let fields = line.split(separator: " ", maxSplits: 2).map(String.init)
            guard fields.count >= 2, let id = Int(fields[1]), let entry = waiting.removeValue(forKey: id) else {
                print("unexpected reply: \(line)")
                return
            }
            entry.timer.cancel()
            entry.completion(fields[0] == "ok" ? .success(()) : .failure(.rejected(fields.dropFirst(2).joined())))
        case .tooLong, .invalidUTF8:
            print("unreadable reply skipped")
        case .endOfFile, .error:
            isClosed = true
            for (_, entry) in waiting {
                entry.timer.cancel()
                entry.completion(.failure(.closed))
            }
            waiting = [:]
        }
    }
}

/// One save as an operation: starts the request, finishes when its callback arrives.
final class SaveOperation: AsyncOperation, @unchecked Sendable {
    let id: Int
    let value: String
    let store: RecordStore
    private let outcome = Mutex<Result<Void, RecordStore.Failure>?>(nil)

    init(id: Int, value: String, store: RecordStore) {
        self.id = id
        self.value = value
        self.store = store
        super.init()
    }

    var result: Result<Void, RecordStore.Failure>? { outcome.withLock { $0 } }

    override func execute() {
        // On one of the queue's threads. The callback comes on the store's loop (main thread).
        store.save(id: id, value: value) { result in
            switch result {
            case .success: print("record \(self.id) saved (callback on the main thread: \(Thread.isMainThread))")
            case .failure(let failure): print("record \(self.id) failed: \(failure)")
            }
            self.outcome.withLock { $0 = result }
            self.finish()
        }
    }
}

func makeBatch(_ ids: ClosedRange<Int>, store: RecordStore) -> [SaveOperation] {
    // Every fifth record is empty: the server rejects it.
    ids.map { SaveOperation(id: $0, value: $0 % 5 == 0 ? "" : "value-\($0)", store: store) }
}

func summary(_ name: String, _ batch: [SaveOperation]) -> (line: String, complete: Bool) {
    var succeeded = 0
    var failed = 0
    for operation in batch {
        switch operation.result {
        case .success?: succeeded += 1
        case .failure?: failed += 1
        case nil: break
        }
    }
    let line = "\(name): \(batch.count) saves, \(succeeded) succeeded, \(failed) failed"
    return (line, succeeded + failed == batch.count)
}

func runExample(count: Int) throws -> Bool {
    signal(SIGPIPE, SIG_IGN)
    let loop = EventLoop.current  // on the main thread, this is EventLoop.main
    let store = try RecordStore(loop: loop)
    // Every add counts, Foundation's own methods included: the drain hook sees all of them.
    let queue = TrackedOperationQueue()
    queue.name = "saves"
    queue.maxConcurrentOperationCount = 4
    let watchdog = loop.schedule(after: .seconds(30)) {
        print("gave up: the batch did not finish in 30 s")
        exit(1)
    }

    // 1. A completion block for the whole batch, without KVO: it runs on the main loop when the
    //    queue drains.
    let first = makeBatch(1...count, store: store)
    let allReported = Mutex(true)
    let hook = queue.onDrained(on: loop) {
        let (line, complete) = summary("batch 1 (onDrained)", first)
        print(line)
        allReported.withLock { $0 = $0 && complete }
        loop.stop()
    }
    queue.addOperations(first, waitUntilFinished: false)
    try loop.run()
    hook.cancel()

    // 2. A wait on the main thread, which deadlocks with the plain
    //    waitUntilAllOperationsAreFinished(): the callbacks need the main thread. Spinning the
    //    main loop while waiting runs them.
    let second = makeBatch(count + 1...2 * count, store: store)
    queue.addOperations(second, waitUntilFinished: false)
    let drained = queue.waitUntilAllOperationsAreFinished(spinning: loop, timeout: .seconds(20))
    let (line, complete) = summary("batch 2 (waitUntilAllOperationsAreFinished(spinning:))", second)
    print(line)

    watchdog.cancel()
    store.close()
    return drained && complete && allReported.withLock { $0 }
}

let count = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 12
do {
    exit(try runExample(count: max(count, 1)) ? 0 : 1)
} catch {
    print("error: \(error)")
    exit(1)
}
