import Mainspring
import MainspringTestSupport
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Connection-level scenarios: lines, bytes, ends, resets, refusals, backpressure.
extension ParityScenario {
    /// Records a connection's end on `transcript`.
    static func recordingClose(_ connection: Connection, _ transcript: Transcript) {
        connection.onClose { reason in transcript.add("closed: \(reason)") }
    }

    /// Reads `connection`'s lines into `transcript`: each line (then `onLine`), the end of its
    /// input (then `atEnd`), and any other event.
    static func readingLines(_ connection: Connection, _ transcript: Transcript,
                             onLine: @escaping (String) -> Void = { _ in }, atEnd: @escaping () -> Void = {})
    {
        connection.readLines { event in
            switch event {
            case .line(let text):
                transcript.add("line \(text)")
                onLine(text)
            case .endOfFile:
                transcript.add("end of input")
                atEnd()
            default: transcript.add("\(event)")
            }
        }
    }

    /// What a call that may throw gave: its value, or what it threw.
    static func outcome<T>(_ call: () async throws -> T) async -> String {
        do { return "\(try await call())" } catch { return "threw \(describe(error))" }
    }

    /// An error in words without what differs by nature between the worlds: the address and
    /// port of a failed connect (an ephemeral port on loopback, a fixed one in the simulation).
    static func describe(_ error: any Error) -> String {
        if case .system(let function, let code)? = error as? EventLoopError {
            return "\(function.prefix { $0 != " "}) failed with errno \(code) (\(String(cString: strerror(code))))"
        }
        return "\(error)"
    }

    /// The pattern's period and a stretch of it long enough to compare any read of up to 64 KiB
    /// at any offset.
    private static let periodic: [UInt8] = (0..<(251 * 263)).map { UInt8(truncatingIfNeeded: $0 % 251) }

