/// Something registered that can be cancelled: a timer (`TimerHandle`), an fd, line or signal
/// watcher (`Watcher`), a drain hook (`DrainHook`, in `MainspringPatterns`). Every such handle has the same shape:
///
/// - `cancel()` is idempotent. Once it returns, the callback is never started again, even if
///   its event was already due; a run already in progress finishes.
/// - `isCancelled` is true once the registration is over: cancelled, or ended on its own (a
///   one-shot timer that fired, a line reader at end of file).
/// - Dropping the handle does **not** cancel: what it refers to stays registered until it is
///   cancelled or ends.
///
/// Which thread may call `cancel()` is the handle's own rule: loop-bound handles (`TimerHandle`,
/// `Watcher`) on their loop's thread, `DrainHook` from any thread.
public protocol Cancellable: AnyObject {
    /// Ends the registration; see the protocol's rules.
    func cancel()
    /// Whether the registration is over (cancelled, or ended on its own).
    var isCancelled: Bool { get }
}

/// The implementation behind `Watcher`: a weak reference to the source (the loop keeps the
/// source alive while it is registered). `TimerHandle` holds its timer strongly instead (a weak
/// reference costs every retain of a timer the slow path; see there).
struct SourceReference {
    private weak var source: Source?

    init(_ source: Source) { self.source = source }

    /// Closes the source on its loop's thread (precondition, naming `function`).
    func cancel(_ function: StaticString) {
        guard let source else { return }
        source.loop.preconditionOnLoop(function)
        source.close()
    }

    var isCancelled: Bool { source?.isClosed ?? true }
}
