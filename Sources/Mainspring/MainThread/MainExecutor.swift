// Experimental, opt-in: build with `MAINSPRING_MAIN_EXECUTOR=1 swift build` (see README,
// "Experimental: Mainspring as the main executor"). Without the flag this file is empty.
#if MAINSPRING_MAIN_EXECUTOR
@_spi(ExperimentalCustomExecutors) import _Concurrency

extension EventLoop {
    /// Makes `EventLoop.main` the `MainActor`'s executor (Swift 6.3's experimental
    /// `ExecutorFactory` SPI): `@MainActor` jobs are then posted straight to the main loop
    /// (`execute`, no Dispatch main queue in between), and `MainActor.executor.run()` runs it.
    ///
    /// Call it first thing in a synchronous `main`, before anything touches `MainActor` or
    /// creates a task (the runtime creates its executors once, on first use; later calls have no
    /// effect). An `async` `@main` cannot use it: the compiler does not (yet) honour a
    /// `DefaultExecutorFactory` typealias, and the executors exist before `main` runs. Write a
    /// synchronous `main` that starts a `@MainActor` task and calls `EventLoop.main.run()`.
    /// `DispatchQueue.main` keeps working (the main-queue bridge drains it as before).
    public static func installAsMainExecutor() {
        _createExecutors(factory: MainspringExecutorFactory.self)
    }
}

/// The executor factory behind `installAsMainExecutor()`: the main loop as the main executor,
/// the platform's default executor for everything else.
struct MainspringExecutorFactory: ExecutorFactory {
    static var mainExecutor: any MainExecutor { MainLoopExecutor.shared }
    static var defaultExecutor: any TaskExecutor { PlatformExecutorFactory.defaultExecutor }
}

/// `MainActor`'s executor when installed: jobs go to `EventLoop.main`.
final class MainLoopExecutor: MainExecutor, @unchecked Sendable {
    static let shared = MainLoopExecutor()

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedSerialExecutor()
        EventLoop.main.execute { job.runSynchronously(on: executor) }
    }

    func run() throws { try EventLoop.main.run() }

    func stop() { EventLoop.main.stop() }

    func asUnownedSerialExecutor() -> UnownedSerialExecutor { UnownedSerialExecutor(ordinary: self) }

    var isMainExecutor: Bool { true }

    func checkIsolated() {
        requireUsage(EventLoop.main.isCurrent, "Mainspring: expected to run on the main actor (the main thread)")
    }

    func isIsolatingCurrentContext() -> Bool? { EventLoop.main.isCurrent }
}
#endif
