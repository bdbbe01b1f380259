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
        hub.execute {
            // Only remove the libevent event if nobody registered the signal again meanwhile.
            if self.state.withLock({ $0.registrations[signal] == nil }) {
                HubSignalSource.remove(signal: signal)
            }
        }
    }

    fileprivate func deliver(_ signal: Int32) {
        let boxes = state.withLock { $0.registrations[signal]?.boxes ?? [] }
        for box in boxes { box.deliver() }
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
private final class HubSignalSource: Source {
    nonisolated(unsafe) private static var installed: [Int32: HubSignalSource] = [:]  // hub thread only
    let signal: Int32

    private init(signal: Int32, loop: EventLoop) {
        self.signal = signal
        super.init(loop: loop, priority: .input)
    }

    static func install(signal: Int32, on hub: EventLoop) throws(EventLoopError) {
        if installed[signal] != nil { return }
        unblockSignalInCurrentThread(signal)
        let source = HubSignalSource(signal: signal, loop: hub)
        do {
            let event = try NativeEvent(signal: signal, base: hub.base, target: source)
            try event.add()
            source.native = event
        } catch {
            source.close()
            throw error
        }
        installed[signal] = source
    }

    static func remove(signal: Int32) {
        installed.removeValue(forKey: signal)?.close()
    }

    override func perform(_ readiness: Readiness) { SignalHub.shared.deliver(signal) }
}

extension EventLoop {
    /// Calls `handler` on this loop each time the process receives `signal` (several deliveries
    /// that arrive together may be reported once, as with any Unix signal handling).
    ///
    /// Installs a libevent signal handler (replacing the signal's default action) for as long as
    /// a watcher exists; cancelling the last one restores the previous disposition. The signal is
    /// unblocked on this thread (threads started by libdispatch, and their children, begin with
    /// signals blocked), so `raise(signal)` here reaches the handler. Handlers run
    /// at `.input` priority. A signal belongs to one loop at a time; more watchers for it on the
    /// same loop all run. Loop thread only; may block briefly while the handler is installed.
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
