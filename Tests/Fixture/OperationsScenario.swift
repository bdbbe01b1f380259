import Foundation
import Mainspring
import Synchronization

// The article's deadlock case on the real main thread: 200 operations whose completions are
// delivered to the main loop (some through DispatchQueue.main with --dispatch-main), waited for
// with waitUntilAllOperationsAreFinished(spinning: .main). With the plain
// waitUntilAllOperationsAreFinished() the main thread would block and no completion could run.

private final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func increment() { value.add(1, ordering: .acquiringAndReleasing) }
    var count: Int { value.load(ordering: .acquiring) }
}

private let completions = Counter()
private let offMain = Counter()
private let hooks = Counter()
private let drains = Counter()

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
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 4
    let operations = (0..<200).map { Save(index: $0, viaDispatch: useDispatchMain) }
    for operation in operations {
        operation.onFinish {
            if !Thread.isMainThread { offMain.increment() }
            hooks.increment()
        }
    }
    queue.onDrained {
        if !Thread.isMainThread { offMain.increment() }
        drains.increment()
    }
    queue.addTrackedOperations(operations)
    let before = completions.count  // 0: every completion needs the main thread
    let drained = queue.waitUntilAllOperationsAreFinished(spinning: .main, timeout: .seconds(20))
    let after = completions.count
    EventLoop.main.spin(until: { hooks.count == 200 && drains.count == 1 }, timeout: .seconds(10))
    report("before", before)
    report("drained", drained)
    report("completions", after)
    report("hooks", hooks.count)
    report("drains", drains.count)
    report("off-main", offMain.count)
    check(before == 0 && drained && after == 200 && hooks.count == 200 && drains.count == 1 && offMain.count == 0,
          "before=\(before) drained=\(drained) completions=\(after) hooks=\(hooks.count) drains=\(drains.count) offMain=\(offMain.count)")
}
