import Synchronization

/// The counters of an `HTTPServer`: atomics, readable from any thread (for `/metrics`).
public final class HTTPServerStatistics: Sendable {
    private let informational = Atomic<Int>(0)
    private let successful = Atomic<Int>(0)
    private let redirection = Atomic<Int>(0)
    private let clientError = Atomic<Int>(0)
    private let serverError = Atomic<Int>(0)
    private let inFlight = Atomic<Int>(0)
    private let open = Atomic<Int>(0)
    private let accepted = Atomic<Int>(0)
    private let timedOut = Atomic<Int>(0)
    private let shed = Atomic<Int>(0)
    private let pastDeadline = Atomic<Int>(0)
    private let overLimit = Atomic<Int>(0)

    init() {}

    /// A snapshot of the counters.
    public struct Snapshot: Sendable, Equatable {
        /// Responses sent, by status class: `responses["2xx"]`, … (`1xx` through `5xx`).
        public var responses: [String: Int]
        /// Requests read in full whose response is not written yet.
        public var requestsInFlight: Int
        /// Connections open now.
        public var connectionsOpen: Int
        /// Connections accepted since the start.
        public var connectionsAccepted: Int
        /// Connections closed because a request arrived too slowly (head or body past its
        /// timeout).
        public var connectionsTimedOut: Int
        /// Requests answered `503` by load shedding because their loop's p99 queue wait was over
        /// the target (see ``HTTPServer/LoadShedding``).
        public var requestsShed: Int = 0
        /// Requests answered `503` by load shedding because they waited past their deadline.
        public var requestsPastDeadline: Int = 0
        /// Requests answered `503` because their route had as many in flight as its limit
        /// (`HTTPRoutes.limitConcurrency`).
        public var requestsOverLimit: Int = 0
    }

    /// The counters now. Any thread.
    public var snapshot: Snapshot {
        let responses = ["1xx": informational.load(ordering: .relaxed), "2xx": successful.load(ordering: .relaxed),
                         "3xx": redirection.load(ordering: .relaxed), "4xx": clientError.load(ordering: .relaxed),
                         "5xx": serverError.load(ordering: .relaxed)]
        return Snapshot(responses: responses, requestsInFlight: inFlight.load(ordering: .relaxed),
                        connectionsOpen: open.load(ordering: .relaxed), connectionsAccepted: accepted.load(ordering: .relaxed),
                        connectionsTimedOut: timedOut.load(ordering: .relaxed), requestsShed: shed.load(ordering: .relaxed),
                        requestsPastDeadline: pastDeadline.load(ordering: .relaxed),
                        requestsOverLimit: overLimit.load(ordering: .relaxed))
    }

    func recordResponse(status: Int) {
        switch status / 100 {
        case 1: informational.add(1, ordering: .relaxed)
        case 2: successful.add(1, ordering: .relaxed)
        case 3: redirection.add(1, ordering: .relaxed)
        case 4: clientError.add(1, ordering: .relaxed)
        default: serverError.add(1, ordering: .relaxed)
        }
    }

    func requestShed() { shed.add(1, ordering: .relaxed) }
    func requestPastDeadline() { pastDeadline.add(1, ordering: .relaxed) }
    func requestOverLimit() { overLimit.add(1, ordering: .relaxed) }

    func requestStarted() { inFlight.add(1, ordering: .relaxed) }
    func requestFinished() { inFlight.subtract(1, ordering: .relaxed) }

    /// Returns the number of connections open now, this one included.
    func connectionOpened() -> Int {
        accepted.add(1, ordering: .relaxed)
        return open.add(1, ordering: .relaxed).newValue
    }

    /// Returns the number of connections still open.
    func connectionClosed(timedOut didTimeOut: Bool) -> Int {
        if didTimeOut { timedOut.add(1, ordering: .relaxed) }
        return open.subtract(1, ordering: .relaxed).newValue
    }
}
