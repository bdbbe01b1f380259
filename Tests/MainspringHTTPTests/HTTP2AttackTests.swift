import Mainspring
import MainspringHTTP
import MainspringTestSupport
import MainspringTesting
import Testing

/// A raw HTTP/2 client over a simulated connection: it writes frames as an attacker would (the
/// builders of Support/HTTP2RawFrames.swift) and reads the server's frames back.
private final class RawHTTP2Client: @unchecked Sendable {
    let connection: Connection
    private var reader = HTTP2FrameReader()
    private var decoder = HPACKReader()
    /// Every frame read so far, in order.
    private(set) var frames: [HTTP2Frame] = []
    /// How the connection ended (`end of file`, or the close reason), nil while it is open.
    private(set) var ending: String?

    private init(_ connection: Connection) { self.connection = connection }

    /// Connects to the simulation's server, sends the preface and `settings`, and — unless
    /// told not to — acknowledges the server's SETTINGS (sent at once: a server's first frame is
    /// its SETTINGS).
    static func open(on loop: EventLoop, settings: [(id: UInt16, value: UInt32)] = [], acknowledging: Bool = true)
        async throws -> RawHTTP2Client
    {
        let connection = try await Connection.connect(to: "10.0.0.1", port: 80, on: loop)
        try await connection.send(HTTP2Raw.clientPreface + HTTP2Raw.settings(settings)
            + (acknowledging ? HTTP2Raw.settings(ack: true) : []))
        return RawHTTP2Client(connection)
    }

    func send(_ bytes: [UInt8]) async throws { try await connection.send(bytes) }

    /// Reads until a frame satisfies `done` (returned), or the connection ends (nil).
    func read(until done: (HTTP2Frame) -> Bool) async -> HTTP2Frame? {
        while true {
            while let frame = reader.next() {
                frames.append(frame)
                if done(frame) { return frame }
            }
            guard ending == nil else { return nil }
            do {
                if let bytes = try await connection.read(upTo: 1 << 16) { reader.append(bytes) } else { ending = "end of file" }
            } catch {
                ending = "\(error)"
            }
        }
    }

    /// Reads until the server closes the connection, then closes this end.
    func readToEnd() async {
        _ = await read { _ in false }
        connection.close()
    }

    /// The response on `stream` read so far: its `:status` and its body.
    func response(on stream: UInt32) -> (status: String?, body: String) {
        var status: String?
        var body: [UInt8] = []
        var decoder = HPACKReader()
        for frame in frames {
            // Every HEADERS frame goes through the decoder, in order: the table is the connection's.
            if frame.kind == .headers, let block = frame.headerBlockFragment, let fields = decoder.decode(block),
               frame.streamID == stream
            {
                status = fields.first { $0.name == ":status" }?.value ?? status
            }
            if frame.kind == .data, frame.streamID == stream, let data = frame.dataBytes { body += data }
        }
        return (status, String(decoding: body, as: UTF8.self))
    }

    /// Reads until `stream`'s response has ended (END_STREAM) or the stream was reset.
    func awaitResponse(on stream: UInt32) async -> (status: String?, body: String) {
        _ = await read { frame in
            frame.streamID == stream
                && (frame.kind == .rstStream || (frame.kind == .data || frame.kind == .headers) && frame.hasFlag(HTTP2Flags.endStream))
        }
        return response(on: stream)
    }

    /// The GOAWAY frame read, if any.
    var goAway: HTTP2Frame? { frames.last { $0.kind == .goAway } }

    func count(_ kind: HTTP2FrameType) -> Int { frames.count { $0.kind == kind } }
}

/// A request's header block: GET (or `method`) `path` on the test server.
private func request(_ path: String, method: String = "GET") -> [UInt8] {
    HPACKWriter.request(method: method, path: path, authority: "10.0.0.1")
}

/// A simulation with one HTTP/2 server on 10.0.0.1:80 whose routes count what they ran.
private final class AttackBed: @unchecked Sendable {
    let simulation: Simulation
    let server: HTTPServer
    /// Requests a handler ran for.
    let handled = Locked(0)
    /// Chunks `/stream` wrote, and whether it saw its request cancelled.
    let chunksWritten = Locked(0)
    let streamCancelled = Locked(false)

