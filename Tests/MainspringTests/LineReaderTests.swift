import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// Splits `chunks` (fed one by one) and returns every event.
private func split(_ chunks: [[UInt8]], max: Int = 16) -> [LineEvent] {
    var splitter = LineSplitter(maxLineLength: max)
    var events: [LineEvent] = []
    for chunk in chunks { splitter.append(chunk[...]) { events.append($0) } }
    splitter.finish { events.append($0) }
    return events
}

private func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

@Suite("Line splitting rules")
struct LineSplitterTests {
    @Test("LF and CRLF endings; the terminator is not part of the line")
    func endings() {
        #expect(split([bytes("a\nb\r\nc\n")]) == [.line("a"), .line("b"), .line("c"), .endOfFile])
        #expect(split([bytes("\n\r\n")]) == [.line(""), .line(""), .endOfFile])
    }

    @Test("a final line without newline is delivered before endOfFile")
    func finalLine() {
        #expect(split([bytes("a\nlast")]) == [.line("a"), .line("last"), .endOfFile])
        #expect(split([]) == [.endOfFile])
    }

    @Test("lines split across chunks at every position come out whole")
    func chunkBoundaries() {
        let input = bytes("first line\r\nsecond\n\nthird")
        for cut in 0...input.count {
            let events = split([Array(input[0..<cut]), Array(input[cut...])])
            #expect(events == [.line("first line"), .line("second"), .line(""), .line("third"), .endOfFile], "cut \(cut)")
        }
        // One byte at a time.
        #expect(split(input.map { [$0] }) == [.line("first line"), .line("second"), .line(""), .line("third"), .endOfFile])
    }

    @Test("an overlong line is reported with its length and skipped; reading resynchronises")
    func tooLong() {
        let long = String(repeating: "x", count: 40)
        #expect(split([bytes("ok\n\(long)\nnext\n")]) == [.line("ok"), .tooLong(40), .line("next"), .endOfFile])
        // Split into many chunks, with CRLF.
        let chunks = bytes("\(long)\r\nnext\n").map { [$0] }
        #expect(split(chunks) == [.tooLong(40), .line("next"), .endOfFile])
        // Exactly the maximum is fine, with or without CR.
        let exact = String(repeating: "y", count: 16)
        #expect(split([bytes("\(exact)\n\(exact)\r\n")]) == [.line(exact), .line(exact), .endOfFile])
        #expect(split([bytes(exact + "z\n")]) == [.tooLong(17), .endOfFile])
        // An overlong final line without newline.
        #expect(split([bytes(long)]) == [.tooLong(40), .endOfFile])
    }

    @Test("invalid UTF-8 is reported with its length; NUL bytes are kept")
    func utf8AndNUL() {
        #expect(split([[0x61, 0xFF, 0x62, 0x0A, 0x63, 0x0A]]) == [.invalidUTF8(3), .line("c"), .endOfFile])
        #expect(split([[0x61, 0x00, 0x62, 0x0A]]) == [.line("a\u{0}b"), .endOfFile])
        // A multi-byte character split across chunks is valid.
        let e = bytes("é\n")
        #expect(split([[e[0]], [e[1], e[2]]]) == [.line("é"), .endOfFile])
        // A truncated character at end of file is invalid.
        #expect(split([[0x61, 0xC3]]) == [.invalidUTF8(2), .endOfFile])
    }

    @Test("endOfFile comes once; input after finish is ignored")
    func eofOnce() {
        var splitter = LineSplitter(maxLineLength: 8)
        var events: [LineEvent] = []
        splitter.finish { events.append($0) }
        splitter.finish { events.append($0) }
        splitter.append(bytes("late\n")[...]) { events.append($0) }
        #expect(events == [.endOfFile])
    }

