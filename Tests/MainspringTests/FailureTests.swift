import Foundation
import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// Every path where the loop could not register a source again ends that source with an error
/// the user sees, and counts it — nothing goes deaf silently. The failures are injected
/// (`EventBase.injectedRegistrationFailures`, per loop) as the `EBADF` that `epoll_ctl` gives for
/// a descriptor closed behind the loop's back.
@Suite("No swallowed failure: a source the loop cannot poll again fails loudly", .serialized)
struct FailureTests {
    @Test("a watcher held back while its handler spins, then refused: cancelled and counted")
    func heldBackWatcher() async throws {
        let pipe = TestPipe()
        defer { pipe.closeRead(); pipe.closeWrite() }
        let (cancelled, failures, runs) = try await onLoopThread { loop -> (Bool, Int, Int) in
            pipe.write("x")  // stays readable: the watcher is held back while its handler spins
            nonisolated(unsafe) var runs = 0
            let watcher = try loop.watch(pipe.readEnd, for: .read) { _ in
                runs += 1
                if runs == 1 {
                    loop.spin(until: { false }, timeout: .milliseconds(20))
                    loop.base.injectedRegistrationFailures = 1  // the re-add after the handler
                }
            }
            loop.spin(until: { watcher.isCancelled }, timeout: .seconds(5))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            return (watcher.isCancelled, loop.metrics.sourceFailures, runs)
        }
        #expect(cancelled)
        #expect(failures == 1)
        #expect(runs == 1, "a failed watcher never runs again")
    }

    @Test("a dropped Watcher handle goes on: its handler still runs (the library's rule for handles)")
    func droppedWatcherLivesOn() async throws {
        let pipe = TestPipe()
        defer { pipe.closeRead(); pipe.closeWrite() }
        let runs = try await onLoopThread { loop -> Int in
            nonisolated(unsafe) var runs = 0
            _ = try loop.watch(pipe.readEnd, for: .read) { _ in  // the handle dropped at once
                runs += 1
                var byte: UInt8 = 0
                _ = read(pipe.readEnd, &byte, 1)
            }
            for (index, byte) in ["a", "b", "c"].enumerated() {
                pipe.write(byte)
                loop.spin(until: { runs == index + 1 }, timeout: .seconds(10))
            }
            return runs
        }
        #expect(runs == 3)
    }

    @Test("a line reader whose fd the loop refuses again reports .error(EBADF), then ends")
    func lineReaderReports() async throws {
        let pipe = TestPipe()
        defer { pipe.closeRead(); pipe.closeWrite() }
        let (events, failures) = try await onLoopThread { loop -> ([LineEvent], Int) in
            // More than one read's worth (64 KiB), so the fd stays readable while the handler spins.
            let filler = String(repeating: "abcdefghijklmnopqrstuvwxyz0123456789\n", count: 2_000)
            startThread { pipe.write("one\n" + filler) }
            nonisolated(unsafe) var events: [LineEvent] = []
            let reader = try loop.readLines(from: pipe.readEnd) { event in
                events.append(event)
                if events.count == 1 {
                    loop.spin(until: { false }, timeout: .milliseconds(20))  // held back meanwhile
                    loop.base.injectedRegistrationFailures = 1
                }
            }
            loop.spin(until: { reader.isCancelled }, timeout: .seconds(5))
            return (events, loop.metrics.sourceFailures)
        }
        #expect(events.first == .line("one"))
        #expect(events.last == .error(EBADF))
        #expect(events.dropFirst().dropLast().allSatisfy { $0 == .line("abcdefghijklmnopqrstuvwxyz0123456789") })
        #expect(events.count < 2_002, "the reader ended at the failure, before the rest of the input")
        #expect(failures == 1)
    }

    @Test("a connection whose socket the loop refuses closes with .error(EBADF), once")
    func connectionCloses() async throws {
        let (reasons, failures) = try await onLoopThread { loop -> ([Connection.CloseReason], Int) in
            nonisolated(unsafe) var reasons: [Connection.CloseReason] = []
            nonisolated(unsafe) var accepted: Connection?
            let listener = try Listener(.tcp(), on: loop) { connection in
                accepted = connection
                connection.onClose { reasons.append($0) }
                loop.base.injectedRegistrationFailures = 1
                connection.readLines { _ in }  // enabling the read fails
            }
            let client = try Connection.startConnecting(to: "127.0.0.1", port: listener.port, on: loop)
            client.writeLine("hello")
            loop.spin(until: { !reasons.isEmpty }, timeout: .seconds(5))
            loop.spin(until: { false }, timeout: .milliseconds(20))
            listener.close()
            client.close()
            _ = accepted
            return (reasons, loop.metrics.sourceFailures)
        }
        #expect(reasons == [.error(EBADF)])
        #expect(failures == 1)
    }

    @Test("libevent's errors carry the errno: the description names it")
    func libeventErrno() {
        let error = EventLoopError.libevent(function: "event_add", errno: EBADF)
        #expect(error.description.contains("event_add") && error.description.contains("errno \(EBADF)"))
        #expect(!EventLoopError.libevent(function: "event_new").description.contains("errno"))
    }
}
