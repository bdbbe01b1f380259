#if canImport(Glibc)
import Glibc
#endif

/// Why a child process was not started (`Subprocess.launch(_:on:)`). Every case names what
/// failed; nothing was started when one is thrown.
public enum SubprocessError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The program could not be started: `path` is what failed — the executable itself, the
    /// working directory, or a file given for a standard stream — and `errno` why (`ENOENT`,
    /// `EACCES`, `ENOEXEC`, `ENOTDIR`, …). `executable` is the program that was asked for, as
    /// given. A name (no slash) that is not in `PATH` is `path` equal to the name and `ENOENT`,
    /// described as "'name' not found in PATH" (the search path itself is not repeated). On a
    /// simulated loop, a program nobody registered is that too.
    case cannotStart(executable: String, path: String, errno: Int32)
    /// `field` of the configuration holds a NUL byte, which the C strings that the kernel takes
    /// cannot carry (the text would end there, silently cut short). `field` is `executable`,
    /// `arguments[i]`, `environment` (a variable's name), `environment["NAME"]` (its value),
    /// `workingDirectory`, or a redirection's file (`standardOutput`, …). `executable` is the
    /// program, as given.
    case nulInConfiguration(executable: String, field: String)
    /// A system call the start needed failed: `pipe2` for a standard stream (`EMFILE`: the
    /// process is out of descriptors), …; `function` says which and for what.
    case system(function: String, errno: Int32)
    /// The loop could not start it: called off its thread (``EventLoopError/wrongThread(function:)``),
    /// shut down (`.loopClosed`), a simulated loop that refuses what was asked (a file for a
    /// standard stream: `.simulatedLoop`), or a pipe's connection that the loop could not
    /// register (`.libevent`, `.system`; the child is then killed and reaped).
    case loop(EventLoopError)

    public var description: String {
        switch self {
        case .cannotStart(let executable, let path, let code):
            if code == ENOENT && path == executable && !executable.isEmpty && !executable.contains("/") {
                return "'\(executable)' not found in PATH"
            }
            let what = path == executable ? "" : ": \(path)"
            return "cannot start '\(executable)'\(what): \(errnoDescription(code))"
        case .nulInConfiguration(let executable, let field):
            let name = executable.replacingNULs()
            return "cannot start '\(name)': \(field) holds a NUL byte, which a C string cannot carry; nothing was started"
        case .system(let function, let code):
            return EventLoopError.system(function: function, errno: code).description
        case .loop(let error):
            return error.description
        }
    }
}

extension SubprocessError {
    /// The error as the deprecated `Subprocess.spawn` throws it.
    @available(*, deprecated, message: "for the deprecated Subprocess.spawn(_:on:)")
    var spawnError: EventLoopError {
        switch self {
        case .cannotStart(let executable, let path, let code):
            return .spawnFailed(executable: executable, path: path, errno: code)
        case .nulInConfiguration(let executable, let field):
            return .nulInSpawnConfiguration(executable: executable, field: field)
        case .system(let function, let code):
            return .system(function: function, errno: code)
        case .loop(let error):
            return error
        }
    }
}
