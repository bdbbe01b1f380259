import Foundation

/// The demo's standard output: whole lines, and on a terminal a one-line progress bar that is
/// redrawn in place and cleared before any other output.
///
/// On a terminal the bar doubles as the prompt when the user types on the same terminal: it is
/// redrawn with the cursor saved and restored (`ESC 7` / `ESC 8`), so that what the user has typed
/// after it stays where it is; once the user presses Return, the terminal's echo has moved the
/// cursor to a fresh line and the old bar stays above as a record of the command.
///
/// Main thread only (the demo runs on `EventLoop.main`). Every write goes straight to fd 1, so
/// output appears at once even in a pipe, in order.
@MainActor
final class Console {
    /// Whether stdout is a terminal: the bar is drawn only then.
    let isTerminal: Bool
    /// Whether stdin is the same kind of terminal, echoing what the user types.
    let echoesInput: Bool
    /// Columns the bar takes, padded, so that a redraw covers the previous one exactly: what
    /// the terminal has, less room to type a command after it (at most 66).
    let barWidth: Int
    /// What follows the bar when the user types after it.
    let prompt: String

    /// Whether the bar is on the cursor's line now.
    private var barShown = false
    private var lastBar = ""

    init(isTerminal: Bool, echoesInput: Bool) {
        self.isTerminal = isTerminal
        self.echoesInput = echoesInput
        prompt = echoesInput ? "> " : ""
        var size = winsize()
        let columns = isTerminal && ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0 && size.ws_col > 0
            ? Int(size.ws_col) : 80
        barWidth = max(20, min(66, columns - (echoesInput ? 16 : 1)))
    }

    /// Writes `text` and a newline below the bar (see `lines`).
    func line(_ text: String) {
        lines([text])
    }

    /// Writes lines where the bar was: the bar is cleared first — except when the user may be
    /// typing after it (an echoing terminal, and the output is not a reply to a line just
    /// entered): then the bar's line is ended and kept, with what was typed so far.
    func lines(_ texts: [String]) {
        write(leaveBar(keepingTypedText: echoesInput) + texts.map { $0 + "\n" }.joined())
    }

    /// Shows `bar` (and the prompt) in place of the previous bar, on a terminal; does nothing
    /// otherwise.
    func showBar(_ bar: String) {
        guard isTerminal else { return }
        let width = barWidth - prompt.count
        let padded = String(bar.prefix(width)).padding(toLength: width, withPad: " ", startingAt: 0) + prompt
        if barShown {
            guard padded != lastBar else { return }
            write("\u{1B}7\r" + padded + "\u{1B}8")
        } else {
            write("\r\u{1B}[K" + padded)
            barShown = true
        }
        lastBar = padded
    }

    /// The user pressed Return: with an echoing terminal the cursor is now on a fresh line, below
    /// the bar, which stays there with the command after it.
    func inputLineEntered() {
        if echoesInput { barShown = false }
    }

    /// Clears the bar for good (before the final output).
    func removeBar() {
        write(leaveBar(keepingTypedText: false))
    }

    private func leaveBar(keepingTypedText: Bool) -> String {
        guard barShown else { return "" }
        barShown = false
        return keepingTypedText ? "\n" : "\r\u{1B}[K"
    }

    private func write(_ text: String) {
        guard !text.isEmpty else { return }
        FileHandle.standardOutput.write(Data(text.utf8))
    }
}

/// `text` safe to print: control characters (NUL, escape sequences, bells, …) are shown as
/// `\u{..}` escapes, so junk input cannot mess up the terminal.
func printable(_ text: String) -> String {
    var result = ""
    for scalar in text.unicodeScalars {
        switch scalar.value {
        case 0: result += "\\0"
        case 0x01..<0x20, 0x7F..<0xA0: result += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
        default: result.unicodeScalars.append(scalar)
        }
    }
    return result
}

/// `seconds` as `0.42 s` or `12.3 s`.
func formatSeconds(_ seconds: Double) -> String {
    String(format: seconds < 10 ? "%.2f s" : "%.1f s", seconds)
}

/// `milliseconds` as `0.412 ms`.
func formatMilliseconds(_ milliseconds: Double) -> String {
    String(format: "%.3f ms", milliseconds)
}

/// `1 byte`, `10,000,000 bytes`.
func byteCount(_ count: Int) -> String {
    count == 1 ? "1 byte" : "\(grouped(count)) bytes"
}

/// `fraction` (0...1) as `41.3%`.
func formatPercent(_ fraction: Double) -> String {
    String(format: "%.1f%%", fraction * 100)
}
