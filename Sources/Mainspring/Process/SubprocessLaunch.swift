#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// Spawning: the program found, the descriptors made, the child started, its exit watched.
extension Subprocess {
    /// Whether `pidfd_open` works in this process: 0 not known yet, 1 yes, 2 no (ENOSYS).
    static let pidfdSupport = Atomic<Int>(0)

    /// The spawn itself, on the loop's thread; `forcePolling` (tests) watches the exit as if
    /// pidfds were missing.
    static func start(_ configuration: Configuration, on loop: EventLoop, forcePolling: Bool = false)
        throws(SubprocessError) -> Subprocess
    {
        configuration.pipeOptions.check("Subprocess.launch")
        try refuseNULs(configuration)
        return try loop.world.spawn(configuration, on: loop, forcePolling: forcePolling)
    }

    /// The spawn of a real child: `posix_spawn`, its pipes, its exit watched by a pidfd (or
    /// polled). On the loop's thread.
    static func startChild(_ configuration: Configuration, on loop: EventLoop, forcePolling: Bool) throws(SubprocessError)
        -> Subprocess
    {
        let name = configuration.executable
        let path = try resolveExecutable(configuration)
        if let directory = configuration.workingDirectory, !spawnCanChangeDirectory {
            throw .cannotStart(executable: name, path: directory, errno: ENOSYS)
        }
        var descriptors = LaunchDescriptors()
        defer { descriptors.closeChildEnds() }
        var stdio: [ChildDescriptor] = []
        let redirections = [configuration.standardInput, configuration.standardOutput, configuration.standardError]
        for (index, redirection) in redirections.enumerated() {
            switch redirection {
            case .inherit:
                stdio.append(.inherit)
            case .null:
                stdio.append(.null)
            case .mergedIntoStandardOutput:
                requireUsage(index == 2, "Mainspring: Subprocess.launch: only standardError can be .mergedIntoStandardOutput, not \(streamNames[index])")
                stdio.append(.standardOutput)
            case .pipe:
                switch makeChildPipe(parentReads: index > 0) {
                case .success(let ends):
                    descriptors.parent[index] = ends.parent
                    descriptors.child.append(ends.child)
                    stdio.append(.descriptor(ends.child))
                case .failure(let error):
                    descriptors.closeParentEnds()
                    throw .system(function: "pipe2 (for the \(streamNames[index]) of '\(name)')", errno: error.code)
                }
            case .file(let file), .appendingToFile(let file):
                let appending = redirection == .appendingToFile(file)
                switch openForChild(file, reading: index == 0, appending: appending) {
                case .success(let fd):
                    descriptors.child.append(fd)
                    stdio.append(.descriptor(fd))
                case .failure(let error):
                    descriptors.closeParentEnds()
                    throw .cannotStart(executable: name, path: file, errno: error.code)
                }
            }
        }
        let environment = configuration.environment.map { variables in
            variables.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        }
        let pid: Int32
        switch spawnChild(path: path, arguments: [name] + configuration.arguments, environment: environment,
                          directory: configuration.workingDirectory, stdio: stdio,
                          newProcessGroup: configuration.newProcessGroup)
        {
        case .success(let child):
            pid = child
        case .failure(let error):
            descriptors.closeParentEnds()
            // The chdir and the exec both fail in the child with one errno: a directory that
            // cannot be entered is named as the cause, the program otherwise.
            if let directory = configuration.workingDirectory, let problem = workingDirectoryProblem(directory) {
                throw .cannotStart(executable: name, path: directory, errno: problem)
            }
            throw .cannotStart(executable: name, path: path, errno: error.code)
        }
        descriptors.closeChildEnds()

        var descriptor: Int32 = -1
        if !forcePolling && pidfdSupport.load(ordering: .relaxed) != 2 {
            switch openProcessDescriptor(pid) {
            case .success(let fd):
                descriptor = fd
                pidfdSupport.store(1, ordering: .relaxed)
            case .failure(let error):
                let code = error.code
                // Missing for good (an old kernel, a seccomp policy), or missing for this child
                // (out of descriptors): polling reaps it either way.
                if code == ENOSYS || code == EPERM || code == EINVAL { pidfdSupport.store(2, ordering: .relaxed) }
            }
        }
        let group = configuration.newProcessGroup ? pid : nil
        let shared = ProcessShared(pid: pid, group: group, child: KernelChild(pid: pid, group: group, descriptor: descriptor))
        let source = ProcessSource(loop: loop, shared: shared)
        if let timeout = configuration.timeout { source.startTimeout(timeout, grace: configuration.timeoutGrace) }

        var pipes: [Connection?] = [nil, nil, nil]
        for index in 0..<3 {
            guard let fd = descriptors.parent[index] else { continue }
            descriptors.parent[index] = nil
            do {
                let made = try ConnectionSource(loop: loop, endpoint: .descriptor(fd), peer: "pid \(pid) \(streamNames[index])",
                                                options: configuration.pipeOptions,
                                                role: index == 0 ? .pipeWriteEnd : .pipeReadEnd)
                pipes[index] = Connection(source: made)
            } catch {
                // The connection closed its descriptor. Nobody could use this child: it is
                // killed (and reaped by its source), its other pipes closed.
                descriptors.closeParentEnds()
                shared.kill(SIGKILL)
                throw .loop(error)
            }
        }
        return Subprocess(loop: loop, shared: shared, source: source, executablePath: path, exitWatch: source.watch,
                          pipes: pipes)
    }

