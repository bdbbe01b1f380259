import Foundation
import Mainspring

// mainspring-demo: counts the primes below a limit on the main thread's event loop, fed in chunks,
// while commands typed on stdin are answered at once — or, when stdin is not a terminal, while
// simulated input measures how responsive the loop stays. See Demo.swift, and `--help`.

let options: DemoOptions
switch DemoOptions.parse(Array(CommandLine.arguments.dropFirst()), stdinIsTerminal: isatty(STDIN_FILENO) == 1) {
case .success(.run(let parsed)):
    options = parsed
case .success(.help):
    FileHandle.standardOutput.write(Data((DemoOptions.usage + "\n").utf8))
    exit(0)
case .failure(let error):
    FileHandle.standardError.write(Data("mainspring-demo: \(error)\n\n\(DemoOptions.usage)\n".utf8))
    exit(2)
}

// A closed stdin would let the next descriptor opened (the loop's own eventfd) become fd 0. With
// simulated input, give fd 0 to /dev/null; when commands should be read from it, say so.
if fcntl(STDIN_FILENO, F_GETFD) == -1 {
    guard options.mode == .simulate else {
        FileHandle.standardError.write(Data("mainspring-demo: stdin is closed: no commands to read (--simulate does not read it)\n".utf8))
        exit(1)
    }
    _ = open("/dev/null", O_RDONLY)  // the lowest free descriptor: 0
}

let stdoutIsTerminal = isatty(STDOUT_FILENO) == 1
let console = Console(
    isTerminal: stdoutIsTerminal && !options.json,
    echoesInput: stdoutIsTerminal && options.mode == .interactive && isatty(STDIN_FILENO) == 1)
let demo = Demo(options: options, console: console)
do {
    try demo.start()
    try EventLoop.main.run()  // until the job is over and no more input is expected
} catch {
    console.removeBar()
    FileHandle.standardError.write(Data("mainspring-demo: \(error)\n".utf8))
    exit(1)
}
demo.finish()
exit(demo.exitStatus)