    @Test("memory stays bounded while skipping a huge line")
    func boundedMemory() {
        var splitter = LineSplitter(maxLineLength: 1_024)
        var events: [LineEvent] = []
        let block = [UInt8](repeating: 0x41, count: 65_536)
        for _ in 0..<160 { splitter.append(block[...]) { events.append($0) } }  // 10 MiB, no newline
        splitter.append(bytes("\nafter\n")[...]) { events.append($0) }
        #expect(events == [.tooLong(160 * 65_536), .line("after")])
    }
}

@Suite("readLines on real fds")
struct ReadLinesTests {
    @Test("readLines reports lines, bad input and end of file from a pipe, in order")
    func pipeLines() async throws {
        let pipe = TestPipe()
        let events = try await onLoopThread { loop -> [LineEvent] in
            nonisolated(unsafe) var events: [LineEvent] = []
            _ = try loop.readLines(from: pipe.readEnd, maxLineLength: 100) { events.append($0) }
            startThread {
                pipe.write("hello\r\n")
                pipe.write([0x62, 0x00, 0x63, 0x0A])  // NUL kept
                pipe.write([0xC3, 0x28, 0x0A])  // invalid UTF-8
                pipe.write(String(repeating: "z", count: 1_000) + "\n")
                pipe.write("no newline at end")
                pipe.closeWrite()
            }
            loop.spin(until: { events.last == .endOfFile }, timeout: .seconds(5))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            return events
        }
        #expect(events == [.line("hello"), .line("b\u{0}c"), .invalidUTF8(2), .tooLong(1_000),
                           .line("no newline at end"), .endOfFile])
    }

    @Test("a 10 MB line is skipped without buffering it, and the next line arrives")
    func hugeLine() async throws {
        let pipe = TestPipe()
        let events = try await onLoopThread { loop -> [LineEvent] in
            nonisolated(unsafe) var events: [LineEvent] = []
            _ = try loop.readLines(from: pipe.readEnd) { events.append($0) }
            startThread {
                let block = [UInt8](repeating: 0x42, count: 1 << 20)
                for _ in 0..<10 { pipe.write(block) }
                pipe.write("\nafter\n")
                pipe.closeWrite()
            }
            loop.spin(until: { events.last == .endOfFile }, timeout: .seconds(30))
            return events
        }
        #expect(events == [.tooLong(10 << 20), .line("after"), .endOfFile])
    }

    @Test("readLines works on a regular file and on /dev/null")
    func regularFileAndDevNull() async throws {
        let path = uniqueTestPath("lines")
        _ = FileManager.default.createFile(atPath: path, contents: Data("one\ntwo".utf8))
        defer { unlink(path) }
        let events = try await onLoopThread { loop -> ([LineEvent], [LineEvent]) in
            let file = open(path, O_RDONLY | O_CLOEXEC)
            let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
            defer { close(file); close(null) }
            nonisolated(unsafe) var fromFile: [LineEvent] = []
            nonisolated(unsafe) var fromNull: [LineEvent] = []
            _ = try loop.readLines(from: file) { fromFile.append($0) }
            _ = try loop.readLines(from: null) { fromNull.append($0) }
            loop.spin(until: { fromFile.last == .endOfFile && fromNull.last == .endOfFile }, timeout: .seconds(5))
            return (fromFile, fromNull)
        }
        #expect(events.0 == [.line("one"), .line("two"), .endOfFile])
        #expect(events.1 == [.endOfFile])
    }

    @Test("a read error is reported once as .error and ends the reader")
    func readError() async throws {
        let events = try await onLoopThread { loop -> [LineEvent] in
            // A write-only fd: read(2) fails with EBADF.
            let pipe = TestPipe()
            nonisolated(unsafe) var events: [LineEvent] = []
            let watcher = try loop.readLines(from: pipe.writeEnd) { events.append($0) }
            // The write end of an empty pipe is writable, not readable: poke it to be "ready"
            // by closing the read end, which makes the write end report an error condition.
            pipe.closeRead()
            loop.spin(until: { !events.isEmpty }, timeout: .seconds(2))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            #expect(watcher.isCancelled)
            return events
        }
        #expect(events == [.error(EBADF)])
    }
}
