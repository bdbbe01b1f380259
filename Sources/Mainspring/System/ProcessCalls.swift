internal import CMainspringSystem
#if canImport(Glibc)
import Glibc
#endif

// The operating-system side of `Subprocess` (Process/): posix_spawn (CMainspringSystem's
// `ms_spawn`, which sets up the file actions and attributes), the descriptors a child is given,
// pidfds, signals and reaping. Everything here is internal; Process/ holds the typed API.

/// An errno value as an error, for the `Result`s of the calls here.
struct Errno: Error, Equatable {
    let code: Int32
    init(_ code: Int32) { self.code = code }
}

/// What one of a child's standard descriptors becomes.
enum ChildDescriptor: Equatable {
    /// The parent's own descriptor of that number.
    case inherit
    /// `/dev/null`, opened in the child.
    case null
    /// A descriptor of the parent's (close-on-exec, 3 or above), duplicated onto it.
    case descriptor(Int32)
    /// The child's descriptor 1 as already set up (stdio is set up in order): for stderr, `2>&1`.
    case standardOutput

    fileprivate var code: Int32 {
        switch self {
        case .inherit: MS_SPAWN_INHERIT
        case .null: MS_SPAWN_NULL
        case .descriptor(let fd): fd
        case .standardOutput: 1
        }
    }
}

/// Starts `path` (a path with a slash: no search) with `arguments` (argv, the first included),
/// `environment` ("NAME=value" entries; nil: the parent's), in `directory`, with `stdio` as its
/// descriptors 0, 1 and 2 and nothing else open, in a new process group when asked. Returns the
/// child's pid, or the errno (a failed exec or chdir in the child is reported here: ENOENT,
/// EACCES, ENOEXEC, ENOTDIR, …).
func spawnChild(path: String, arguments: [String], environment: [String]?, directory: String?,
                stdio: [ChildDescriptor], newProcessGroup: Bool) -> Result<Int32, Errno>
{
    precondition(stdio.count == 3, "Mainspring: spawnChild needs three descriptors")
    let argv = arguments.map { strdup($0) } + [nil]
    let envp = environment.map { $0.map { strdup($0) } + [nil] }
    defer {
        for pointer in argv { free(pointer) }
        for pointer in envp ?? [] { free(pointer) }
    }
    var pid: pid_t = 0
    let codes = stdio.map(\.code)
    let rc = codes.withUnsafeBufferPointer { codes in
        argv.withUnsafeBufferPointer { argv in
            withOptionalBuffer(envp) { envp in
                withOptionalCString(directory) { directory in
                    ms_spawn(&pid, path, argv.baseAddress!, envp, directory, codes.baseAddress!, newProcessGroup ? 1 : 0)
                }
            }
        }
    }
    return rc == 0 ? .success(pid) : .failure(Errno(rc))
}

private func withOptionalBuffer<R>(_ array: [UnsafeMutablePointer<CChar>?]?,
                                   _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>?) -> R) -> R
{
    guard let array else { return body(nil) }
    return array.withUnsafeBufferPointer { body($0.baseAddress) }
}

private func withOptionalCString<R>(_ text: String?, _ body: (UnsafePointer<CChar>?) -> R) -> R {
    guard let text else { return body(nil) }
    return text.withCString { body($0) }
}

/// Whether glibc can close every other descriptor in a spawned child (2.34 on). Without it,
/// close-on-exec alone keeps a child's descriptors to those it is given.
let spawnClosesOtherDescriptors: Bool = ms_spawn_has_closefrom() != 0

/// Whether glibc can change a spawned child's directory (2.29 on).
let spawnCanChangeDirectory: Bool = ms_spawn_has_chdir() != 0

/// Moves `fd` to a number of 3 or above (close-on-exec), closing the original, if it is one of
/// the standard numbers (a process started with its stdin closed hands out 0 for the next
/// descriptor): a child's descriptors 0 to 2 are set up in order, and a pipe end numbered 1
/// would be overwritten before it is duplicated onto 2. Returns the descriptor to use, or the
/// errno.
func aboveStandardDescriptors(_ fd: Int32) -> Result<Int32, Errno> {
    guard fd >= 0 && fd < 3 else { return .success(fd) }
    let moved = fcntl(fd, F_DUPFD_CLOEXEC, Int32(3))
    let code = errno
    close(fd)
    return moved >= 0 ? .success(moved) : .failure(Errno(code))
}

/// A pipe for a child's standard descriptor: both ends close-on-exec and numbered 3 or above;
/// the parent's end non-blocking, the child's blocking (as programs expect their stdio). Returns
/// (the parent's end, the child's end) or the errno.
func makeChildPipe(parentReads: Bool) -> Result<(parent: Int32, child: Int32), Errno> {
    var fds: [Int32] = [-1, -1]
    guard ms_pipe2(&fds, Int32(O_CLOEXEC)) == 0 else { return .failure(Errno(errno)) }
    var readEnd = fds[0]
    var writeEnd = fds[1]
    switch aboveStandardDescriptors(readEnd) {
    case .success(let fd): readEnd = fd
    case .failure(let error):
        close(writeEnd)
        return .failure(error)
    }
    switch aboveStandardDescriptors(writeEnd) {
    case .success(let fd): writeEnd = fd
    case .failure(let error):
        close(readEnd)
        return .failure(error)
    }
    let parent = parentReads ? readEnd : writeEnd
    let child = parentReads ? writeEnd : readEnd
    if let code = setNonBlocking(parent) {
        close(readEnd)
        close(writeEnd)
        return .failure(Errno(code))
    }
    return .success((parent, child))
}

