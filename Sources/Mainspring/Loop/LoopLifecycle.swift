/// Who owns a loop, as other threads see it: the value behind `EventLoop.ownerThread` (one
/// atomic word, read on every `isCurrent`).
///
/// ```
/// unbound ──claimed by its first thread──▶ owned(thread) ──that thread is done──▶ orphaned
/// ```
/// A loop is never owned by a second thread: `orphaned` is for good, so a recycled `pthread_t`
/// never looks like the owner.
enum LoopOwnership: Equatable {
    case unbound
    case owned(UInt)
    case orphaned

    /// The atomic word for each state.
    var word: UInt {
        switch self {
        case .unbound: 0
        case .owned(let thread): thread
        case .orphaned: EventLoop.deadOwner
        }
    }

    init(word: UInt) {
        switch word {
        case 0: self = .unbound
        case EventLoop.deadOwner: self = .orphaned
        default: self = .owned(word)
        }
    }
}

/// A loop's lifecycle as its own thread sees it.
///
/// ```
/// open ──shutdownNow()──▶ shutDown ──deinit──▶ beingFreed
///   └──────────────────── deinit ─────────────────┘
/// ```
/// Once shut down, work posted on the loop's thread is counted as dropped (posts from other
/// threads are counted by the remote queue, closed at the same time); while being freed, nothing
/// may take a new reference to the loop (a job released unrun goes to the fallback queue).
struct LoopLifecycle: Equatable {
    enum Phase: Equatable {
        case open
        case shutDown
        case beingFreed
    }

    private(set) var phase: Phase = .open

    /// Whether the loop accepts no more work (shut down, or being freed).
    var isShutDown: Bool { phase != .open }
    var isBeingFreed: Bool { phase == .beingFreed }

    /// `shutdownNow()`: returns whether this is the first time.
    @discardableResult
    mutating func shutDown() -> Bool {
        guard phase == .open else { return false }
        phase = .shutDown
        return true
    }

    /// `deinit` begins.
    mutating func beginFreeing() { phase = .beingFreed }
}