    init(seed: UInt64, configuration: HTTPServer.Configuration = .init(host: "0.0.0.0", port: 80)) async throws {
        simulation = try Simulation(seed: seed)
        simulation.network.latency = .milliseconds(1)
        let group = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1")
        var routes = HTTPRoutes()
        let handled = handled, chunksWritten = chunksWritten, streamCancelled = streamCancelled
        routes.get("/hello") { _ in
            handled.withLock { $0 += 1 }
            return .text("hello\n")
        }
        routes.post("/echo") { request in
            handled.withLock { $0 += 1 }
            return HTTPResponse(body: request.body)
        }
        routes.get("/later") { request async throws in
            handled.withLock { $0 += 1 }
            try await request.loop.sleep(for: .seconds(1))
            return .text("later\n")
        }
        // 200 chunks of 16 KiB, each written only when the writer takes more (backpressure).
        routes.on([.get], "/stream", streaming: { _, writer in
            handled.withLock { $0 += 1 }
            writer.start()
            writer.onCancel { streamCancelled.withLock { $0 = true } }
            func more() {
                while writer.isWritable, chunksWritten.value < 200 {
                    chunksWritten.withLock { $0 += 1 }
                    writer.write([UInt8](repeating: 0x61, count: 16 * 1024))
                }
                if chunksWritten.value == 200 { writer.finish() } else if !writer.isCancelled { writer.onWritable(more) }
            }
            more()
        })
        server = try await HTTPServer(group: group, configuration: configuration, routes: routes)
    }

    func finish() async throws {
        _ = try await simulation.run { await self.server.shutdown(gracePeriod: .seconds(1)) }
        simulation.advance(by: .seconds(5))
        #expect(simulation.network.openStreamEnds == 0)
    }
}

@Suite("HTTP/2 attacks refused (raw frames, in a simulation)")
struct HTTP2AttackTests {
    @Test("what the RFC allows passes: PINGs answered, a header block in CONTINUATION frames, a few resets, then requests served")
    func allowedTrafficPasses() async throws {
        let bed = try await AttackBed(seed: 1)
        let (pings, split, afterResets) = try await bed.simulation.run { () async throws -> (Int, String, String) in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            for index in 0..<10 { try await client.send(HTTP2Raw.ping([UInt8](repeating: UInt8(index), count: 8))) }
            _ = await client.read { $0.kind == .ping && $0.payload == [UInt8](repeating: 9, count: 8) }
            let block = request("/hello")
            try await client.send(HTTP2Raw.headers(stream: 1, block: Array(block[..<3]), endStream: true, endHeaders: false)
                + HTTP2Raw.continuation(stream: 1, block: Array(block[3..<5]), endHeaders: false)
                + HTTP2Raw.continuation(stream: 1, block: Array(block[5...]), endHeaders: true))
            let first = await client.awaitResponse(on: 1)
            var resets: [UInt8] = []
            for stream in stride(from: UInt32(3), through: 101, by: 2) {
                resets += HTTP2Raw.headers(stream: stream, block: request("/later"), endStream: true)
                    + HTTP2Raw.rstStream(stream: stream, code: .cancel)
            }
            try await client.send(resets + HTTP2Raw.headers(stream: 103, block: request("/hello"), endStream: true))
            let last = await client.awaitResponse(on: 103)
            client.connection.close()
            return (client.frames.count { $0.kind == .ping && $0.hasFlag(HTTP2Flags.ack) }, "\(first.status ?? "-") \(first.body)",
                    "\(last.status ?? "-") \(last.body)")
        }
        #expect(pings == 10)
        #expect(split == "200 hello\n")
        #expect(afterResets == "200 hello\n")
        try await bed.finish()
    }

    @Test("Rapid Reset (CVE-2023-44487): 3,000 streams opened and reset at once end the connection with ENHANCE_YOUR_CALM, no handler run for them")
    func rapidReset() async throws {
        let bed = try await AttackBed(seed: 2)
        let client = try await bed.simulation.run { () async throws -> RawHTTP2Client in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            var bytes: [UInt8] = []
            let block = request("/hello")
            for index in 0..<3_000 {
                let stream = UInt32(1 + 2 * index)
                bytes += HTTP2Raw.headers(stream: stream, block: block, endStream: true) + HTTP2Raw.rstStream(stream: stream, code: .cancel)
            }
            try await client.send(bytes)
            await client.readToEnd()
            return client
        }
        #expect(client.goAway?.goAwayErrorCode == .enhanceYourCalm, "\(client.frames.suffix(3))")
        #expect(bed.handled.value == 0)
        #expect(client.ending == "end of file")
        try await bed.finish()
    }

