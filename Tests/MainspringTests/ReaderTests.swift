import Foundation
import Synchronization
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

/// FNV-1a over a stream of bytes: what both ends of a framing test compute.
struct StreamHash: Sendable, Equatable {
    private(set) var value: UInt64 = 0xCBF2_9CE4_8422_2325
    mutating func add(_ bytes: some Sequence<UInt8>) {
        for byte in bytes { value = (value ^ UInt64(byte)) &* 0x100_0000_01B3 }
    }
}

/// The framed protocol of these tests: a header line `LEN n`, then n bytes of body, repeated.
/// `messages` random bodies (a few larger than libevent's 256 KiB input buffer), and the whole
/// stream with the hash of the bodies.
private func framedStream(messages: Int, seed: UInt64) -> (stream: [UInt8], hash: StreamHash) {
    var random = SplitMix(state: seed)
    var stream: [UInt8] = []
    var hash = StreamHash()
    for index in 0..<messages {
        let size = index % 2_500 == 7 ? Int.random(in: 300_000...400_000, using: &random)
            : Int.random(in: 0...1_200, using: &random)
        let body = (0..<size).map { _ in UInt8.random(in: 0...255, using: &random) }
        stream += Array("LEN \(size)\r\n".utf8)
        stream += body
        hash.add(body)
    }
    return (stream, hash)
}

/// Writes `bytes` to a new loopback connection to `port`, in writes of random sizes from 1 byte
/// to 64 KiB, then half-closes; returns the reply (read to the end).
private func sendCut(_ bytes: [UInt8], to port: UInt16, seed: UInt64) throws -> String {
    let client = try TestClient(port: port)
    // The server hashes 10,000 bodies before it answers: minutes are generous in CI, and a
    // sanitizer build needed more than the default 10 s.
    client.setReceiveTimeout(seconds: 180)
    var random = SplitMix(state: seed)
    var offset = 0
    while offset < bytes.count {
        let size = min(bytes.count - offset, Int.random(in: 1...65_536, using: &random))
        client.send(bytes[offset..<(offset + size)])
        offset += size
    }
    client.shutdownWrite()
    return client.readToEnd()
}

/// Reads the framed protocol with `readLine()` and `read(exactly:)` until the end; replies with
/// the count and the hash.
@Sendable private func serveFramed(_ connection: Connection) async {
    var hash = StreamHash()
    var count = 0
    do {
        while let event = try await connection.readLine() {
            guard case .line(let header) = event else { break }
            guard header.hasPrefix("LEN "), let size = Int(header.dropFirst(4)) else {
                try await connection.send(line: "bad header \(header)")
                break
            }
            guard let body = try await connection.read(exactly: size) else {
                try await connection.send(line: "short body")
                break
            }
            hash.add(body)
            count += 1
        }
        try await connection.send(line: "\(count) \(hash.value)")
    } catch {
        // The test sees the missing reply.
    }
    connection.close()
}

