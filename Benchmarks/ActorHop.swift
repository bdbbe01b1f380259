import CBaselines
import Dispatch
import Foundation
import Mainspring

/// actor-hop: round trips between `@MainActor` and an actor on another thread — `await
/// worker.ping()` from a `@MainActor` task, 200,000 times.
///
/// - mainspring: the worker actor is pinned to a background `EventLoop`; the main actor runs on
///   `EventLoop.main` (its jobs arrive through the Dispatch main queue, drained by the loop).
/// - dispatch: the worker actor runs on a serial `DispatchQueue` (a minimal `SerialExecutor`:
///   Linux has no `DispatchSerialQueue`); the main actor runs under `dispatchMain()` — which on
///   Linux turns the main queue into an ordinary queue run by a worker thread, so both actors
///   often run on the *same* worker thread, one after the other, without any thread switch.
/// - dispatch-runloop-main (for reference): the same worker actor, with the main actor on the
///   real main thread under `RunLoop.main.run()` — the same two-thread topology as mainspring.
/// - libevent-c (for reference): two plain-C libevent loops on two threads ping-ponging through
///   eventfds: the kernel's floor for any hop between two sleeping loop threads.
/// - mainspring-same-loop: the worker actor is pinned to `EventLoop.main` itself — co-located
///   with the main actor. `EventLoop.main` and the main actor are one serial context (one
///   executor), so the call does not hop at all.
/// - mainspring-task-same-loop: a task that prefers a background loop (`Task(executorPreference:)`)
///   calls an actor pinned to that loop: no thread switch; the call runs inline and the way back
///   to the task's nonisolated code is one post on the loop.
///
/// Each variant runs in a child process of its own (they take over the main thread).
let actorHopScenario = Scenario(
    name: "actor-hop",
    summary: "200k round trips @MainActor <-> actor on a background loop vs on a DispatchQueue"
) { runs in
    let count = sized(200_000, smoke: 500)
    var samples = Samples()
    for _ in 0..<runs {
        for variant in actorHopVariants where variantEnabled(variant) {
            // The co-located variants are 10-100× faster: more round trips for a stable figure.
            let rounds = variant.hasSuffix("same-loop") ? count * 10 : count
            let figures = try runChild(["actor-hop", variant, "\(rounds)"])
            samples.add(variant, "roundtrips_per_s", figures["roundtrips_per_s"] ?? .nan)
        }
        samples.add("libevent-c", "roundtrips_per_s", Double(count) / ms_baseline_pingpong(Int64(count)))
    }
    return samples.records(scenario: "actor-hop")
}

#if MAINSPRING_MAIN_EXECUTOR
/// With the experimental custom main executor compiled in, one more variant: `@MainActor` jobs
/// posted straight to `EventLoop.main` (no Dispatch main queue).
private let actorHopVariants = ["mainspring", "dispatch", "dispatch-runloop-main", "mainspring-same-loop",
                                 "mainspring-task-same-loop", "mainspring-main-executor"]
#else
private let actorHopVariants = ["mainspring", "dispatch", "dispatch-runloop-main", "mainspring-same-loop",
                                 "mainspring-task-same-loop"]
#endif

/// The far end of the hop.
private actor HopWorker {
    private let executor: any SerialExecutor
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    private var calls = 0

    init(executor: any SerialExecutor) { self.executor = executor }

    func ping() -> Int {
        calls += 1
        return calls
    }
}

/// A serial `DispatchQueue` as an actor executor (what `DispatchSerialQueue` is on Darwin).
private final class DispatchQueueExecutor: SerialExecutor {
    private let queue = DispatchQueue(label: "bench.actor-hop")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        queue.async { job.runSynchronously(on: executor) }
    }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor { UnownedSerialExecutor(ordinary: self) }
}

/// `count` round trips to `worker`, after a warm-up, from the caller's isolation: the main actor
/// (`Task { @MainActor in … }`), or none, in a task that prefers the worker's loop.
private func hop(_ worker: HopWorker, count: Int, isolation: isolated (any Actor)? = #isolation) async -> Never {
    for _ in 0..<1_000 { _ = await worker.ping() }  // warm-up
    let start = nowNanoseconds()
    var last = 0
    for _ in 0..<count { last = await worker.ping() }
    let seconds = Double(nowNanoseconds() - start) / 1e9
    blackHole(last)
    childReport(["roundtrips_per_s": Double(count) / seconds])
}

/// `mainspring-bench --child actor-hop <variant> <count>`: runs on the process main thread.
let actorHopChild = ChildEntryPoint(name: "actor-hop") { arguments in
    guard arguments.count == 2, let count = Int(arguments[1]), count > 0 else {
        throw BenchError.usage("actor-hop child: <variant> <count>")
    }
    switch arguments[0] {
    case "mainspring", "mainspring-main-executor":
        #if MAINSPRING_MAIN_EXECUTOR
        if arguments[0] == "mainspring-main-executor" { EventLoop.installAsMainExecutor() }
        #endif
        let background = try EventLoop()
        let thread = Thread { try? background.run() }
        thread.start()
        let worker = HopWorker(executor: background)
        Task { @MainActor in await hop(worker, count: count) }
        try EventLoop.main.run()
    case "mainspring-same-loop":
        let worker = HopWorker(executor: EventLoop.main)
        Task { @MainActor in await hop(worker, count: count) }
        try EventLoop.main.run()
    case "mainspring-task-same-loop":
        let background = try EventLoop()
        let thread = Thread { try? background.run() }
        thread.start()
        let worker = HopWorker(executor: background)
        Task(executorPreference: background) { await hop(worker, count: count) }
        try EventLoop.main.run()
    case "dispatch":
        let worker = HopWorker(executor: DispatchQueueExecutor())
        Task { @MainActor in await hop(worker, count: count) }
        dispatchMain()
    case "dispatch-runloop-main":
        let worker = HopWorker(executor: DispatchQueueExecutor())
        Task { @MainActor in await hop(worker, count: count) }
        RunLoop.main.run()
    default:
        throw BenchError.usage("actor-hop child: unknown variant \(arguments[0])")
    }
    throw BenchError.usage("actor-hop child: the main loop returned early")
}
