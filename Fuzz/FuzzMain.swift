import Foundation
import MainspringFuzzing

// mainspring-fuzz: one binary, several harnesses, chosen with MAINSPRING_FUZZ_TARGET
// (lines, demo-commands, daemon-commands, http-heads).
//
// Built with `--sanitize=fuzzer -Xswiftc -DFUZZING` (`make fuzz`), libFuzzer supplies `main`
// and calls `LLVMFuzzerTestOneInput`. Built normally, it is a replayer:
// `mainspring-fuzz <target> <file or directory>…` runs every input once.

private let target = ProcessInfo.processInfo.environment["MAINSPRING_FUZZ_TARGET"] ?? "lines"

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    guard let harness = FuzzHarness.named(target) else {
        fatalError("unknown MAINSPRING_FUZZ_TARGET '\(target)'; known: \(FuzzHarness.names.joined(separator: ", "))")
    }
    harness(bytes)
    return 0
}

#if !FUZZING
@main
enum Replay {
    static func main() throws {
        let arguments = Array(CommandLine.arguments.dropFirst())
        guard let name = arguments.first, let harness = FuzzHarness.named(name), arguments.count > 1 else {
            print("usage: mainspring-fuzz <\(FuzzHarness.names.joined(separator: "|"))> <file or directory>…")
            exit(2)
        }
        var count = 0
        for path in arguments.dropFirst() {
            for file in try FuzzHarness.corpusFiles(at: path) {
                harness(Array(try Data(contentsOf: URL(fileURLWithPath: file))))
                count += 1
            }
        }
        print("replayed \(count) input(s) through \(name): no invariant broken")
    }
}
#endif
