/// Why a path could not be watched (``EventLoop/observeFile(at:_:)``,
/// `EventLoop.fileChanges(at:)`).
public enum FileWatchError: Error, Equatable, Sendable, CustomStringConvertible {
    /// `path` could not be watched: it does not exist (`ENOENT`), cannot be searched
    /// (`EACCES`), or the kernel's limit on inotify watches or instances is reached (`ENOSPC`,
    /// `EMFILE`).
    case cannotWatch(path: String, errno: Int32)
    /// The loop could not watch it: called off its thread (``EventLoopError/wrongThread(function:)``),
    /// shut down (`.loopClosed`), a simulated loop (which has no files: `.simulatedLoop`), or the
    /// loop could not register the watch's descriptor (`.libevent`).
    case loop(EventLoopError)

    public var description: String {
        switch self {
        case .cannotWatch(let path, let code):
            return "cannot watch '\(path)': \(errnoDescription(code))"
        case .loop(let error):
            return error.description
        }
    }
}

extension FileWatchError {
    /// The error as the deprecated `watchFile(at:_:)` and `fileEvents(at:)` throw it.
    @available(*, deprecated, message: "for the deprecated EventLoop.watchFile(at:_:) and fileEvents(at:)")
    var watchError: EventLoopError {
        switch self {
        case .cannotWatch(let path, let code): return .watchFailed(path: path, errno: code)
        case .loop(let error): return error
        }
    }
}