    private static let streamNames = ["stdin", "stdout", "stderr"]

    /// The spawn on a simulated loop: the program registered with the simulation under the
    /// executable's name runs instead (an unregistered one fails as a missing program does).
    /// Each `.pipe` is a pipe of the simulation's network (no latency, no faults): the parent's
    /// end a connection as a real child's, the program's end given to the program; a merged
    /// standard error is the program's standard output; `.inherit` and `.null` give the
    /// program no stream there (what it writes to it is only recorded); a file is refused.
    static func launchSimulated(_ configuration: Configuration, on loop: EventLoop) throws(SubprocessError)
        -> Subprocess
    {
        let name = configuration.executable
        let redirections = [configuration.standardInput, configuration.standardOutput, configuration.standardError]
        for (index, redirection) in redirections.enumerated() {
            switch redirection {
            case .file(let path), .appendingToFile(let path):
                throw .loop(.simulatedLoop(refused: "the file \(path) for the \(streamNames[index]) of '\(name)'"))
            case .mergedIntoStandardOutput:
                requireUsage(index == 2, "Mainspring: Subprocess.launch: only standardError can be .mergedIntoStandardOutput, not \(streamNames[index])")
            default:
                continue
            }
        }
        guard let simulation = loop.simulation,
            let child = simulation.makeProgram(executable: name, arguments: configuration.arguments,
                                               environment: configuration.environment, on: loop)
        else {
            throw .cannotStart(executable: name, path: name, errno: ENOENT)
        }
        let pid = child.processIdentifier
        var pipes: [Connection?] = [nil, nil, nil]
        var programEnds: [Connection?] = [nil, nil, nil]
        do throws(EventLoopError) {
            for (index, redirection) in redirections.enumerated() {
                switch redirection {
                case .pipe:
                    let (parent, program) = try makeSimulatedPipe(on: loop, options: configuration.pipeOptions,
                                                                  parentWrites: index == 0,
                                                                  peer: "pid \(pid) \(streamNames[index])")
                    pipes[index] = parent
                    programEnds[index] = program
                case .mergedIntoStandardOutput:
                    programEnds[index] = programEnds[1]
                default:
                    continue
                }
            }
        } catch {
            for case let connection? in pipes + programEnds { connection.source.close() }
            throw .loop(error)
        }
        let handle = SimulatedChildHandle(child)
        let shared = ProcessShared(pid: pid, group: configuration.newProcessGroup ? pid : nil, child: handle)
        let source = ProcessSource(loop: loop, shared: shared)
        if let timeout = configuration.timeout { source.startTimeout(timeout, grace: configuration.timeoutGrace) }
        let checked = LoopBound(source)
        child.start(standardStreams: programEnds) { status in
            handle.exited(status)
            loop.execute(priority: .input) { checked.value.check() }
        }
        return Subprocess(loop: loop, shared: shared, source: source, executablePath: name, exitWatch: .simulated,
                          pipes: pipes)
    }

