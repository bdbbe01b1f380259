import Foundation

/// A signal watcher's end on the loop that watches the signal.
final class SignalSource: Source {
    let signal: Int32
    private var handler: (() -> Void)?
    fileprivate var box: SignalSourceBox?

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
        if let box {
            self.box = nil
            SignalHub.shared.unregister(box)
        }
    }
}

/// Carries a `SignalSource` through the hub. Only `deliver` touches the source, and it does so
/// on the source's own loop (posted there with `execute`). It holds the loop weakly: a signal
/// watcher must not keep its loop alive (the loop closes its sources when it goes).
private final class SignalSourceBox: @unchecked Sendable {
    let source: SignalSource
    weak var loop: EventLoop?
    let signal: Int32
    init(_ source: SignalSource) {
        self.source = source
        self.loop = source.loop
        self.signal = source.signal
    }

    func deliver() {
        loop?.execute(priority: .input) { self.source.fire(.signal) }
    }
}

/// Process-wide signal delivery.
///
/// libevent delivers every signal of the process to one `event_base` (the one that most recently
/// added a signal event), so two loops with signal events would steal each other's signals.
/// Mainspring therefore keeps all signal events on one private loop — the hub, on its own
/// thread — and forwards each signal to the loop that watches it, at `.input` priority. A
/// signal belongs to one loop at a time; several watchers on that loop all run.
final class SignalHub: Sendable {
    static let shared = SignalHub()

    private struct Registration {
        let loop: ObjectIdentifier
        var boxes: [SignalSourceBox]
    }

    private struct State {
        var registrations: [Int32: Registration] = [:]
        var hub: EventLoop?
    }

    private let state = Protected(State())

    /// For tests: runs on the hub thread when the last watcher of a signal is gone and its
    /// libevent handler is about to be removed — the moment a signal can arrive with nobody to
    /// deliver it to.
    nonisolated(unsafe) static var beforeHandlerRemoval: ((Int32, EventLoop) -> Void)?

    /// Routes `signal` to `source` (on its loop).
    /// - Throws: `.signalInUse` if another loop watches the signal; `.libevent` if the signal
    ///   cannot be handled (an invalid number, `SIGKILL`, `SIGSTOP`).
    func register(_ source: SignalSource) throws(EventLoopError) {
        let box = SignalSourceBox(source)
        let signal = source.signal
        let outcome: Result<(EventLoop, Bool), EventLoopError> = state.withLock { state in
            let loopID = ObjectIdentifier(source.loop)
            if var registration = state.registrations[signal] {
                guard registration.loop == loopID else { return .failure(.signalInUse(signal: signal)) }
                guard let hub = state.hub else { return .failure(.loopClosed) }
                registration.boxes.append(box)
                state.registrations[signal] = registration
                return .success((hub, false))
            }
            let hub: EventLoop
            if let existing = state.hub {
                hub = existing
            } else {
                do throws(EventLoopError) {
                    hub = try Self.startHub(&state)
                } catch {
                    return .failure(error)
                }
            }
            state.registrations[signal] = Registration(loop: loopID, boxes: [box])
            return .success((hub, true))
        }
        let (hub, isFirst) = try outcome.get()
        source.box = box
        guard isFirst else { return }
        // Install the handler before returning, so a signal raised right after is delivered.
        let installed = Protected<EventLoopError??>(nil)
        let done = DispatchSemaphore(value: 0)
        hub.execute {
            do throws(EventLoopError) {
                try HubSignalSource.install(signal: signal, on: hub)
                installed.withLock { $0 = .some(nil) }
            } catch {
                installed.withLock { $0 = .some(error) }
            }
            done.signal()
        }
        done.wait()
        if let failure = installed.withLock({ $0 }) ?? nil {
            state.withLock { _ = $0.registrations.removeValue(forKey: signal) }
            source.box = nil
            throw failure
        }
    }

    /// Stops routing the signal to `box`. When it was the signal's last watcher, returns only
    /// once the hub has removed its libevent handler, so the signal's previous disposition is
    /// back: a signal raised after this returns goes there, not to a hub with nobody to tell.
    /// Blocks for one round trip to the hub thread (tens of microseconds); never waits for any
    /// other loop, so it cannot deadlock with a loop that is delivering a signal.
    fileprivate func unregister(_ box: SignalSourceBox) {
        let hubToClear: EventLoop? = state.withLock { state in
            guard var registration = state.registrations[box.signal] else { return nil }
            registration.boxes.removeAll { $0 === box }
            if registration.boxes.isEmpty {
                state.registrations[box.signal] = nil
                return state.hub
            }
            state.registrations[box.signal] = registration
            return nil
        }
        guard let hub = hubToClear else { return }
        let signal = box.signal
        if hub.isCurrent {
            // A watcher's loop freed on the hub thread (the hub holds a loop for a moment while
            // it forwards a signal to it): already where the removal runs.
            removeHandlerIfUnwatched(signal, hub: hub)
            return
        }
        let done = DispatchSemaphore(value: 0)
        hub.execute {
            self.removeHandlerIfUnwatched(signal, hub: hub)
            done.signal()
        }
        done.wait()
    }

