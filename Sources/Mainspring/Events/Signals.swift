#if canImport(Glibc)
import Glibc
#endif

/// A signal watcher's end on the loop that watches the signal: runs its handler when the
/// signal's dispatcher fires it.
final class SignalSource: Source {
    let signal: Int32
    private var handler: (() -> Void)?
    /// Whether the registry holds this watcher (it unregisters once, when it closes).
    fileprivate var isRegistered = false

    init(loop: EventLoop, signal: Int32, handler: @escaping () -> Void) {
        self.signal = signal
        self.handler = handler
        super.init(loop: loop, priority: .input)
    }

    /// Runs once when the watcher closes (cancelled, or the loop going away).
    var onClosed: (() -> Void)?
    /// Async operations suspended on this watcher (the task iterating `EventLoop.signals`).
    var suspendedTasks: () -> Int = { 0 }

    override func perform(_ readiness: Readiness) { handler?() }

    override func didClose() {
        handler = nil
        let closed = onClosed
        onClosed = nil
        closed?()
        if isRegistered {
            isRegistered = false
            SignalRegistry.shared.unregister(self)
        }
    }
}

/// The signals one loop watches: their eventfds, polled together. When any is readable, it
/// takes the catches of each and fires the watchers, signal by signal in the order the signals
/// were first caught — so that a SIGHUP caught before a SIGTERM is handled before it, even when
/// the loop sees both in one poll. (Signals the kernel has pending together are caught lowest
/// number first: Mainspring's handler runs with every other signal blocked, so handlers never
/// nest.)
final class LoopSignalSource: Source {
    private var events: [Int32: (descriptor: Int32, event: NativeEvent)] = [:]

    init(loop: EventLoop) {
        super.init(loop: loop, priority: .input)
    }

    var isEmpty: Bool { events.isEmpty }

    /// Starts polling `signal`'s eventfd.
    func add(_ signal: Int32, descriptor: Int32) throws(EventLoopError) {
        let event = try NativeEvent(base: loop.base, fd: descriptor, readiness: .read, persistent: true, target: self)
        try event.add()
        events[signal] = (descriptor, event)
    }

    /// Stops polling `signal`'s eventfd.
    func remove(_ signal: Int32) {
        events.removeValue(forKey: signal)?.event.delete()
    }

    override func perform(_ readiness: Readiness) {
        var caught: [(order: UInt, signal: Int32)] = []
        for (signal, watched) in events {
            resetEventCounter(watched.descriptor)
            let (count, order) = takeSignalCatches(signal)
            if count > 0 { caught.append((order, signal)) }
        }
        caught.sort { $0.order < $1.order }
        for (_, signal) in caught {
            for watcher in SignalRegistry.shared.watchers(of: signal, on: loop) { watcher.fire(.signal) }
        }
    }

    override func didClose() {
        for (_, watched) in events { watched.event.delete() }
        events = [:]
        SignalRegistry.shared.forget(self, of: ObjectIdentifier(loop))
    }
}

/// Process-wide signal delivery: which loop watches each signal, its watchers, and the
/// disposition it replaced.
///
/// Mainspring catches a signal with a handler of its own (`System/SignalCalls.swift`): it
/// counts the catch and writes the signal's eventfd, which the watching loop polls like any
/// descriptor (`LoopSignalSource`). Installing and removing the handler are `sigaction` calls
/// made by the thread that watches or cancels — no thread of its own, no round trip, no
/// blocking: once `onSignal` returns the signal is caught, once the last `cancel()` returns the
/// previous disposition is back. A catch that lands between the last watcher leaving and the
/// disposition coming back is raised again once it is back (on the cancelling thread, with the
/// signal unblocked there for the moment), so it is not lost.
///
/// One eventfd per signal number, made the first time the signal is watched and never closed:
/// the handler may write it at any moment, and a closed number could by then be another file.
final class SignalRegistry: Sendable {
    static let shared = SignalRegistry()

    private struct Registration {
        let loop: ObjectIdentifier
        var watchers: [LoopBound<SignalSource>]
        let previous: SavedDisposition
    }

    private struct State {
        var registrations: [Int32: Registration] = [:]
        var descriptors: [Int32: Int32] = [:]
        /// The signal source of each loop that watches signals.
        var loopSources: [ObjectIdentifier: LoopBound<LoopSignalSource>] = [:]
    }

    private let state = Protected(State())

    /// For tests: runs (on the cancelling thread, inside the registry's lock) when the last
    /// watcher of a signal is gone and just before its previous disposition is put back — the
    /// moment a signal can arrive with nobody to deliver it to.
    nonisolated(unsafe) static var beforeRestore: ((Int32) -> Void)?

