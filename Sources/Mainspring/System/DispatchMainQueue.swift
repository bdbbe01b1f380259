internal import CMainspringSystem
import Dispatch

/// libdispatch's main-queue hooks, the two that swift-corelibs-foundation's `CFRunLoop` uses to
/// run `DispatchQueue.main` on the main thread (see `MainThread/MainQueueBridge.swift`).
///
/// How libdispatch drives them on Linux (swift-corelibs-libdispatch, `src/queue.c`):
/// - The handle is an eventfd (`EFD_NONBLOCK`), created once. libdispatch *writes* it when a
///   block lands on an empty main queue, and again at the end of a drain that left blocks behind
///   (blocks queued while the drain ran). It never reads it: the run loop must reset it, and must
///   do so *before* draining, or the wake-up for blocks queued during the drain is lost
///   (`__CFRunLoopServiceFileDescriptors` reads it before `CFRunLoop` drains).
/// - The callback runs the blocks that were queued when it started (a snapshot), on the main
///   thread only (libdispatch crashes with "called from the wrong thread" otherwise, and with
///   "called after dispatch_main()" once `dispatchMain()` has turned the main queue into an
///   ordinary queue). Called again from inside one of those blocks, it returns at once: the main
///   queue's re-entrancy guard (`dq_side_suspend_cnt`).
enum DispatchMainQueue {
    /// The main queue's eventfd. Creates it on first use; the same fd for the whole process.
    static var handle: Int32 { _dispatch_get_main_queue_handle_4CF() }

    /// Runs the blocks queued on the main queue when called. Main thread only.
    static func drain() { _dispatch_main_queue_callback_4CF(nil) }
}
