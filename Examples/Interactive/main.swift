import Foundation
import Mainspring

// A minimal interactive example: echoes stdin lines on the main thread's loop while a timer
// ticks, and exits at end of input. (The full interactive demo replaces this.)

let loop = EventLoop.current
var lines = 0
let ticker = loop.schedule(every: .seconds(1)) { _ in print("tick: \(lines) line(s) so far") }
let reader = try loop.readLines(from: STDIN_FILENO) { event in
    switch event {
    case .line(let text):
        lines += 1
        print("you said: \(text)")
    case .tooLong(let bytes):
        print("skipped a line of \(bytes) bytes (too long)")
    case .invalidUTF8(let bytes):
        print("skipped \(bytes) bytes of invalid UTF-8")
    case .endOfFile, .error:
        print("end of input after \(lines) line(s)")
        ticker.cancel()
        loop.stop()
    }
}
try loop.run()