    /// Routes `signal` to `source`, on its loop's thread.
    /// - Throws: `.signalInUse` if another loop watches the signal; `.system` if it cannot be
    ///   caught (`SIGKILL`, `SIGSTOP`, a number that is no signal) or no eventfd can be made.
    func register(_ source: SignalSource) throws(EventLoopError) {
        let signal = source.signal
        guard isSignalNumber(signal) else { throw .system(function: "sigaction(\(signal))", errno: EINVAL) }
        let loop = source.loop
        var abandoned: LoopBound<LoopSignalSource>?
        let outcome: Result<Void, EventLoopError> = state.withLock { state in
            let loopID = ObjectIdentifier(loop)
            if var registration = state.registrations[signal] {
                guard registration.loop == loopID else { return .failure(.signalInUse(signal: signal)) }
                registration.watchers.append(LoopBound(source))
                state.registrations[signal] = registration
                return .success(())
            }
            do throws(EventLoopError) {
                let descriptor: Int32
                if let existing = state.descriptors[signal] {
                    descriptor = existing
                } else {
                    descriptor = try makeEventCounter()
                    state.descriptors[signal] = descriptor
                }
                // Stale catches and wake-ups of an earlier watch are not this one's.
                resetEventCounter(descriptor)
                _ = takeSignalCatches(signal)
                let loopSource = state.loopSources[loopID]?.value ?? LoopSignalSource(loop: loop)
                state.loopSources[loopID] = LoopBound(loopSource)
                let previous: SavedDisposition
                do throws(EventLoopError) {
                    try loopSource.add(signal, descriptor: descriptor)
                    previous = try installSignalHandler(signal, writing: descriptor)
                } catch {
                    loopSource.remove(signal)
                    if loopSource.isEmpty {
                        state.loopSources[loopID] = nil
                        abandoned = LoopBound(loopSource)  // closed after the lock
                    }
                    throw error
                }
                state.registrations[signal] = Registration(loop: loopID, watchers: [LoopBound(source)],
                                                           previous: previous)
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        abandoned?.value.close()
        try outcome.get()
        source.isRegistered = true
    }

    /// Stops routing the signal to `source`. When it was the signal's last watcher, the
    /// previous disposition is back when this returns, and a signal caught in between has been
    /// raised again to reach it.
    fileprivate func unregister(_ source: SignalSource) {
        let signal = source.signal
        let loop = source.loop
        let ended = state.withLock { state -> (loopSource: LoopBound<LoopSignalSource>?, caught: Bool)? in
            guard var registration = state.registrations[signal] else { return nil }
            registration.watchers.removeAll { $0.value === source }
            guard registration.watchers.isEmpty else {
                state.registrations[signal] = registration
                return nil
            }
            state.registrations[signal] = nil
            Self.beforeRestore?(signal)
            restoreSignalDisposition(signal, registration.previous)
            let caught = takeSignalCatches(signal).count > 0
            guard let loopSource = state.loopSources[registration.loop] else { return (nil, caught) }
            // The loop's signal source is on the watcher's loop: changed now on its thread; a
            // loop being freed elsewhere closes it with the rest of its sources.
            guard loop.isCurrent else { return (nil, caught) }
            loopSource.value.remove(signal)
            guard loopSource.value.isEmpty else { return (nil, caught) }
            state.loopSources[registration.loop] = nil
            return (loopSource, caught)
        }
        guard let ended else { return }
        ended.loopSource?.value.close()
        if ended.caught { raiseUnblocked(signal) }
    }

    /// The watchers of `signal` on `loop` (a copy), for its signal source.
    fileprivate func watchers(of signal: Int32, on loop: EventLoop) -> [SignalSource] {
        state.withLock { state in
            guard let registration = state.registrations[signal], registration.loop == ObjectIdentifier(loop) else {
                return []
            }
            return registration.watchers.map(\.value)
        }
    }

    /// A loop is going away: forgets its signal source (its watchers unregister as they close).
    func forget(_ loopSource: LoopSignalSource, of loopID: ObjectIdentifier) {
        state.withLock { state in
            if state.loopSources[loopID]?.value === loopSource { state.loopSources[loopID] = nil }
        }
    }
}

extension EventLoop {
    /// Calls `handler` on this loop each time the process receives `signal` (several deliveries
    /// that arrive together may be reported once, as with any Unix signal handling).
    ///
    /// Installs Mainspring's handler for the signal (replacing its disposition) for as long as a
    /// watcher exists. The hand-over is synchronous both ways:
    /// - once `onSignal` returns, the signal reaches the handler (`raise` right after works);
    /// - cancelling the last watcher of the signal (`Watcher.cancel()`, or its loop ending)
    ///   returns only once the previous disposition is back, so a signal raised after it goes
    ///   there (a `SIGTERM` terminates again). A signal that arrives while the last watcher is
    ///   being cancelled is not lost either: it goes to the previous disposition (raised again
    ///   once that is restored). One already handed to a watcher and not yet handled when that
    ///   watcher is cancelled is dropped with it: after `cancel()` the handler never runs.
    ///
    /// The signal is unblocked on this thread (threads started by libdispatch, and their
    /// children, begin with signals blocked), so `raise(signal)` here reaches the handler.
    /// Handlers run at `.input` priority. A signal belongs to one loop at a time; more watchers
    /// for it on the same loop all run. Loop thread only. Neither the first watcher of a signal
    /// nor the cancellation of its last one waits for anything: each is a `sigaction` call on
    /// this thread (and, the first time a signal is watched, an eventfd that stays for good).
    /// - Throws: `EventLoopError.signalInUse` when another loop watches `signal`, `.system`
    ///   (`sigaction`, `EINVAL`) when it cannot be caught (`SIGKILL`, `SIGSTOP`, a number that is
    ///   no signal), `.wrongThread`.
    @available(*, noasync, message: "loop thread only; in async code iterate `signals(_:)`")
    public func onSignal(_ signal: Int32, _ handler: @escaping () -> Void) throws(EventLoopError) -> Watcher {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.onSignal(_:_:)") }
        if signal > 0 && signal < 65 { unblockSignalInCurrentThread(signal) }
        let source = SignalSource(loop: self, signal: signal, handler: handler)
        do {
            try SignalRegistry.shared.register(source)
        } catch {
            source.close()
            throw error
        }
        return Watcher(source: source)
    }
}
