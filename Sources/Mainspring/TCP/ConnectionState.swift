/// The lifecycle of one connection, as a value: every event the connection sees is a method
/// that changes the state and returns what the connection must do about it (enable or disable
/// reading, shut the output down, report the close, …). `ConnectionSource` holds one, applies
/// the returned actions to its socket, and keeps no lifecycle flags of its own; the transitions
/// are tested alone, without sockets (`ConnectionStateTests`).
///
/// ```
///  connecting ──connected──▶ open ──close()──▶ closing ──output sent / closeTimeout──▶ closed(reason)
///       │                     │                   │
///       └──────── error, idle timeout, cancel, the loop going away ──────────────────▶ closed(reason)
/// ```
///
/// While open, two sub-states run side by side:
/// - **input**: reading starts with the first reader and goes on while the output is not over
///   its limit (`isOutputPaused`) and the input buffer is not full (`isInputFull`); the peer's
///   end (`peerEnded`) and its delivery to a reader (`isEndDelivered`) are recorded;
/// - **output**: flowing or paused (over `outputLimit`, until it drains to half), and the
///   half-close (`outputShutdown`: none, requested until the output is empty, done).
struct ConnectionState: Sendable {
    enum Phase: Equatable, Sendable {
        /// An outgoing connect is in progress: output is buffered, nothing is read yet.
        case connecting
        /// Established.
        case open
        /// `close()` was called: nothing more is read or delivered, and the output is being
        /// sent (until it is empty, or `closeTimeout` passes).
        case closing
        /// Closed for good; the reason is reported once.
        case closed(Connection.CloseReason)
    }

    /// The output's half-close.
    enum OutputShutdown: Equatable, Sendable {
        case none
        /// `shutdownOutput()` was called: the write side shuts once the output is empty.
        case requested
        /// Shut: the peer reads end of file.
        case done
    }

    /// What to do to the socket's read side.
    enum ReadChange: Equatable, Sendable {
        case enable
        case disable
    }

    /// What the output draining calls for (`outputDrained`).
    struct DrainActions: OptionSet, Sendable {
        let rawValue: UInt8
        /// Closing, and the output is empty: close now (`.closed`).
        static let finishClosing = DrainActions(rawValue: 1 << 0)
        /// A requested half-close can happen now.
        static let shutdownWrite = DrainActions(rawValue: 1 << 1)
        /// The output drained to half its limit: waiting senders may write, input may be
        /// delivered again (and reading resumes: see `readChange`).
        static let resumeFlow = DrainActions(rawValue: 1 << 2)
    }

    private(set) var phase: Phase
    /// A reader started once: from then on the socket is read (up to the input limit) whenever
    /// nothing holds it back.
    private(set) var isReading = false
    /// Buffered output is over the limit: reading and delivery pause until it drains to half.
    private(set) var isOutputPaused = false
    /// libevent's input buffer is at the input limit: the socket is not read until a reader
    /// takes some.
    private(set) var isInputFull = false
    /// The peer ended its side of the connection.
    private(set) var peerEnded = false
    /// The end of the input was delivered to a reader.
    private(set) var isEndDelivered = false
    private(set) var outputShutdown: OutputShutdown = .none
    /// Whether reading is enabled on the socket right now (what the last `ReadChange` did).
    private(set) var isReadEnabled = false

    init(connected: Bool) {
        phase = connected ? .open : .connecting
    }

    // MARK: Reading the state

    /// Connecting or open: reads and writes are accepted.
    var isOpen: Bool {
        switch phase {
        case .connecting, .open: true
        case .closing, .closed: false
        }
    }

    var isClosing: Bool { phase == .closing }

    var closeReason: Connection.CloseReason? {
        if case .closed(let reason) = phase { return reason }
        return nil
    }

    var isClosed: Bool { closeReason != nil }

    var isConnected: Bool {
        switch phase {
        case .connecting: false
        default: true
        }
    }

