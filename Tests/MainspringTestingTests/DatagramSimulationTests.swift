import Foundation
import Mainspring
import MainspringTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// UDP on the simulation's network: the library's own `DatagramSocket` over in-memory datagrams
/// on virtual time — loss, duplication and reordering chosen by the seed and replayed by it,
/// partitions, port-unreachable, a full receive buffer. No descriptor, no real time.
@Suite struct DatagramSimulationTests {
    /// What one socket received, as text with the sender, in order.
    final class Received {
        var events: [String] = []
        var payloads: [String] = []
        var times: [Duration] = []
    }

    /// Starts recording what `socket` receives.
    private func record(_ socket: DatagramSocket, into received: Received, simulation: Simulation) throws {
        try socket.onReceive { event in
            switch event {
            case .datagram(let datagram):
                let text = String(decoding: datagram.bytes, as: UTF8.self)
                received.payloads.append(text)
                received.events.append("\(text) from \(datagram.address.map(\.description) ?? "?")")
            case .error(let code):
                received.events.append("error \(code)")
            }
            received.times.append(simulation.now)
        }
    }

    /// A request across two hosts and its echo: each leg one latency, the sender seen at its
    /// host's address, the echo at the server's.
    @Test func anEchoTakesTwoLatencies() throws {
        let simulation = try Simulation(seed: 1)
        simulation.network.latency = .milliseconds(15)
        let serverLoop = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2").loops[0]
        let clientLoop = try simulation.makeGroup(loopCount: 1, host: "10.0.0.1").loops[0]
        let server = try DatagramSocket(bindingTo: "0.0.0.0", port: 5353, on: serverLoop)
        try server.onReceive { event in
            if case .datagram(let datagram) = event, let sender = datagram.address {
                _ = try? server.trySend(Datagram(datagram.bytes.reversed(), to: sender))
            }
        }
        let client = try DatagramSocket(bindingTo: "0.0.0.0", port: 0, on: clientLoop)
        let received = Received()
        try record(client, into: received, simulation: simulation)
        #expect(client.localAddress.port != 0 && server.localAddress.description == "0.0.0.0:5353")
        #expect(try client.trySend(Datagram(Array("olleh".utf8), to: SocketAddress(ipAddress: "10.0.0.2", port: 5353))) == .sent)
        simulation.advance(by: .seconds(1))
        #expect(received.events == ["hello from 10.0.0.2:5353"])
        #expect(received.times == [.milliseconds(30)])
        #expect(server.statistics.datagramsReceived == 1 && server.statistics.datagramsSent == 1)
        client.close()
        server.close()
        #expect(simulation.network.boundDatagramPorts == 0)
    }