    @Test("CONTINUATION flood (CVE-2024-27316): endless CONTINUATION frames after one HEADERS end the connection with ENHANCE_YOUR_CALM")
    func continuationFlood() async throws {
        let bed = try await AttackBed(seed: 3)
        let client = try await bed.simulation.run { () async throws -> RawHTTP2Client in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            var bytes = HTTP2Raw.headers(stream: 1, block: request("/hello"), endStream: true, endHeaders: false)
            for _ in 0..<10_000 {
                var field = HPACKWriter()
                field.literal(name: "x-pad", value: "y")
                bytes += HTTP2Raw.continuation(stream: 1, block: field.bytes, endHeaders: false)
            }
            try await client.send(bytes)
            await client.readToEnd()
            return client
        }
        #expect(client.goAway?.goAwayErrorCode == .enhanceYourCalm, "\(client.frames.suffix(3))")
        #expect(bed.handled.value == 0)
        try await bed.finish()
    }

    @Test("HPACK bomb: a header list that decodes to 8 MB from 6 KB is answered 431; the connection serves the next request")
    func hpackBomb() async throws {
        let bed = try await AttackBed(seed: 4)
        let (bomb, next, goAway) = try await bed.simulation.run { () async throws -> (String, String, HTTP2Frame?) in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            var block = HPACKWriter()
            block.appendRaw(request("/hello"))
            block.literalIndexed(name: "x-bomb", value: String(repeating: "a", count: 4_000))
            for _ in 0..<2_000 { block.indexed(62) }  // the entry just added, 2,000 times over
            try await client.send(HTTP2Raw.headers(stream: 1, block: block.bytes, endStream: true))
            let bomb = await client.awaitResponse(on: 1)
            try await client.send(HTTP2Raw.headers(stream: 3, block: request("/hello"), endStream: true))
            let next = await client.awaitResponse(on: 3)
            client.connection.close()
            return ("\(bomb.status ?? "-") \(bomb.body)", "\(next.status ?? "-") \(next.body)", client.goAway)
        }
        #expect(bomb == "431 request head larger than 8192 bytes\n")
        #expect(next == "200 hello\n")
        #expect(goAway == nil)
        #expect(bed.handled.value == 1)
        try await bed.finish()
    }

    @Test("SETTINGS, PING and empty-DATA floods each end the connection with ENHANCE_YOUR_CALM", arguments: ["settings", "ping", "empty data"])
    func controlFloods(kind: String) async throws {
        let bed = try await AttackBed(seed: 5)
        let client = try await bed.simulation.run { () async throws -> RawHTTP2Client in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            var bytes: [UInt8] = []
            switch kind {
            case "settings": for _ in 0..<5_000 { bytes += HTTP2Raw.settings([(HTTP2Raw.maxFrameSize, 16_384)]) }
            case "ping": for _ in 0..<5_000 { bytes += HTTP2Raw.ping() }
            default:
                bytes = HTTP2Raw.headers(stream: 1, block: request("/echo", method: "POST"), endStream: false)
                for _ in 0..<5_000 { bytes += HTTP2Raw.data(stream: 1, [], endStream: false) }
            }
            try await client.send(bytes)
            await client.readToEnd()
            return client
        }
        #expect(client.goAway?.goAwayErrorCode == .enhanceYourCalm, "\(kind): \(client.frames.suffix(3))")
        // The limit's burst (500) and no more was answered.
        #expect(client.count(.ping) <= 501 && client.count(.settings) <= 502, "\(kind)")
        #expect(bed.handled.value == 0)
        try await bed.finish()
    }