    /// One pipe of a simulated program: the parent's end (writing to the program's standard
    /// input, or reading its output) and the program's.
    private static func makeSimulatedPipe(on loop: EventLoop, options: Connection.Options, parentWrites: Bool,
                                          peer: String) throws(EventLoopError) -> (parent: Connection, program: Connection)
    {
        let network = try loop.requireSimulatedNetwork(for: "a pipe to a simulated program")
        let (writer, reader) = network.makePipe(on: loop)
        let writing: ConnectionSource
        do {
            writing = try ConnectionSource(loop: loop, endpoint: .simulated(writer), peer: peer, options: options,
                                           role: .pipeWriteEnd)
        } catch {
            reader.socketClosed(unreadInput: false)
            throw error
        }
        let reading: ConnectionSource
        do {
            reading = try ConnectionSource(loop: loop, endpoint: .simulated(reader), peer: peer, options: options,
                                           role: .pipeReadEnd)
        } catch {
            writing.close()
            throw error
        }
        let (parent, program) = parentWrites ? (writing, reading) : (reading, writing)
        return (Connection(source: parent), Connection(source: program))
    }

    /// Throws `.nulInConfiguration` naming the first text of `configuration` that holds a
    /// NUL: it would reach the kernel as a C string, cut short at the NUL (and a name searched
    /// in `PATH` would find the program named by its first part).
    static func refuseNULs(_ configuration: Configuration) throws(SubprocessError) {
        let name = configuration.executable
        func check(_ text: String, _ field: @autoclosure () -> String) throws(SubprocessError) {
            if text.utf8.contains(0) { throw .nulInConfiguration(executable: name, field: field()) }
        }
        try check(name, "executable")
        for (index, argument) in configuration.arguments.enumerated() { try check(argument, "arguments[\(index)]") }
        for (key, value) in (configuration.environment ?? [:]).sorted(by: { $0.key < $1.key }) {
            try check(key, "environment (the name \"\(key.replacingNULs())\")")
            try check(value, "environment[\"\(key)\"]")
        }
        if let directory = configuration.workingDirectory { try check(directory, "workingDirectory") }
        let redirections = [("standardInput", configuration.standardInput), ("standardOutput", configuration.standardOutput),
                            ("standardError", configuration.standardError)]
        for (field, redirection) in redirections {
            if case .file(let path) = redirection { try check(path, "\(field) (its file)") }
            if case .appendingToFile(let path) = redirection { try check(path, "\(field) (its file)") }
        }
    }

    /// The program's path: `executable` itself when it has a slash, otherwise the first
    /// executable file of that name in `PATH`.
    static func resolveExecutable(_ configuration: Configuration) throws(SubprocessError) -> String {
        let name = configuration.executable
        guard !name.isEmpty else { throw .cannotStart(executable: name, path: name, errno: ENOENT) }
        if name.contains("/") { return name }
        let searchPath = configuration.environment?["PATH"] ?? defaultSearchPath()
        var notExecutable: String?
        for directory in searchPath.split(separator: ":", omittingEmptySubsequences: false) {
            let candidate = (directory.isEmpty ? "." : String(directory)) + "/" + name
            if isExecutableFile(candidate) { return candidate }
            if notExecutable == nil, isExistingFile(candidate) { notExecutable = candidate }
        }
        if let notExecutable { throw .cannotStart(executable: name, path: notExecutable, errno: EACCES) }
        // The name itself as the path, not the search path: "'name' not found in PATH".
        throw .cannotStart(executable: name, path: name, errno: ENOENT)
    }
}

/// The descriptors of one spawn: the parent's ends of its pipes (taken over by connections)
/// and the child's ends (closed once the child has its copies).
private struct LaunchDescriptors {
    var parent: [Int32?] = [nil, nil, nil]
    var child: [Int32] = []

    mutating func closeChildEnds() {
        for fd in child { closeDescriptor(fd) }
        child = []
    }

    mutating func closeParentEnds() {
        for case let fd? in parent { closeDescriptor(fd) }
        parent = [nil, nil, nil]
    }
}