    /// Hub thread: removes the signal's libevent handler unless the signal was registered again
    /// meanwhile (then a signal caught in between, when nobody watched, goes to the new watchers).
    private func removeHandlerIfUnwatched(_ signal: Int32, hub: EventLoop) {
        if state.withLock({ $0.registrations[signal] == nil }) {
            Self.beforeHandlerRemoval?(signal, hub)
            HubSignalSource.remove(signal: signal, on: hub)
        } else if HubSignalSource.takeUnwatchedCatch(signal: signal) {
            _ = deliver(signal)
        }
    }

    /// Forwards `signal` to every watcher; `false` when there is none.
    fileprivate func deliver(_ signal: Int32) -> Bool {
        let boxes = state.withLock { $0.registrations[signal]?.boxes ?? [] }
        for box in boxes { box.deliver() }
        return !boxes.isEmpty
    }

    /// Starts the hub loop and its thread. Fails (out of descriptors, say) with the loop's error.
    private static func startHub(_ state: inout State) throws(EventLoopError) -> EventLoop {
        let hub = try EventLoop(configuration: .init(), isMainLoop: false)
        let thread = Thread {
            do {
                try hub.run()
            } catch {
                fatalError("Mainspring: the signal loop failed: \(error)")
            }
        }
        thread.name = "mainspring.signals"
        thread.start()
        state.hub = hub
        return hub
    }
}

/// A libevent signal event on the hub loop. Hub thread only.
///
/// Between the moment the last watcher unregisters and the moment the hub removes the libevent
/// handler, a signal is caught with nobody to deliver it to. `remove` hands such a signal to
/// the restored disposition (raising it again), so it is not lost.
private final class HubSignalSource: Source {
    nonisolated(unsafe) private static var installed: [Int32: HubSignalSource] = [:]  // hub thread only
    let signal: Int32
    /// The disposition libevent replaces (libevent saves the same one and restores it on removal).
    private var previous = sigaction()
    /// Whether a signal was caught when no watcher existed.
    private var caughtUnwatched = false

    private init(signal: Int32, loop: EventLoop) {
        self.signal = signal
        super.init(loop: loop, priority: .input)
    }

    static func install(signal: Int32, on hub: EventLoop) throws(EventLoopError) {
        if installed[signal] != nil { return }
        unblockSignalInCurrentThread(signal)
        let source = HubSignalSource(signal: signal, loop: hub)
        do {
            // Fails only for a number that is no signal, and then so does event_add.
            sigaction(signal, nil, &source.previous)
            let event = try NativeEvent(signal: signal, base: hub.base, target: source)
            try event.add()
            source.native = event
        } catch {
            source.close()
            throw error
        }
        installed[signal] = source
    }

    /// Removes the handler. A signal libevent caught that no watcher saw goes to the restored
    /// disposition: put it back first (so nothing more is caught), collect what was caught until
    /// then, remove the libevent event, and raise such a signal again.
    static func remove(signal: Int32, on hub: EventLoop) {
        guard let source = installed.removeValue(forKey: signal) else { return }
        sigaction(signal, &source.previous, nil)
        // Reads libevent's signal pipe: each signal caught before the line above marks the
        // source pending (only recorded, nothing runs).
        try? hub.base.poll(blocking: false)
        let unwatched = source.caughtUnwatched || !source.pending.isEmpty
        source.close()
        // On this thread (which has the signal unblocked), so the disposition has run — or the
        // process has ended — before the watcher's cancel() returns.
        if unwatched { raise(signal) }
    }

    /// Whether a signal was caught while nobody watched (and forgets it).
    static func takeUnwatchedCatch(signal: Int32) -> Bool {
        guard let source = installed[signal], source.caughtUnwatched else { return false }
        source.caughtUnwatched = false
        return true
    }

    override func perform(_ readiness: Readiness) {
        if !SignalHub.shared.deliver(signal) { caughtUnwatched = true }
    }
}

extension EventLoop {
    /// Calls `handler` on this loop each time the process receives `signal` (several deliveries
    /// that arrive together may be reported once, as with any Unix signal handling).
    ///
    /// Installs a libevent signal handler (replacing the signal's disposition) for as long as a
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
    /// for it on the same loop all run. Loop thread only. The first watcher of a signal and the
    /// cancellation of its last one each block for a round trip to Mainspring's signal thread
    /// (tens of microseconds); that thread never waits for a loop, so neither can deadlock, also
    /// from inside a handler.
    /// - Throws: `EventLoopError.signalInUse` when another loop watches `signal`, `.libevent` when
    ///   it cannot be caught (`SIGKILL`, `SIGSTOP`, an invalid number), `.wrongThread`.
    public func onSignal(_ signal: Int32, _ handler: @escaping () -> Void) throws(EventLoopError) -> Watcher {
        guard claimThread() else { throw .wrongThread(function: "EventLoop.onSignal(_:_:)") }
        if signal > 0 && signal < 65 { unblockSignalInCurrentThread(signal) }
        let source = SignalSource(loop: self, signal: signal, handler: handler)
        do {
            try SignalHub.shared.register(source)
        } catch {
            source.close()
            throw error
        }
        return Watcher(source: source)
    }
}