    @Test("a client that never opens its window: the streamed response waits (its writer held back), and is reset CANCEL exactly idleTimeout after it last moved")
    func windowNeverOpened() async throws {
        var configuration = HTTPServer.Configuration(host: "0.0.0.0", port: 80, idleTimeout: .seconds(2))
        configuration.http2 = .init()
        let bed = try await AttackBed(seed: 6, configuration: configuration)
        let (reset, elapsed) = try await bed.simulation.run { () async throws -> (HTTP2Frame?, Duration) in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop, settings: [(HTTP2Raw.initialWindowSize, 0)])
            let start = bed.simulation.now
            try await client.send(HTTP2Raw.headers(stream: 1, block: request("/stream"), endStream: true))
            let reset = await client.read { $0.kind == .rstStream }
            let elapsed = bed.simulation.now - start
            client.connection.close()
            return (reset, elapsed)
        }
        #expect(reset?.streamID == 1 && reset?.rstStreamErrorCode == .cancel)
        // The request's trip (1 ms), two seconds without a byte leaving, the reset's trip back.
        #expect(elapsed == .milliseconds(2_002), "\(elapsed)")
        // Backpressure: the writer stopped at its high-water mark (256 KiB) and saw the cancel.
        #expect(bed.chunksWritten.value <= 17, "\(bed.chunksWritten.value)")
        #expect(bed.streamCancelled.value)
        #expect(bed.server.statistics.snapshot.requestsInFlight == 0)
        try await bed.finish()
    }

    @Test("the stream limit: a stream past SETTINGS_MAX_CONCURRENT_STREAMS is refused (REFUSED_STREAM), the ones before it are served")
    func streamLimit() async throws {
        var configuration = HTTPServer.Configuration(host: "0.0.0.0", port: 80)
        configuration.http2?.maxConcurrentStreams = 4
        let bed = try await AttackBed(seed: 7, configuration: configuration)
        let client = try await bed.simulation.run { () async throws -> RawHTTP2Client in
            // Not acknowledged yet: the limit is the server's to enforce stream by stream.
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop, acknowledging: false)
            var bytes: [UInt8] = []
            for stream in stride(from: UInt32(1), through: 9, by: 2) {
                bytes += HTTP2Raw.headers(stream: stream, block: request("/later"), endStream: true)
            }
            try await client.send(bytes)
            for stream in stride(from: UInt32(1), through: 7, by: 2) { _ = await client.awaitResponse(on: stream) }
            client.connection.close()
            return client
        }
        let refused = client.frames.first { $0.kind == .rstStream && $0.streamID == 9 }
        #expect(refused?.rstStreamErrorCode == .refusedStream)
        for stream in stride(from: UInt32(1), through: 7, by: 2) {
            #expect(client.response(on: stream).status == "200")
        }
        #expect(bed.handled.value == 4)
        #expect(client.goAway == nil)
        try await bed.finish()
    }

    @Test("a client that acknowledged the stream limit and goes past it breaks the protocol: GOAWAY PROTOCOL_ERROR")
    func streamLimitBrokenAfterAcknowledging() async throws {
        var configuration = HTTPServer.Configuration(host: "0.0.0.0", port: 80)
        configuration.http2?.maxConcurrentStreams = 4
        let bed = try await AttackBed(seed: 7, configuration: configuration)
        let client = try await bed.simulation.run { () async throws -> RawHTTP2Client in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            var bytes: [UInt8] = []
            for stream in stride(from: UInt32(1), through: 9, by: 2) {
                bytes += HTTP2Raw.headers(stream: stream, block: request("/later"), endStream: true)
            }
            try await client.send(bytes)
            await client.readToEnd()
            return client
        }
        #expect(client.goAway?.goAwayErrorCode == .protocolError, "\(client.frames.suffix(2))")
        try await bed.finish()
    }

    @Test("a graceful shutdown sends GOAWAY (NO_ERROR) naming the last stream, finishes that stream, then closes")
    func drainByGoAway() async throws {
        let bed = try await AttackBed(seed: 8)
        let (client, report) = try await bed.simulation.run { () async throws -> (RawHTTP2Client, HTTPServer.ShutdownReport) in
            let client = try await RawHTTP2Client.open(on: bed.simulation.loop)
            try await client.send(HTTP2Raw.headers(stream: 1, block: request("/later"), endStream: true))
            try await bed.simulation.loop.sleep(for: .milliseconds(100))
            async let report = bed.server.shutdown(gracePeriod: .seconds(5))
            await client.readToEnd()
            return (client, await report)
        }
        #expect(client.goAway?.goAwayErrorCode == .noError)
        #expect(client.goAway?.goAwayLastStreamID == 1)
        let goAwayIndex = client.frames.firstIndex { $0.kind == .goAway } ?? -1
        let endIndex = client.frames.firstIndex { $0.kind == .data && $0.streamID == 1 && $0.hasFlag(HTTP2Flags.endStream) } ?? -1
        #expect(goAwayIndex >= 0 && goAwayIndex < endIndex, "the GOAWAY comes first, the answer after it")
        #expect(client.response(on: 1).status == "200" && client.response(on: 1).body == "later\n")
        #expect(report.finished == 1 && report.aborted == 0, "\(report)")
        #expect(client.ending == "end of file")
        bed.simulation.advance(by: .seconds(2))
        #expect(bed.simulation.network.openStreamEnds == 0)
    }
}
