/// The sockets a service manager passed to this process (socket activation, `sd_listen_fds(3)`):
/// `$LISTEN_FDS` descriptors from 3 on, meant for the process `$LISTEN_PID`, named by
/// `$LISTEN_FDNAMES` (colon-separated; a `.socket` unit's `FileDescriptorName=`).
///
/// The manager binds the sockets before the service starts — clients can connect while it
/// starts or restarts, their connections wait in the backlog — and may start the service only
/// when the first client arrives. The service accepts on them with
/// ``Listener/init(_:on:group:options:accept:)`` with ``Listener/Endpoint/activated(_:)``.
///
/// ```swift
/// let activated = try ActivatedSockets.fromEnvironment()
/// if let socket = activated.first(named: "line") ?? activated.sockets.first {
///     listener = try Listener(.activated(socket), on: loop, group: group) { … }
/// } else {
///     listener = try Listener(.tcp(port: 7000), on: loop, group: group) { … }
/// }
/// ```
public struct ActivatedSockets: Sendable {
    /// One passed descriptor.
    public struct Socket: Sendable, Hashable, CustomStringConvertible {
        /// The descriptor: 3 for the first, 4 for the second, …
        public let descriptor: Int32
        /// Its position among the passed descriptors, from 0.
        public let index: Int
        /// Its name from `$LISTEN_FDNAMES`, or nil when the manager passed no names.
        public let name: String?

        public var description: String {
            "descriptor \(descriptor)" + (name.map { " named '\($0)'" } ?? "")
        }
    }

    /// The passed descriptors, in order.
    public let sockets: [Socket]
    /// Why variables that were set were ignored, or nil: `$LISTEN_PID` names another process
    /// (the variables were inherited from a parent they were meant for), or `$LISTEN_FDS` came
    /// without `$LISTEN_PID`. Worth a warning: the program probably expected sockets.
    public let ignoredReason: String?

    /// Whether no descriptors were passed.
    public var isEmpty: Bool { sockets.isEmpty }

    /// The first socket named `name` (names need not be unique), or nil.
    public func first(named name: String) -> Socket? { sockets.first { $0.name == name } }

    /// The sockets passed to this process. The first call reads `$LISTEN_PID`, `$LISTEN_FDS`
    /// and `$LISTEN_FDNAMES`, checks that every passed descriptor is open, marks them
    /// close-on-exec, and removes the three variables from the environment, so that child
    /// processes inherit neither the descriptors nor the variables. Later calls return the
    /// same result (or throw the same error).
    ///
    /// Call it early, before other threads may read the environment (changing the environment
    /// is not thread-safe in C), as `sd_listen_fds(1)` would be. The descriptors are not checked
    /// to be sockets here (a manager may pass FIFOs too); adopting one as a ``Listener`` checks
    /// that it is a listening stream socket.
    ///
    /// When `$LISTEN_PID` names another process, or `$LISTEN_FDS` is set without it, the
    /// result is empty and ``ignoredReason`` says why.
    ///
    /// - Throws: ``ServiceEnvironmentError/invalidValue(variable:value:expected:)`` for a
    ///   malformed `LISTEN_PID`, a `LISTEN_FDS` that is not a number from 0 to the descriptor
    ///   limit less 3, or a `LISTEN_FDNAMES` with the wrong number of names or an invalid one
    ///   (over 255 bytes, a control character); ``ServiceEnvironmentError/passedDescriptorNotOpen(descriptor:count:)``
    ///   when `LISTEN_FDS=999` names descriptors that were never passed.
    public static func fromEnvironment() throws(ServiceEnvironmentError) -> ActivatedSockets {
        try takenFromEnvironment.get()
    }