@Suite("One input, many readers in turn", .serialized)
struct ReaderTests {
    @Test("async: 10,000 messages of a header line and an N-byte body, pipelined, cut at random sizes: byte-exact")
    func asyncFraming() async throws {
        let group = try EventLoopGroup(loopCount: 2)
        let listener = try await Listener(.tcp(), on: group.loops[0], group: group)
        let server = Task(executorPreference: group.loops[0]) {
            try await withThrowingDiscardingTaskGroup { tasks in
                for try await connection in listener.connections {
                    tasks.addTask(executorPreference: connection.loop) { await serveFramed(connection) }
                }
            }
        }
        let (stream, hash) = framedStream(messages: 10_000, seed: 1)
        let port = listener.port
        let reply = try await onPlainThread { try sendCut(stream, to: port, seed: 2) }
        #expect(reply == "10000 \(hash.value)\n")
        listener.close()
        _ = try? await server.value
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("callbacks: the same protocol with readLines, then readBytes(exactly:), then readLines again")
    func callbackFraming() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let port = try await loop.submit {
            let listener = try Listener(.tcp(), on: loop) { connection in CallbackFramer(connection).start() }
            return listener.port
        }
        let frames = 10_000
        let (stream, hash) = framedStream(messages: frames, seed: 3)
        let reply = try await onPlainThread { try sendCut(stream, to: port, seed: 4) }
        #expect(reply == "\(frames) \(hash.value)\n")
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("switching mid-stream between lines, bytes, readLine and read(until:): nothing lost, nothing repeated")
    func switchingReaders() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let listener = try await Listener(.tcp(), on: loop, group: group)
        let input = "one\r\ntwo\nthree\nABCDEFGHIJ key::value;rest of it\nfour\nlast line without newline"
        let result = Task(executorPreference: loop) { () async throws -> [String] in
            var log: [String] = []
            var accepted = listener.connections.makeAsyncIterator()
            guard let connection = try await accepted.next() else { return ["nothing accepted"] }
            for try await event in connection.lines {
                log.append("lines: \(event)")
                if log.count == 2 { break }
            }
            for try await event in connection.lines {  // again: the third line is still there
                log.append("lines again: \(event)")
                break
            }
            let ten = try await connection.read(exactly: 10) ?? []
            log.append("exactly: \(String(decoding: ten, as: UTF8.self))")
            if case .found(let key)? = try await connection.read(until: Array("::".utf8), limit: 64) {
                log.append("until: \(String(decoding: key, as: UTF8.self))")
            }
            if case .found(let value)? = try await connection.read(until: [0x3B], limit: 64) {
                log.append("until: \(String(decoding: value, as: UTF8.self))")
            }
            log.append("readLine: \(String(describing: try await connection.readLine()))")
            var rest: [UInt8] = []
            for try await chunk in connection.bytes { rest += chunk }
            log.append("bytes: \(String(decoding: rest, as: UTF8.self))")
            log.append("after the end: \(String(describing: try await connection.readLine()))")
            connection.close()
            return log
        }
        let port = listener.port
        try await onPlainThread {
            let client = try TestClient(port: port)
            for byte in Array(input.utf8) { client.send([byte]) }  // one byte at a time
            client.shutdownWrite()
            _ = client.readToEnd()
        }
        let log = try await result.value
        #expect(log == [
            #"lines: line("one")"#, #"lines: line("two")"#, #"lines again: line("three")"#,
            "exactly: ABCDEFGHIJ", "until:  key", "until: value",
            #"readLine: Optional(line("rest of it"))"#,
            "bytes: four\nlast line without newline",
            "after the end: nil",
        ])
        listener.close()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    /// A negative count is a usage error, as `prefix(-5)` is: the program stops with a message
    /// that names the call and the count (a length from the input is the reader's to check
    /// first). Before, it was thrown as `CloseReason.invalidCount`, a "close" that was none.
    @Test("read(exactly:) with a negative count stops the program, naming the call and the count")
    func negativeExactCount() async throws {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let group = try EventLoopGroup(loopCount: 1)
            let (one, _) = try await Connection.makePair(on: group.loops[0])
            _ = try await one.read(exactly: -5)
        }
        let message = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(message.contains("Connection.read(exactly:) needs a count of at least 0, not -5"), "\(message)")
    }

    @Test("a short read(exactly:) at the end leaves its bytes; read(until:) over its limit consumes nothing")
    func shortAndTooLong() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let listener = try await Listener(.tcp(), on: loop, group: group)
        let result = Task(executorPreference: loop) { () async throws -> [String] in
            var log: [String] = []
            var accepted = listener.connections.makeAsyncIterator()
            guard let connection = try await accepted.next() else { return ["nothing accepted"] }
            log.append("until: \(String(describing: try await connection.read(until: [0x0A], limit: 4)))")
            log.append("exactly: \(String(describing: try await connection.read(exactly: 100)))")
            let rest = try await connection.read(upTo: 1_000) ?? []
            log.append("upTo: \(String(decoding: rest, as: UTF8.self))")
            log.append("upTo at the end: \(String(describing: try await connection.read(upTo: 1_000)))")
            connection.close()
            return log
        }
        let port = listener.port
        try await onPlainThread {
            let client = try TestClient(port: port)
            client.send("too long for four\nand a tail")
            client.shutdownWrite()
            _ = client.readToEnd()
        }
        #expect(try await result.value == [
            "until: Optional(MainspringCore.Connection.Delimited.tooLong)", "exactly: nil",
            "upTo: too long for four\nand a tail", "upTo at the end: nil",
        ])
        listener.close()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a callback reader stops after two lines; a task reads on from the third, byte for byte")
    func callbacksThenTask() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        let taken = Mutex<[String]>([])
        let handOff = Mutex<Connection?>(nil)
        let port = try await loop.submit {
            let listener = try Listener(.tcp(), on: loop) { connection in
                connection.readLines { event in
                    guard case .line(let text) = event else { return }
                    taken.withLock { $0.append(text) }
                    if taken.withLock({ $0.count }) == 2 {
                        connection.stopReading()
                        handOff.withLock { $0 = connection }
                    }
                }
            }
            return listener.port
        }
        let client = try await onPlainThread {
            let client = try TestClient(port: port)
            client.send("a\nb\nc\nd")  // all in one write: the callback sees them in one batch
            client.shutdownWrite()
            return client
        }
        var connection: Connection?
        for _ in 0..<1_000 where connection == nil {
            connection = handOff.withLock { $0 }
            if connection == nil { try await Task.sleep(for: .milliseconds(5)) }
        }
        let handed = try #require(connection)
        _ = client
        let rest = try await Task(executorPreference: loop) { () async throws -> [LineEvent] in
            var events: [LineEvent] = []
            for try await event in handed.lines { events.append(event) }
            handed.close()
            return events
        }.value
        #expect(taken.withLock { $0 } == ["a", "b"])
        #expect(rest == [.line("c"), .line("d"), .endOfFile])
        await group.shutdown(gracePeriod: .seconds(2))
    }
}

/// The framed protocol with callbacks: a header through `readLines`, the body through
/// `readBytes(exactly:)`, then `readLines` again.
private final class CallbackFramer {
    let connection: Connection
    var hash = StreamHash()
    var count = 0

    init(_ connection: Connection) { self.connection = connection }

    func start() {
        connection.readLines { [self] event in header(event) }
    }

    private func header(_ event: LineEvent) {
        switch event {
        case .line(let text):
            guard text.hasPrefix("LEN "), let size = Int(text.dropFirst(4)) else {
                connection.writeLine("bad header \(text)")
                connection.close()
                return
            }
            connection.readBytes(exactly: size) { [self] input in
                guard case .bytes(let body) = input else {
                    connection.writeLine("short body")
                    connection.close()
                    return
                }
                hash.add(body)
                count += 1
                start()
            }
        case .endOfFile:
            connection.writeLine("\(count) \(hash.value)")
            connection.close()
        default:
            connection.writeLine("bad input \(event)")
            connection.close()
        }
    }
}
