import Dispatch
import Foundation
import Mainspring

/// main-queue: a producer thread posts 1,000,000 `DispatchQueue.main.async` blocks; the main
/// thread drains them with `EventLoop.main.run()` (mainspring), `RunLoop.main.run()`
/// (runloop-main), or `dispatchMain()` (dispatch-main, which on Linux runs the main queue on a
/// worker thread). Each variant runs in a child process of its own: they take over the main
/// thread and never return.
let mainQueueScenario = Scenario(
    name: "main-queue",
    summary: "1M DispatchQueue.main.async from a thread: EventLoop.main vs RunLoop.main vs dispatchMain()"
) { runs in
    let count = sized(1_000_000, smoke: 1_000)
    var samples = Samples()
    for _ in 0..<runs {
        for variant in ["mainspring", "runloop-main", "dispatch-main"] where variantEnabled(variant) {
            let figures = try runChild(["main-queue", variant, "\(count)"])
            samples.add(variant, "ops_per_s", figures["ops_per_s"] ?? .nan)
        }
    }
    return samples.records(scenario: "main-queue")
}

/// Main-queue state: touched only by main-queue blocks (one at a time, on one thread).
private final class MainQueueCounter: @unchecked Sendable {
    var value = 0
    var target = 0
    var start: UInt64 = 0
}

private let mainQueueCounter = MainQueueCounter()

/// The posted block: a global, so the closure captures nothing.
private let mainQueueBlock: @Sendable () -> Void = {
    let counter = mainQueueCounter
    counter.value += 1
    if counter.value == counter.target {
        let seconds = Double(nowNanoseconds() - counter.start) / 1e9
        childReport(["ops_per_s": Double(counter.target) / seconds])
    }
}

/// `mainspring-bench --child main-queue <variant> <count>`: runs on the process main thread.
let mainQueueChild = ChildEntryPoint(name: "main-queue") { arguments in
    guard arguments.count == 2, let count = Int(arguments[1]), count > 0 else {
        throw BenchError.usage("main-queue child: <variant> <count>")
    }
    let variant = arguments[0]
    // Create the main thread's loop machinery before the clock starts.
    switch variant {
    case "mainspring": _ = EventLoop.main
    case "runloop-main": _ = RunLoop.main
    case "dispatch-main": break
    default: throw BenchError.usage("main-queue child: unknown variant \(variant)")
    }
    mainQueueCounter.target = count
    mainQueueCounter.start = nowNanoseconds()
    let producer = Thread {
        for _ in 0..<count { DispatchQueue.main.async(execute: mainQueueBlock) }
    }
    producer.start()
    switch variant {
    case "mainspring": try EventLoop.main.run()
    case "runloop-main": RunLoop.main.run()
    default: dispatchMain()
    }
    throw BenchError.usage("main-queue child: \(variant) returned before the last block ran")
}
