/// What few connections use (see `RareState`): the box, made on first use, and its members
/// under their own names.
extension ConnectionSource {
    /// What a connection needs only for the less common calls — senders waiting for the output
    /// to drain, `onWritable` handlers, `waitUntilWritable` and `closed` waiters, an async
    /// connect, `read(until:)` and `read(exactly:)` in progress — kept apart so that the common
    /// connection (reading and answering, its output draining) carries one reference for all
    /// of it, not some 80 bytes of empty collections. Loop thread only.
    final class RareState {
        /// Handlers waiting for the output to drain below half its limit (`onWritable`), once each.
        @exclusivity(unchecked) var writableHandlers: [() -> Void] = []
        /// Handlers waiting for the output to be sent in full (`whenOutputSent`), once each.
        @exclusivity(unchecked) var outputSentHandlers: [() -> Void] = []
        /// Input bytes known to hold no delimiter for the pending `read(until:)`.
        @exclusivity(unchecked) var delimiterScanned = 0
        /// What a `read(exactly:)` longer than the input limit has gathered so far.
        @exclusivity(unchecked) var gathered: [UInt8] = []
        /// Tasks waiting in `send` for the output to drain, in order, each with what it sends.
        @exclusivity(unchecked) var senders: [Sender] = []
        @exclusivity(unchecked) var firstSender = 0
        /// Tasks awaiting `closed` or an async `close()`.
        @exclusivity(unchecked) var closeWaiters: [UnsafeContinuation<Connection.CloseReason, Never>] = []
        /// The task awaiting an async `connect`.
        @exclusivity(unchecked) var connectWaiter: ((Result<Void, EventLoopError>) -> Void)?
        /// Tasks in `waitUntilWritable`, by ticket (a timeout removes its own).
        @exclusivity(unchecked) var writableWaiters: [Int: UnsafeContinuation<Result<Bool, Connection.CloseReason>, Never>] = [:]
        /// Tickets whose task was cancelled before its wait reached the loop.
        @exclusivity(unchecked) var cancelledWaitTickets: Set<Int> = []
        /// `shutdownOutput()` came, with nothing to send, before the connect finished.
        @exclusivity(unchecked) var shutdownWhenConnected = false
        /// The graceful close under way was started by a task's cancellation (`cancel()`).
        @exclusivity(unchecked) var closesForCancellation = false
        /// When output last left (loop clock ns; 0: never) — kept on simulated loops only.
        @exclusivity(unchecked) var outputMovedAt: UInt64 = 0
    }

    /// `rare`, made now if it was not yet (for a write to one of its members).
    var rareState: RareState {
        if let rare { return rare }
        let made = RareState()
        rare = made
        return made
    }

    /// Whether tasks wait in `send` (false without looking further when none ever did).
    var hasWaitingSenders: Bool {
        guard let rare else { return false }
        return rare.firstSender < rare.senders.count
    }
}

// The members of `RareState`, under their own names: reading one of a connection that never
// used it makes nothing (an empty value); assigning an empty value to one makes nothing either;
// any other write makes the box.
extension ConnectionSource {
    var writableHandlers: [() -> Void] {
        get { rare?.writableHandlers ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.writableHandlers = newValue } }
        _modify { yield &rareState.writableHandlers }
    }

    var outputSentHandlers: [() -> Void] {
        get { rare?.outputSentHandlers ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.outputSentHandlers = newValue } }
        _modify { yield &rareState.outputSentHandlers }
    }

    var delimiterScanned: Int {
        get { rare?.delimiterScanned ?? 0 }
        set { if rare != nil || newValue != 0 { rareState.delimiterScanned = newValue } }
    }

    var gathered: [UInt8] {
        get { rare?.gathered ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.gathered = newValue } }
        _modify { yield &rareState.gathered }
    }

    var senders: [Sender] {
        get { rare?.senders ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.senders = newValue } }
        _modify { yield &rareState.senders }
    }

    var firstSender: Int {
        get { rare?.firstSender ?? 0 }
        set { if rare != nil || newValue != 0 { rareState.firstSender = newValue } }
    }

    var closeWaiters: [UnsafeContinuation<Connection.CloseReason, Never>] {
        get { rare?.closeWaiters ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.closeWaiters = newValue } }
        _modify { yield &rareState.closeWaiters }
    }

    var connectWaiter: ((Result<Void, EventLoopError>) -> Void)? {
        get { rare?.connectWaiter }
        set { if rare != nil || newValue != nil { rareState.connectWaiter = newValue } }
    }

    var writableWaiters: [Int: UnsafeContinuation<Result<Bool, Connection.CloseReason>, Never>] {
        get { rare?.writableWaiters ?? [:] }
        set { if rare != nil || !newValue.isEmpty { rareState.writableWaiters = newValue } }
        _modify { yield &rareState.writableWaiters }
    }

    var cancelledWaitTickets: Set<Int> {
        get { rare?.cancelledWaitTickets ?? [] }
        set { if rare != nil || !newValue.isEmpty { rareState.cancelledWaitTickets = newValue } }
        _modify { yield &rareState.cancelledWaitTickets }
    }

    var closesForCancellation: Bool {
        get { rare?.closesForCancellation ?? false }
        set { if rare != nil || newValue { rareState.closesForCancellation = newValue } }
    }

    var shutdownWhenConnected: Bool {
        get { rare?.shutdownWhenConnected ?? false }
        set { if rare != nil || newValue { rareState.shutdownWhenConnected = newValue } }
    }
}
