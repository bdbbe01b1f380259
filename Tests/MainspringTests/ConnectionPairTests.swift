import Foundation
import Mainspring
import MainspringTestSupport
import Testing

@Suite("Connections without a listener: makePair and adopting a descriptor")
struct ConnectionPairTests {
    @Test("a pair: lines each way, then a half-close is the other side's end of input")
    func pairCarriesBothWays() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let (client, server) = try await Connection.makePair(on: group.loops[0])
        try await client.send(line: "PING")
        #expect(try await server.readLine() == .line("PING"))
        try await server.send(line: "PONG é")
        #expect(try await client.readLine() == .line("PONG é"))
        // Bytes that are not a line: exact reads see every one.
        try await client.send([0, 255, 10, 13])
        #expect(try await server.read(exactly: 4) == [0, 255, 10, 13])
        client.shutdownOutput()
        #expect(try await server.readLine() == .endOfFile, "the peer's half-close ends the input")
        try await server.send(line: "still open this way")
        #expect(try await client.readLine() == .line("still open this way"))
        server.close()
        client.close()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("a task cancelled with output queued: the peer still gets all of it, then end of input, and the reason is .cancelled; abort() drops it")
    func cancellationSendsWhatWasQueued() async throws {
        let group = try EventLoopGroup(loopCount: 1)
        let loop = group.loops[0]
        // A close sends what was queued within `closeTimeout`: generous here, since the receiver
        // of 4 MiB may be slow on a loaded machine (a run with a build beside it took over 10 s).
        let options = Connection.Options(outputLimit: 16 << 20, closeTimeout: .seconds(300))
        // Far more than a socketpair's buffers hold: most of it is still queued in the library.
        let payload = [UInt8](repeating: 0x61, count: 4 << 20)
        let (sender, receiver) = try await Connection.makePair(on: loop, options: options)
        let (queued, queuedSignal) = AsyncStream.makeStream(of: Void.self)
        let task = Task(executorPreference: loop) {
            try await sender.send(payload)
            try await sender.send(line: "BYE")
            queuedSignal.yield()
            _ = try await sender.readLine()  // the receiver sends nothing: only the cancellation ends this
        }
        for await _ in queued { break }
        task.cancel()
        // Read on the connections' loop: no hop through the cooperative pool per chunk.
        let (received, tail) = try await Task(executorPreference: loop) { () async throws -> (Int, [UInt8]) in
            var received = 0
            var tail: [UInt8] = []
            while let chunk = try await receiver.read(upTo: 1 << 16) {
                received += chunk.count
                tail = Array((tail + chunk).suffix(4))
            }
            return (received, tail)
        }.value
        #expect(received == payload.count + 4 && tail == Array("BYE\n".utf8), "\(received) bytes")
        #expect(await sender.closed == .cancelled)
        let thrown: Connection.CloseReason?
        do { try await task.value; thrown = nil } catch { thrown = error as? Connection.CloseReason }
        #expect(thrown == .cancelled)
        receiver.close()

        // abort(): now, whatever is queued.
        let (aborting, reading) = try await Connection.makePair(on: loop, options: options)
        try await aborting.send(payload)
        aborting.abort()
        var got = 0
        while let chunk = try await reading.read(upTo: 1 << 16) { got += chunk.count }
        #expect(got < payload.count, "the queued output was dropped: \(got) bytes arrived")
        #expect(await aborting.closed == .cancelled)
        reading.close()
        await group.shutdown(gracePeriod: .seconds(2))
    }

    @Test("adopting: one end of the caller's socketpair works as a connection; a pipe, a listening socket, a closed descriptor are refused by name")
    func adoptingDescriptors() async throws {
        var fds: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let peer = fds[1]
        defer { close(peer) }
        let pipeEnds = TestPipe()
        let listening = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listening) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        _ = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listening, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(listen(listening, 1) == 0)
        let unconnected = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(unconnected) }
        let adopted = fds[0]
        let outcome = try await onLoopThread { loop -> (line: String?, errors: [String]) in
            var errors: [String] = []
            for fd in [pipeEnds.readEnd, listening, unconnected, 999_999] {
                do {
                    _ = try Connection.adopting(descriptor: fd, on: loop)
                    errors.append("adopted \(fd)")
                } catch {
                    errors.append("\(error)")
                }
            }
            let connection = try Connection.adopting(descriptor: adopted, on: loop)
            var line: String?
            connection.readLines { event in
                if case .line(let text) = event { line = text }
            }
            _ = "hello from the caller\n".withCString { send(peer, $0, strlen($0), 0) }
            loop.spin(until: { line != nil }, timeout: .seconds(20))
            connection.writeLine("and back")
            connection.close()
            return (line, errors)
        }
        #expect(outcome.line == "hello from the caller")
        var reply = [UInt8](repeating: 0, count: 64)
        let count = recv(peer, &reply, reply.count, 0)
        #expect(count > 0 && String(decoding: reply[..<max(0, count)], as: UTF8.self) == "and back\n")
        #expect(outcome.errors[0] == "descriptor \(pipeEnds.readEnd) is not a connected stream socket: it is a pipe, not a socket")
        #expect(outcome.errors[1].contains("is not a connected stream socket: it is a listening socket"), "\(outcome.errors[1])")
        #expect(outcome.errors[2].contains("a stream socket that is not connected"), "\(outcome.errors[2])")
        #expect(outcome.errors[3] == "file descriptor 999999 is not open")
        // A refused descriptor stays the caller's: still open.
        #expect(fcntl(listening, F_GETFD) != -1 && fcntl(pipeEnds.readEnd, F_GETFD) != -1)
        pipeEnds.closeRead()
        pipeEnds.closeWrite()
    }
}