    /// Whether the socket should be read now.
    var wantsReading: Bool { isReading && isOpen && !isOutputPaused && !isInputFull }

    /// Whether input may be handed to a reader now (not while the output is over its limit,
    /// nor once closing).
    var mayDeliver: Bool { isOpen && !isOutputPaused }

    // MARK: Events

    /// Brings the socket's read side in line with `wantsReading`; the change to make, if any.
    mutating func readChange() -> ReadChange? {
        let wanted = wantsReading
        guard wanted != isReadEnabled else { return nil }
        isReadEnabled = wanted
        return wanted ? .enable : .disable
    }

    /// A reader (callbacks, or the first async read) starts. Returns false once closing or
    /// closed (nothing will be read); then `readChange()` says what to do.
    mutating func startReading() -> Bool {
        guard isOpen else { return false }
        isReading = true
        return true
    }

    /// The outgoing connect succeeded. Returns whether this is news (a waiting `connect` is to
    /// be resumed).
    mutating func connected() -> Bool {
        guard phase == .connecting else { return false }
        phase = .open
        return true
    }

    /// The input buffer reached the input limit.
    mutating func inputFilled() { isInputFull = true }

    /// A reader took input and the buffer is below the limit again. Returns whether it was full.
    mutating func inputDrained() -> Bool {
        guard isInputFull else { return false }
        isInputFull = false
        return true
    }

    /// The peer ended its side. Returns whether the input is to be looked at (to deliver the
    /// end), which it is not once closing.
    mutating func peerDidEnd() -> Bool {
        peerEnded = true
        return isOpen
    }

    /// A reader was given the end of the input.
    mutating func endDelivered() { isEndDelivered = true }

    /// `length` bytes of output are buffered. Returns true when this crosses `limit`: reading
    /// pauses (see `readChange()`), and the socket should report draining at half the limit.
    mutating func outputGrew(to length: Int, limit: Int) -> Bool {
        guard !isOutputPaused, length > limit else { return false }
        isOutputPaused = true
        return true
    }

    /// The output drained to `length` bytes.
    mutating func outputDrained(to length: Int, limit: Int) -> DrainActions {
        if phase == .closing { return length == 0 ? .finishClosing : [] }
        guard isOpen else { return [] }
        var actions: DrainActions = []
        if outputShutdown == .requested && length == 0 {
            outputShutdown = .done
            actions.insert(.shutdownWrite)
        }
        if isOutputPaused && length <= limit / 2 {
            isOutputPaused = false
            actions.insert(.resumeFlow)
        }
        return actions
    }

    /// `shutdownOutput()`. Returns whether the write side can shut now (`outputLength` is 0);
    /// otherwise it shuts when the output has drained.
    mutating func shutdownOutputRequested(outputLength: Int) -> Bool {
        guard isOpen, outputShutdown == .none else { return false }
        if outputLength == 0 {
            outputShutdown = .done
            return true
        }
        outputShutdown = .requested
        return false
    }

    /// What `close()` does.
    enum CloseStep: Equatable, Sendable {
        /// Nothing is left to send: close now (`.closed`).
        case finish
        /// Send what is buffered first (the socket reports draining at 0, with `closeTimeout`).
        case flush
    }

    /// `close()` with `outputLength` bytes buffered: nil when already closing or closed.
    mutating func closeRequested(outputLength: Int) -> CloseStep? {
        guard isOpen else { return nil }
        phase = .closing
        return outputLength == 0 ? .finish : .flush
    }

    /// The socket timed out: an idle connection's reason, or the end of a close whose output
    /// could not be sent within `closeTimeout` (still `.closed`).
    var timeoutReason: Connection.CloseReason { phase == .closing ? .closed : .idleTimeout }

    /// The connection ends with `reason`. Returns false when it had ended already (the first
    /// reason stands).
    mutating func finish(_ reason: Connection.CloseReason) -> Bool {
        guard !isClosed else { return false }
        phase = .closed(reason)
        isReadEnabled = false
        return true
    }
}