/// Opens `path` for a child's standard descriptor (close-on-exec, numbered 3 or above): to read
/// (stdin), or to write, created if missing (mode 0644), truncated or appended to. Returns the
/// descriptor or the errno.
func openForChild(_ path: String, reading: Bool, appending: Bool) -> Result<Int32, Errno> {
    let flags = reading ? O_RDONLY : O_WRONLY | O_CREAT | (appending ? O_APPEND : O_TRUNC)
    let fd = open(path, flags | O_CLOEXEC, mode_t(0o644))
    guard fd >= 0 else { return .failure(Errno(errno)) }
    return aboveStandardDescriptors(fd)
}

/// Whether `path` names an executable regular file for this process (`access(X_OK)` and
/// `stat`): what a search of `PATH` looks for.
func isExecutableFile(_ path: String) -> Bool {
    var st = stat()
    return access(path, X_OK) == 0 && stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG
}

/// Why `path` cannot be a child's working directory (the errno: ENOENT, ENOTDIR, EACCES), or
/// nil when it can. For naming what failed after a spawn did.
func workingDirectoryProblem(_ path: String) -> Int32? {
    var st = stat()
    guard stat(path, &st) == 0 else { return errno }
    guard (st.st_mode & S_IFMT) == S_IFDIR else { return ENOTDIR }
    return access(path, X_OK) == 0 ? nil : errno
}

// MARK: pidfds, signals, reaping

/// A pidfd for `pid` (close-on-exec: pidfds always are), or the errno (ENOSYS before Linux 5.3,
/// EPERM or ENOSYS under some seccomp policies).
func openProcessDescriptor(_ pid: Int32) -> Result<Int32, Errno> {
    let fd = ms_pidfd_open(pid)
    return fd >= 0 ? .success(fd) : .failure(Errno(errno))
}

/// Sends `signal` through a pidfd (never to another process that reuses the number). Returns 0 or
/// the errno (ESRCH once it has exited).
func sendSignal(_ signal: Int32, toProcessDescriptor fd: Int32) -> Int32 {
    ms_pidfd_send_signal(fd, signal) == 0 ? 0 : errno
}

/// Sends `signal` to `pid` (a child not yet reaped: its number cannot have been reused). 0 or the
/// errno.
func sendSignal(_ signal: Int32, toProcess pid: Int32) -> Int32 {
    kill(pid, signal) == 0 ? 0 : errno
}

/// Sends `signal` to every process of the group `group`. 0 or the errno (ESRCH: the group is
/// empty).
func sendSignal(_ signal: Int32, toProcessGroup group: Int32) -> Int32 {
    kill(-group, signal) == 0 ? 0 : errno
}

/// Whether the process group `group` still has a member.
func processGroupExists(_ group: Int32) -> Bool { kill(-group, 0) == 0 || errno == EPERM }

/// How a reaped child ended, as the kernel reports it.
enum ReapedExit: Equatable {
    case exited(Int32)
    case signaled(Int32)
}

/// What one non-blocking reap found.
enum ReapResult: Equatable {
    case reaped(ReapedExit)
    case running
    case failed(Int32)
}

/// Reaps the child behind `fd` if it has exited (`waitid(P_PIDFD, …, WEXITED | WNOHANG)`).
func reapExited(processDescriptor fd: Int32) -> ReapResult {
    var result = ms_exit()
    switch ms_reap_pidfd(fd, &result) {
    case 1: return .reaped(result.exited != 0 ? .exited(result.value) : .signaled(result.value))
    case 0: return .running
    default: return .failed(errno)
    }
}

/// Reaps `pid` if it has exited (`waitpid(pid, …, WNOHANG)`).
func reapExited(process pid: Int32) -> ReapResult {
    var result = ms_exit()
    switch ms_reap_pid(pid, &result) {
    case 1: return .reaped(result.exited != 0 ? .exited(result.value) : .signaled(result.value))
    case 0: return .running
    default: return .failed(errno)
    }
}

/// The search path of a child: `PATH` of its environment, or of this process, or the default.
func defaultSearchPath() -> String {
    if let value = getenv("PATH") { return String(cString: value) }
    return "/usr/local/bin:/usr/bin:/bin"
}

/// A signal's name ("SIGTERM"), or "signal N" for one without a common name.
/// `package`: the service group (MainspringServices) names the signals it stops on.
package func signalName(_ signal: Int32) -> String {
    let names: [Int32: String] = [
        SIGHUP: "SIGHUP", SIGINT: "SIGINT", SIGQUIT: "SIGQUIT", SIGILL: "SIGILL", SIGTRAP: "SIGTRAP",
        SIGABRT: "SIGABRT", SIGBUS: "SIGBUS", SIGFPE: "SIGFPE", SIGKILL: "SIGKILL", SIGUSR1: "SIGUSR1",
        SIGSEGV: "SIGSEGV", SIGUSR2: "SIGUSR2", SIGPIPE: "SIGPIPE", SIGALRM: "SIGALRM", SIGTERM: "SIGTERM",
        SIGCHLD: "SIGCHLD", SIGCONT: "SIGCONT", SIGSTOP: "SIGSTOP", SIGTSTP: "SIGTSTP", SIGXCPU: "SIGXCPU",
    ]
    return names[signal] ?? "signal \(signal)"
}

/// Whether `path` names an existing regular file (executable or not).
func isExistingFile(_ path: String) -> Bool {
    var st = stat()
    return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG
}
