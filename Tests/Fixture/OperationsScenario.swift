import Foundation
import Mainspring
import Synchronization

// Waiting on the real main thread for operations that need it: 200 operations whose completions
// are delivered to the main loop (some through DispatchQueue.main with --dispatch-main), waited
// for with waitUntilAllOperationsAreFinished(spinning: .main). With the plain
// waitUntilAllOperationsAreFinished() the main thread would block and no completion could run.
//
// The queue is a TrackedOperationQueue fed only through Foundation's own add methods (all four),
// and its onDrained hook is added while the operations are in flight: it must fire exactly once,
// on the main thread, after the block and the barrier block ran.

private final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func increment() { value.add(1, ordering: .acquiringAndReleasing) }
    var count: Int { value.load(ordering: .acquiring) }
}

private let completions = Counter()
private let offMain = Counter()
private let hooks = Counter()
private let drains = Counter()
private let blocks = Counter()
private let barriers = Counter()
/// Set by the drain hook: whether the block and the barrier block had both run when it fired.
private let extrasDoneAtDrain = Counter()

private final class Save: AsyncOperation, @unchecked Sendable {
    let index: Int
    let viaDispatch: Bool

    init(index: Int, viaDispatch: Bool) {
        self.index = index
        self.viaDispatch = viaDispatch
    }

    override func execute() {
        let viaDispatch = self.viaDispatch && index % 2 == 0
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int.random(in: 1...5))) {
            let deliver: @Sendable () -> Void = {
                if !Thread.isMainThread { offMain.increment() }
                completions.increment()
                self.finish()
            }
            if viaDispatch { DispatchQueue.main.async(execute: deliver) } else { EventLoop.main.execute(deliver) }
        }
    }
}

func operationsMainWaitScenario() throws {
    let useDispatchMain = CommandLine.arguments.contains("--dispatch-main")
    let queue = TrackedOperationQueue()
    queue.maxConcurrentOperationCount = 4
    let operations = (0..<200).map { Save(index: $0, viaDispatch: useDispatchMain) }
    for operation in operations {
        operation.onFinish {
            if !Thread.isMainThread { offMain.increment() }
            hooks.increment()
        }
    }
    // Foundation's four add methods. The queue cannot drain meanwhile: every Save needs the
    // main thread to finish, and this thread is busy here.
    queue.addOperations(Array(operations[..<100]), waitUntilFinished: false)
    for operation in operations[100...] { queue.addOperation(operation) }
    queue.addOperation { blocks.increment() }
    queue.addBarrierBlock { barriers.increment() }
    // Added while all of that is in flight: it fires at the end of this drain.
    let activity = QueueActivity(of: queue, on: .main)
    queue.onDrained {
        if !Thread.isMainThread { offMain.increment() }
        if blocks.count == 1 && barriers.count == 1 { extrasDoneAtDrain.increment() }
        drains.increment()
    }
    let before = completions.count  // 0: every completion needs the main thread
    let drained = queue.waitUntilAllOperationsAreFinished(spinning: .main, timeout: .seconds(20))
    let after = completions.count
    // Until everything is counted out (200 saves, the block, the barrier): the counted drains
    // are then final, and the hook runs once per counted drain.
    EventLoop.main.spin(until: { hooks.count == 200 && drains.count >= 1 && activity.finishedCount == 202 },
                        timeout: .seconds(10))
    report("before", before)
    report("drained", drained)
    report("completions", after)
    report("hooks", hooks.count)
    report("drains", drains.count)
    report("off-main", offMain.count)
    report("blocks", blocks.count)
    report("barriers", barriers.count)
    report("extras-done-at-drain", extrasDoneAtDrain.count)
    report("counted-drains", activity.drainCount)
    report("counted-finished", activity.finishedCount)
    check(before == 0 && drained && after == 200 && hooks.count == 200 && drains.count == 1 && offMain.count == 0
            && blocks.count == 1 && barriers.count == 1 && extrasDoneAtDrain.count == 1
            && activity.drainCount == 1 && activity.finishedCount == 202,
          "before=\(before) drained=\(drained) completions=\(after) hooks=\(hooks.count) drains=\(drains.count) offMain=\(offMain.count) blocks=\(blocks.count) barriers=\(barriers.count)")
}
