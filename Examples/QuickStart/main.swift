import Foundation
import Mainspring

let loop = EventLoop.main               // the main thread's loop; @MainActor code runs inside it
var inputEnded = false
var sumPrinted = false

// Timers: never early, on a drift-free grid.
let ticker = loop.schedule(every: .seconds(1)) { _ in print("tick") }

// Lines from stdin, with every kind of bad input reported rather than crashing.
let reader = try loop.readLines(from: STDIN_FILENO) { event in
    switch event {
    case .line(let text): print("got \(text)")
    case .tooLong(let n), .invalidUTF8(let n): print("skipped \(n) bad bytes")
    case .endOfFile, .error:
        inputEnded = true
        if sumPrinted { loop.stop() }
    }
}

// Work on another thread; the result comes back to the main loop, between its other callbacks.
Task.detached {
    let sum = (1...1_000_000).reduce(0, +)
    await MainActor.run {
        print("sum from another thread: \(sum)")
        sumPrinted = true
        if inputEnded { loop.stop() }
    }
}

try loop.run()                          // until stop()
ticker.cancel()
reader.cancel()