    /// 2,000 numbered datagrams with 10% loss, 5% duplication, 10% reordering: what arrives is
    /// what the fault counts say (sent − lost + duplicated), out of order where reordered — and
    /// the same seed replays the very same arrivals, another seed does not.
    @Test func lossDuplicationAndReorderingFollowTheSeed() throws {
        func run(seed: UInt64) throws -> (payloads: [String], faults: [String: Int]) {
            let simulation = try Simulation(seed: seed)
            simulation.network.latency = .milliseconds(5)
            simulation.network.datagramLoss = 0.1
            simulation.network.datagramDuplication = 0.05
            simulation.network.datagramReordering = 0.1
            let loop = simulation.loop
            let receiver = try DatagramSocket(bindingTo: "127.0.0.1", port: 9000, on: loop)
            let received = Received()
            try record(receiver, into: received, simulation: simulation)
            let sender = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
            try sender.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 9000))
            var sent = 0
            let timer = loop.schedule(every: .milliseconds(1)) { _ in
                guard sent < 2_000 else { return }
                _ = try? sender.trySend(Datagram(Array("\(sent)".utf8)))
                sent += 1
            }
            simulation.advance(by: .seconds(3))
            timer.cancel()
            sender.close()
            receiver.close()
            return (received.payloads, simulation.network.faults)
        }
        let first = try run(seed: 42)
        let lost = first.faults["datagram-loss"] ?? 0
        let duplicated = first.faults["datagram-duplicate"] ?? 0
        let reordered = first.faults["datagram-reorder"] ?? 0
        // Around 200, 100 and 200: the seed's draws, not a bound on time.
        #expect((100...300).contains(lost) && (40...160).contains(duplicated) && (100...300).contains(reordered), "\(first.faults)")
        #expect(first.payloads.count == 2_000 - lost + duplicated)
        let numbers = first.payloads.compactMap(Int.init)
        #expect(Set(numbers).count == 2_000 - lost, "every datagram not lost arrived")
        let inversions = zip(numbers, numbers.dropFirst()).filter { $0 > $1 }.count
        #expect(inversions > 0, "reordered datagrams arrive after later ones")
        #expect(try run(seed: 42).payloads == first.payloads, "the same seed replays the same arrivals")
        #expect(try run(seed: 43).payloads != first.payloads)
    }

    /// Without faults, datagrams from one sender arrive in the order sent, each once, one
    /// latency after they were sent; what waited for a consumer is handed over 64 a wakeup
    /// (`maximumDatagramsPerWakeup`), as from a descriptor with a backlog.
    @Test func withoutFaultsDatagramsArriveInOrder() throws {
        let simulation = try Simulation(seed: 3)
        simulation.network.latency = .milliseconds(2)
        let loop = simulation.loop
        let receiver = try DatagramSocket(bindingTo: "127.0.0.1", port: 9001, on: loop)
        let sender = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
        let destination = try SocketAddress(ipAddress: "127.0.0.1", port: 9001)
        let taken = try sender.trySend(contentsOf: (0..<500).map { Datagram(Array("\($0)".utf8), to: destination) })
        #expect(taken == 500 && sender.statistics.datagramsSent == 500)
        simulation.advance(by: .seconds(1))  // all arrived at 2 ms; nobody reads yet
        let received = Received()
        try record(receiver, into: received, simulation: simulation)
        simulation.runUntilIdle()
        #expect(received.payloads == (0..<500).map { "\($0)" })
        #expect(receiver.statistics.receiveBatches == 8 && receiver.statistics.datagramsReceived == 500)

        // Read as they come: each at its arrival, in order.
        _ = try sender.trySend(contentsOf: (500..<510).map { Datagram(Array("\($0)".utf8), to: destination) })
        let before = received.times.count
        simulation.advance(by: .seconds(1))
        #expect(received.payloads.suffix(10) == (500..<510).map { "\($0)" })
        #expect(Set(received.times.dropFirst(before)) == [.milliseconds(1_002)])
        sender.close()
        receiver.close()
    }

    /// A partition loses what crosses it (UDP does not wait); after the heal datagrams arrive again.
    @Test func aPartitionLosesDatagrams() throws {
        let simulation = try Simulation(seed: 4)
        simulation.network.latency = .milliseconds(1)
        let serverLoop = try simulation.makeGroup(loopCount: 1, host: "10.0.0.2").loops[0]
        let receiver = try DatagramSocket(bindingTo: "10.0.0.2", port: 53, on: serverLoop)
        let received = Received()
        try record(receiver, into: received, simulation: simulation)
        let sender = try DatagramSocket(bindingTo: "0.0.0.0", port: 0, on: simulation.loop)
        let destination = try SocketAddress(ipAddress: "10.0.0.2", port: 53)
        _ = try sender.trySend(Datagram(Array("before".utf8), to: destination))
        simulation.advance(by: .milliseconds(10))
        simulation.network.partition("127.0.0.1", "10.0.0.2")
        _ = try sender.trySend(Datagram(Array("during".utf8), to: destination))
        simulation.advance(by: .milliseconds(10))
        simulation.network.heal("127.0.0.1", "10.0.0.2")
        _ = try sender.trySend(Datagram(Array("after".utf8), to: destination))
        simulation.advance(by: .seconds(1))
        #expect(received.payloads == ["before", "after"])
        #expect(received.events.first == "before from 127.0.0.1:\(sender.localAddress.port)")
        sender.close()
        receiver.close()
    }

    /// A datagram to a port nobody binds: a socket connected there reports ECONNREFUSED one
    /// round trip later (the port-unreachable); an unconnected one hears nothing.
    @Test func aClosedPortAnswersPortUnreachableToAConnectedSocket() throws {
        let simulation = try Simulation(seed: 5)
        simulation.network.latency = .milliseconds(7)
        let loop = simulation.loop
        let nobody = try SocketAddress(ipAddress: "127.0.0.1", port: 9999)
        let connected = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
        try connected.connect(to: nobody)
        let loose = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
        let connectedEvents = Received()
        let looseEvents = Received()
        try record(connected, into: connectedEvents, simulation: simulation)
        try record(loose, into: looseEvents, simulation: simulation)
        _ = try connected.trySend(Datagram(Array("x".utf8)))
        _ = try loose.trySend(Datagram(Array("x".utf8), to: nobody))
        simulation.advance(by: .seconds(1))
        #expect(connectedEvents.events == ["error \(ECONNREFUSED)"])
        #expect(connectedEvents.times == [.milliseconds(14)])
        #expect(looseEvents.events.isEmpty)
        // A connected socket takes datagrams from its peer only.
        let other = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
        _ = try other.trySend(Datagram(Array("stray".utf8), to: connected.localAddress))
        simulation.advance(by: .seconds(1))
        #expect(connectedEvents.events.count == 1)
        for socket in [connected, loose, other] { socket.close() }
    }

    /// A socket nobody reads keeps what fits its receive buffer and drops the rest, as the
    /// kernel does; a datagram over `maximumDatagramSize` arrives truncated, with its length.
    @Test func aFullReceiveBufferDropsAndALongDatagramIsTruncated() throws {
        let simulation = try Simulation(seed: 6)
        let loop = simulation.loop
        var options = DatagramSocket.Options()
        options.receiveBufferSize = 16_384
        options.maximumDatagramSize = 4_096
        let receiver = try DatagramSocket(bindingTo: "127.0.0.1", port: 9002, on: loop, options: options)
        let sender = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
        let destination = receiver.localAddress
        for index in 0..<10 { _ = try sender.trySend(Datagram([UInt8](repeating: UInt8(index), count: 4_096), to: destination)) }
        simulation.advance(by: .seconds(1))  // nobody reads yet
        var firstBytes: [UInt8] = []
        try receiver.onReceive { event in
            if case .datagram(let datagram) = event { firstBytes.append(datagram.bytes[0]) }
        }
        simulation.runUntilIdle()
        #expect(firstBytes == [0, 1, 2, 3], "16 KiB holds four 4 KiB datagrams; the other six were dropped")

        var truncated: Datagram?
        receiver.close()
        let second = try DatagramSocket(bindingTo: "127.0.0.1", port: 9002, on: loop, options: options)
        try second.onReceive { event in
            if case .datagram(let datagram) = event { truncated = datagram }
        }
        _ = try sender.trySend(Datagram([UInt8](repeating: 7, count: 5_000), to: destination))
        simulation.runUntilIdle()
        #expect(truncated?.isTruncated == true && truncated?.bytes.count == 4_096 && truncated?.length == 5_000)
        #expect(second.statistics.datagramsTruncated == 1)
        sender.close()
        second.close()
        #expect(simulation.network.boundDatagramPorts == 0)
    }

    /// Empty datagrams take room too: a socket nobody reads keeps at most 4,096 of them.
    @Test func emptyDatagramsFillTheBufferToo() throws {
        let simulation = try Simulation(seed: 9)
        let loop = simulation.loop
        let receiver = try DatagramSocket(bindingTo: "127.0.0.1", port: 9004, on: loop)
        let sender = try DatagramSocket(bindingTo: "127.0.0.1", port: 0, on: loop)
        let taken = try sender.trySend(contentsOf: Array(repeating: Datagram([], to: receiver.localAddress), count: 5_000))
        #expect(taken == 5_000)
        simulation.advance(by: .seconds(1))
        var received = 0
        try receiver.onReceive { event in
            if case .datagram(let datagram) = event, datagram.bytes.isEmpty { received += 1 }
        }
        simulation.runUntilIdle()
        #expect(received == 4_096)
        sender.close()
        receiver.close()
    }

    /// A port in use is refused with EADDRINUSE (and is free again once closed); an address
    /// of another host with EADDRNOTAVAIL; multicast is refused with a clear error.
    @Test func bindingErrorsAreTheKernels() throws {
        let simulation = try Simulation(seed: 7)
        let loop = simulation.loop
        let first = try DatagramSocket(bindingTo: "0.0.0.0", port: 7000, on: loop)
        #expect {
            _ = try DatagramSocket(bindingTo: "127.0.0.1", port: 7000, on: loop)
        } throws: { error in
            guard case DatagramError.system(_, let code) = error else { return false }
            return code == EADDRINUSE
        }
        #expect {
            _ = try DatagramSocket(bindingTo: "10.9.9.9", port: 7001, on: loop)
        } throws: { error in
            guard case DatagramError.system(_, let code) = error else { return false }
            return code == EADDRNOTAVAIL
        }
        #expect {
            try first.joinMulticastGroup("239.1.2.3")
        } throws: { error in
            guard case DatagramError.loop(.simulatedLoop(let refused)) = error else { return false }
            return refused.contains("239.1.2.3")
        }
        first.close()
        let again = try DatagramSocket(bindingTo: "0.0.0.0", port: 7000, on: loop)
        again.close()
    }

    /// The library's rule for dropping a handle: a socket that nothing can read any more (no
    /// handler, no sequence) closes with its last handle; one with a consumer lives on.
    @Test func aDroppedSocketClosesUnlessItHasAConsumer() throws {
        let simulation = try Simulation(seed: 31)
        simulation.network.latency = .milliseconds(5)
        let loop = simulation.loop
        let received = Received()
        do {
            _ = try DatagramSocket(bindingTo: "127.0.0.1", port: 7001, on: loop)  // no consumer
            let kept = try DatagramSocket(bindingTo: "127.0.0.1", port: 7002, on: loop)
            try record(kept, into: received, simulation: simulation)
        }
        simulation.runUntilIdle()
        #expect(simulation.network.boundDatagramPorts == 1, "the socket with no consumer closed, the other lives")
        let again = try DatagramSocket(bindingTo: "127.0.0.1", port: 7001, on: loop)  // its port is free
        #expect(try again.trySend(Datagram(Array("still here".utf8), to: SocketAddress(ipAddress: "127.0.0.1", port: 7002))) == .sent)
        simulation.advance(by: .milliseconds(5))
        #expect(received.payloads == ["still here"])
        again.close()
    }

    /// The rule for a source's one consumer: cancelling the task that iterates `datagrams()`
    /// ends the sequence and closes the socket (its port is free again), as it closes a
    /// listener or a signal watch.
    @Test func cancellingTheSequencesConsumerClosesTheSocket() async throws {
        let simulation = try Simulation(seed: 32)
        let loop = simulation.loop
        let (boundWhileReading, closedAfter, boundAfter) = try await simulation.run {
            () async throws -> (Int, Bool, Int) in
            let socket = try await DatagramSocket.bind(to: "127.0.0.1", port: 7003, on: loop)
            let reader = Task(executorPreference: loop) { () async throws -> Int in
                var count = 0
                for await _ in try await socket.datagrams() { count += 1 }
                return count
            }
            try await loop.sleep(for: .seconds(1))
            let bound = simulation.network.boundDatagramPorts
            reader.cancel()
            #expect(try await reader.value == 0)
            let closed = try await loop.submit { socket.isClosed }
            return (bound, closed, simulation.network.boundDatagramPorts)
        }
        #expect(boundWhileReading == 1)
        #expect(closedAfter)
        #expect(boundAfter == 0)
    }

    /// The async face: `datagrams()` and `send(_:)` from a task, on virtual time.
    @Test func theAsyncSequenceRunsOnVirtualTime() async throws {
        let simulation = try Simulation(seed: 8)
        simulation.network.latency = .milliseconds(25)
        let loop = simulation.loop
        let (texts, at) = try await simulation.run { () async throws -> ([String], Duration) in
            let receiver = try await DatagramSocket.bind(to: "127.0.0.1", port: 9003, on: loop)
            let sender = try await DatagramSocket.bind(to: "127.0.0.1", port: 0, on: loop)
            for text in ["a", "b", "c"] {
                try await sender.send(Datagram(Array(text.utf8), to: receiver.localAddress))
            }
            var texts: [String] = []
            for await event in try await receiver.datagrams() {
                if case .datagram(let datagram) = event { texts.append(String(decoding: datagram.bytes, as: UTF8.self)) }
                if texts.count == 3 { break }
            }
            let at = simulation.now
            await sender.close()
            await receiver.close()
            return (texts, at)
        }
        #expect(texts == ["a", "b", "c"] && at == .milliseconds(25))
        #expect(simulation.network.boundDatagramPorts == 0)
    }
}
