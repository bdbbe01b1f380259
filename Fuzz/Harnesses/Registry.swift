import Foundation

extension FuzzHarness {
    /// The harnesses by name (the `MAINSPRING_FUZZ_TARGET` values and corpus folder names).
    public static let all: [(name: String, run: @Sendable ([UInt8]) -> Void)] = [
        ("lines", lineSplitter),
        ("demo-commands", demoCommands),
        ("daemon-commands", daemonCommands),
        ("http-heads", httpHead),
        ("websocket-frames", webSocketFrames),
    ]

    /// Harness names, in order.
    public static var names: [String] { all.map(\.name) }

    /// The harness called `name`.
    public static func named(_ name: String) -> (@Sendable ([UInt8]) -> Void)? {
        all.first { $0.name == name }?.run
    }

    /// The regular files at `path` (itself, or the files in it, sorted).
    public static func corpusFiles(at path: String) throws -> [String] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { return [] }
        guard isDirectory.boolValue else { return [path] }
        return try FileManager.default.contentsOfDirectory(atPath: path).sorted()
            .map { (path as NSString).appendingPathComponent($0) }
    }
}