    /// `count` bytes of a pattern that a reader can check at any offset (byte `i` is `i % 251`).
    static func pattern(_ count: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count)
        while bytes.count < count { bytes += periodic.prefix(count - bytes.count) }
        return bytes
    }

    /// Whether two byte arrays are equal (memcmp: a debug build compares a mebibyte element by
    /// element slowly).
    static func same(_ one: [UInt8]?, _ other: [UInt8]) -> Bool {
        guard let one, one.count == other.count else { return false }
        return one.withUnsafeBytes { a in other.withUnsafeBytes { b in a.count == 0 || memcmp(a.baseAddress!, b.baseAddress!, a.count) == 0 } }
    }

    /// Whether `bytes` (at most 64 KiB) are the pattern's from `offset` on.
    static func isPattern(_ bytes: [UInt8], at offset: Int) -> Bool {
        let start = offset % 251
        guard bytes.count <= periodic.count - start else { return false }
        return bytes.withUnsafeBytes { read in
            periodic.withUnsafeBytes { memcmp(read.baseAddress!, $0.baseAddress! + start, read.count) == 0 }
        }
    }

    /// A closed reason's line for a connection that is done: its `closed` awaited.
    static func ending(_ connection: Connection) async -> String { "closed: \(await connection.closed)" }

    static let tcp: [ParityScenario] = [
        ParityScenario(name: "echo: a line, its echo read with readLine(), then close", server: { connection, transcript in
            recordingClose(connection, transcript)
            readingLines(connection, transcript, onLine: { connection.writeLine($0) }, atEnd: { connection.close() })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "hello")
            transcript.add("read \(String(describing: try await connection.readLine()))")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }),

        ParityScenario(name: "a send after shutdownOutput(): refused (EPIPE), never seen by the peer", server: { connection, transcript in
            readingLines(connection, transcript, atEnd: { connection.writeLine("got your end") })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "first")
            connection.shutdownOutput()
            // The server's answer to the end: the write side is shut by now.
            transcript.add("read \(String(describing: try await connection.readLine()))")
            try? await connection.send(line: "late")
            transcript.add("read \(await outcome { try await connection.readLine() })")
            connection.close()
        }, serverDone: { $0.contains("end of input") }),

        ParityScenario(name: "half-close: the client's end arrives after its line; the server answers and closes", server: { connection, transcript in
            recordingClose(connection, transcript)
            readingLines(connection, transcript, atEnd: {
                connection.writeLine("bye")
                connection.close()
            })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "last words")
            connection.shutdownOutput()
            while let event = try await connection.readLine() { transcript.add("read \(event)") }
            transcript.add("read the end")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }),

        ParityScenario(name: "bytes and lines: read(exactly:), read(until:) and readLine() over one stream", server: { connection, _ in
            connection.write(Array("0123456789abc\r\nline two\npartial".utf8))
            connection.close()
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            transcript.add("exactly \(String(decoding: try await connection.read(exactly: 4) ?? [], as: UTF8.self))")
            transcript.add("until \(String(describing: try await connection.read(until: [0x0D, 0x0A], limit: 64)))")
            transcript.add("line \(String(describing: try await connection.readLine()))")
            transcript.add("line \(String(describing: try await connection.readLine()))")
            transcript.add("line \(String(describing: try await connection.readLine()))")
            connection.close()
        }, serverDone: { _ in true }),

        ParityScenario(name: "startConnecting to a port nobody listens on: closed with ECONNREFUSED", server: { _, _ in
        }, client: { world, transcript in
            let ended = AsyncStream<Void>.makeStream()
            try await world.onClientLoop {
                let connection = try Connection.startConnecting(to: world.serverHost, port: world.refusedPort, on: world.clientLoop)
                connection.onClose { reason in
                    transcript.add("closed: \(reason)")
                    ended.continuation.finish()
                }
            }
            for await _ in ended.stream {}
            // The async connect's error, too.
            transcript.add("connect: \(await outcome { try await Connection.connect(to: world.serverHost, port: world.refusedPort, on: world.clientLoop) })")
        }, serverDone: { _ in true }),

        closeWithUnreadInput,
        aPeerThatStopsReading,
        manyLinesBothWays,
        aMebibyteEchoed,

        ParityScenario(name: "idleTimeout: a server connection that hears nothing for 300 ms closes with .idleTimeout; the client reads the end",
                       options: .init(idleTimeout: .milliseconds(300)), server: { connection, transcript in
            recordingClose(connection, transcript)
            readingLines(connection, transcript, onLine: { connection.writeLine("echo: \($0)") })
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            // Counted from before the line is sent: the server's quiet starts after it read it,
            // and a loaded machine may deliver the end late, never early.
            let clock = world.clientLoop.clock
            let quiet = clock.now
            try await connection.send(line: "one")
            transcript.add("read \(String(describing: try await connection.readLine()))")
            transcript.add("read \(await outcome { try await connection.readLine() })")
            let waited = quiet.duration(to: clock.now)
            transcript.add("the end came after the timeout, within 30 s: \(waited >= .milliseconds(300) && waited < .seconds(30))")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }),

        abortWithInputUnread,
    ]

    /// A client that aborts with the server's echo unread (it never read: the echo waits in its
    /// kernel) resets the stream: it is closed `.cancelled` at once, the server gets ECONNRESET.
    static let abortWithInputUnread = ParityScenario("abort() with the peer's echo unread: closed .cancelled at once, and the peer gets ECONNRESET") { world in
        let accepted = Locked<Connection?>(nil)
        try await world.serving(server: { connection, transcript in
            accepted.withLock { $0 = connection }
            recordingClose(connection, transcript)
            readingLines(connection, transcript, onLine: { connection.writeLine("echo: \($0)") })
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }) { world in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "before")
            // The echo has left the server (on loopback: it is in the client's kernel).
            try await world.settle("the server's echo to leave") {
                guard world.server.has("line"), let server = accepted.value else { return false }
                return try await world.onServerLoop { server.bufferedOutputBytes == 0 }
            }
            try await world.onClientLoop { connection.abort() }
            world.client.add(await ending(connection))
        }
    }

    /// A server that stops reading and closes while the client's bytes wait for it — some in
    /// the connection's input buffer (full: 256 KiB), the rest in the kernel (in the
    /// simulation: on the link) — resets the stream, as TCP does: the client, waiting to read,
    /// gets ECONNRESET.
    static let closeWithUnreadInput = ParityScenario("close with unread input in the kernel: the peer reads ECONNRESET") { world in
        let inputLimit = 262_144
        let accepted = Locked<Connection?>(nil)
        try await world.serving(server: { connection, transcript in
            accepted.withLock { $0 = connection }
            recordingClose(connection, transcript)
            readingLines(connection, transcript, onLine: { _ in
                connection.writeLine("ok")
                connection.stopReading()  // the socket is still read, up to the input limit
            })
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } }) { world in
            let transcript = world.client
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(line: "hello")
            transcript.add("read \(String(describing: try await connection.readLine()))")
            try await connection.send(pattern(inputLimit + 32_768))
            // All of it left the client, and the server's input buffer is full: the rest waits
            // for the server below it (the kernel's receive buffer; the simulation's link).
            try await world.settle("the server's input to fill") {
                let drained = try await world.onClientLoop { connection.bufferedOutputBytes == 0 }
                let server = try #require(accepted.value)
                let full = try await world.onServerLoop { server.bufferedInputBytes >= inputLimit }
                return drained && full
            }
            try #require(accepted.value).close()
            transcript.add("read \(await outcome { try await connection.readLine() })")
            transcript.add(await ending(connection))
        }
    }

    /// A server that closes after reading one line of two that came in one segment: the second
    /// was read from the socket with the first (it waits in the connection's buffer, not the
    /// kernel's), so the close is a plain end of stream on real loops — the client reads the
    /// end of its input.
    static let closeWithInputAlreadyRead = ParityScenario(
        name: "close after one line of two that arrived together: the other was read already, the peer reads the end",
        server: { connection, transcript in
            recordingClose(connection, transcript)
            var first = true
            connection.readLines { event in
                guard first else { return }
                first = false
                transcript.add("first: \(event)")
                connection.close()
            }
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send("one\ntwo\n")
            transcript.add("read \(await outcome { try await connection.readLine() })")
            transcript.add("read \(await outcome { try await connection.readLine() })")
            connection.close()
            transcript.add(await ending(connection))
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } })

    /// A writer whose peer stops reading: `trySend` refuses once `outputLimit` bytes wait, and
    /// once the kernel's buffers (the simulation's window and receive buffer) are full the
    /// output stops moving — `waitUntilWritable` times out. When the peer reads again every
    /// byte arrives, in order.
    static let aPeerThatStopsReading = {
        let total = 8 << 20
        let chunk = pattern(251 * 64)  // a multiple of the pattern's period: every chunk is alike
        return ParityScenario(
            name: "a peer that stops reading: trySend refused at outputLimit, then the writer is not writable for 1 s; all arrives once read",
            options: .init(outputLimit: 65_536),
            server: { connection, transcript in
                recordingClose(connection, transcript)
                Task(executorPreference: connection.loop) {
                    var taken = 0
                    var refused = false
                    var stuck = false
                    do {
                        while taken < total {
                            let piece = taken + chunk.count <= total ? chunk : Array(chunk[..<(total - taken)])
                            if connection.trySend(piece) {
                                taken += piece.count
                                continue
                            }
                            if !refused {
                                refused = true
                                transcript.add("trySend refused: \(connection.outputLimit) bytes wait")
                            }
                            if stuck {
                                _ = try await connection.waitUntilWritable()
                            } else if try await !connection.waitUntilWritable(timeout: .seconds(1)) {
                                stuck = true
                                transcript.add("not writable for 1 s: the output stopped moving")
                            }
                        }
                        transcript.add("all \(taken) bytes taken")
                    } catch {
                        transcript.add("threw \(error)")
                    }
                    connection.close()
                }
            }, client: { world, transcript in
                let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
                try await world.settle("the writer to be stuck") { world.server.has("not writable") }
                var count = 0
                var inOrder = true
                while let bytes = try await connection.read(upTo: 65_536) {
                    if !isPattern(bytes, at: count) { inOrder = false }
                    count += bytes.count
                }
                transcript.add("read \(count) bytes, in order: \(inOrder)")
                connection.close()
            }, serverDone: { $0.contains { $0.hasPrefix("closed") } })
    }()

    /// Thousands of lines each way: the client's, echoed as they come, and the server's own
    /// after the client's end.
    static let manyLinesBothWays = {
        let count = 5_000
        return ParityScenario(name: "many lines both ways: 5,000 echoed, then 2,000 from the server", server: { connection, transcript in
            recordingClose(connection, transcript)
            var lines = 0
            connection.readLines { event in
                switch event {
                case .line(let text):
                    lines += 1
                    connection.writeLine("echo \(text)")
                case .endOfFile:
                    transcript.add("read \(lines) lines, then the end")
                    for index in 0..<2_000 { connection.writeLine("server \(index)") }
                    connection.close()
                default: transcript.add("\(event)")
                }
            }
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            async let sent: Void = {
                for index in 0..<count { try await connection.send(line: "line \(index)") }
                connection.shutdownOutput()
            }()
            var echoes = 0, own = 0, other: [String] = []
            while let event = try await connection.readLine() {
                if case .line(let text) = event, text == "echo line \(echoes)", own == 0 {
                    echoes += 1
                } else if case .line(let text) = event, text == "server \(own)" {
                    own += 1
                } else {
                    other.append("\(event)")
                }
            }
            try await sent
            transcript.add("read \(echoes) echoes in order, then \(own) server lines in order; else: \(other)")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } })
    }()

    /// One mebibyte sent, echoed by the server as it arrives, read back whole.
    static let aMebibyteEchoed = {
        let payload = pattern(1 << 20)
        return ParityScenario(name: "a 1 MiB payload echoed and read back whole", server: { connection, transcript in
            recordingClose(connection, transcript)
            var count = 0
            connection.readBytes { input in
                switch input {
                case .bytes(let bytes):
                    count += bytes.count
                    connection.write(bytes)
                case .endOfFile:
                    transcript.add("read \(count) bytes, then the end")
                    connection.close()
                }
            }
        }, client: { world, transcript in
            let connection = try await Connection.connect(to: world.serverHost, port: world.port, on: world.clientLoop)
            try await connection.send(payload)
            connection.shutdownOutput()
            // Read in pieces and checked against the pattern (a 1 MiB `read(exactly:)` costs some
            // 0.2 s of CPU in a debug build, the same in both worlds).
            var count = 0
            var inOrder = true
            while count < payload.count, let bytes = try await connection.read(upTo: min(65_536, payload.count - count)) {
                if !isPattern(bytes, at: count) { inOrder = false }
                count += bytes.count
            }
            transcript.add("echo: \(count) bytes, in order: \(inOrder)")
            transcript.add("then \(await outcome { try await connection.read(upTo: 16) })")
            connection.close()
        }, serverDone: { $0.contains { $0.hasPrefix("closed") } })
    }()
}