    private static let takenFromEnvironment: Result<ActivatedSockets, ServiceEnvironmentError> = {
        let environment = currentEnvironment()
        defer {
            for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] { removeEnvironmentVariable(name) }
        }
        do throws(ServiceEnvironmentError) {
            let parsed = try parse(environment, processID: currentProcessID(), descriptorLimit: descriptorLimit())
            for socket in parsed.sockets where setCloseOnExec(socket.descriptor) != nil {
                throw .passedDescriptorNotOpen(descriptor: socket.descriptor, count: parsed.sockets.count)
            }
            return .success(parsed)
        } catch {
            return .failure(error)
        }
    }()

    /// The first passed descriptor (`SD_LISTEN_FDS_START`).
    static let firstDescriptor: Int32 = 3

    /// What the variables in `environment` say, for the process `processID` (no descriptor is
    /// touched).
    static func parse(_ environment: [String: String], processID: Int32, descriptorLimit: Int?)
        throws(ServiceEnvironmentError) -> ActivatedSockets
    {
        let countText = environment["LISTEN_FDS"]
        guard let pidText = environment["LISTEN_PID"] else {
            let reason = countText.map {
                "LISTEN_FDS=\($0.prefix(32)) is set without LISTEN_PID, so the descriptors may be meant for another process: ignored"
            }
            return ActivatedSockets(sockets: [], ignoredReason: reason)
        }
        guard let pid = Int32(pidText), pid > 0 else {
            throw .invalidValue(variable: "LISTEN_PID", value: pidText, expected: "a process id (a positive number)")
        }
        guard pid == processID else {
            return ActivatedSockets(sockets: [], ignoredReason: "LISTEN_PID=\(pid) names another process (this one is \(processID)): its descriptors are not ours, ignored")
        }
        guard let countText else { return ActivatedSockets(sockets: [], ignoredReason: nil) }
        let maximum = max(0, (descriptorLimit ?? Int(Int32.max)) - Int(firstDescriptor))
        guard let count = Int(countText), count >= 0, count <= maximum else {
            throw .invalidValue(variable: "LISTEN_FDS", value: countText,
                                expected: "a number of descriptors from 0 to \(maximum) (the descriptor limit less 3)")
        }
        var names: [String?] = Array(repeating: nil, count: count)
        if let namesText = environment["LISTEN_FDNAMES"], count > 0 {
            let given = namesText.split(separator: ":", omittingEmptySubsequences: false)
            guard given.count == count else {
                throw .invalidValue(variable: "LISTEN_FDNAMES", value: namesText,
                                    expected: "\(count) name(s) separated by ':', one per LISTEN_FDS descriptor")
            }
            for (index, name) in given.enumerated() {
                guard name.utf8.count <= 255, !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) else {
                    throw .invalidValue(variable: "LISTEN_FDNAMES", value: namesText,
                                        expected: "names of at most 255 bytes without control characters (name #\(index) is not)")
                }
                names[index] = String(name)
            }
        }
        let sockets = (0..<count).map { Socket(descriptor: firstDescriptor + Int32($0), index: $0, name: names[$0]) }
        return ActivatedSockets(sockets: sockets, ignoredReason: nil)
    }
}

extension Listener {
    /// Accepts on a socket passed by socket activation: ``init(adopting:on:group:options:accept:)``
    /// with `socket`'s descriptor, whose rules apply (it must be a listening stream socket;
    /// the listener owns it from then on). Adopt each socket once.
    ///
    /// Must be called on `loop`'s thread.
    /// - Throws: `EventLoopError.notListeningSocket` when the descriptor is not a listening
    ///   stream socket (a manager's `ListenDatagram=` or `ListenFIFO=`, say); `.system`,
    ///   `.libevent`, `.wrongThread`.
    @available(*, deprecated, message: "use Listener(.activated(_:), on:group:options:accept:)")
    public convenience init(activatedSocket socket: ActivatedSockets.Socket, on loop: EventLoop,
                            group: EventLoopGroup? = nil, options: Connection.Options = .init(),
                            accept: @escaping @Sendable (Connection) -> Void) throws(EventLoopError)
    {
        try self.init(adopting: socket.descriptor, on: loop, group: group, options: options, accept: accept)
    }

    /// Accepts on a socket passed by socket activation, queueing the accepted connections for
    /// `connections` (the async form of ``init(activatedSocket:on:group:options:accept:)``, whose
    /// rules apply). Any task.
    /// - Throws: `EventLoopError.notListeningSocket`, `.system`, `.libevent`, `.loopClosed`.
    @available(*, deprecated, message: "use Listener(.activated(_:), on:group:options:) async")
    public convenience init(activatedSocket socket: ActivatedSockets.Socket, on loop: EventLoop,
                            group: EventLoopGroup? = nil, options: Connection.Options = .init())
        async throws(EventLoopError)
    {
        try await self.init(adopting: socket.descriptor, on: loop, group: group, options: options)
    }
}
