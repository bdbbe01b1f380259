/// The loops bound to one thread (weakly). When the thread exits, no thread can ever run them
/// again, so each is shut down: its sources closed, its queued work dropped and counted — which
/// also breaks the cycles of queued closures and handlers that capture their loop — and it is
/// orphaned, so a later thread that happens to get the same `pthread_t` never looks like its
/// owner. (The main thread's loop is never bound here: the process ends with that thread.)
final class ThreadBinding: ThreadExitObserver {
    private struct WeakLoop { weak var loop: EventLoop? }
    private var loops: [WeakLoop] = []
    private static let key = ThreadLocalReference<ThreadBinding>()

    /// The calling thread's binding, made on first use.
    static var current: ThreadBinding {
        if let binding = key.value { return binding }
        let binding = ThreadBinding()
        key.set(binding)
        return binding
    }

    func bind(_ loop: EventLoop) {
        loops.removeAll { $0.loop == nil }
        loops.append(WeakLoop(loop: loop))
    }

    func threadDidExit() {
        for entry in loops {
            guard let loop = entry.loop, !loop.isOrphaned else { continue }
            _ = loop.shutdownNow()
            loop.releaseThread()
        }
        loops.removeAll()
    }
}
