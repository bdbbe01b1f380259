import CMainspringSystem
import Foundation
import Testing
@testable import MainspringServices
import MainspringTestSupport
@testable import MainspringCore

#if canImport(Glibc)
import Glibc
#endif

// The service-manager protocols in process: notification datagrams to a fake notify socket,
// the environment parsers (fed dictionaries, so the test runner's own environment is never
// touched) and the watchdog over a real group. Adopting descriptors as listeners is in
// AdoptedListenerTests.swift; what needs the process environment or descriptors from 3 on runs
// in subprocesses (DaemonSystemdTests.swift).

@Suite("Service manager notifications")
struct ServiceNotifierTests {
    @Test("each notification is one datagram of KEY=value lines, in the order given, status last")
    func datagrams() throws {
        let fake = try FakeNotifySocket()
        let notifier = try ServiceNotifier(address: fake.address)
        #expect(notifier.isEnabled && notifier.address == fake.address)
        try notifier.notify(.ready, .status("serving on 127.0.0.1:7000"))
        try notifier.notify(.watchdog)
        try notifier.notify(.stopping, .status("draining"))
        let before = monotonicNanoseconds() / 1_000
        try notifier.notify(.reloading)
        let after = monotonicNanoseconds() / 1_000
        let reload = try #require(fake.waitFor { $0.text.hasPrefix("RELOADING=1") })
        let texts = fake.messages.map(\.text)
        #expect(texts.prefix(3) == ["READY=1\nSTATUS=serving on 127.0.0.1:7000", "WATCHDOG=1", "STOPPING=1\nSTATUS=draining"])
        // MONOTONIC_USEC is CLOCK_MONOTONIC in microseconds, taken when the datagram was sent.
        let stamp = try #require(reload.value(of: "MONOTONIC_USEC").flatMap { UInt64($0) }, "\(reload)")
        #expect(stamp >= before && stamp <= after)
    }

    @Test("an abstract-namespace address (@name) works like a path")
    func abstractNamespace() throws {
        let fake = try FakeNotifySocket(abstract: true)
        #expect(fake.address.hasPrefix("@"))
        let notifier = try ServiceNotifier(environment: ["NOTIFY_SOCKET": fake.address])
        try notifier.notify(.ready)
        #expect(fake.waitFor { $0.text == "READY=1" } != nil)
    }

    @Test("a status line's line breaks become spaces; an oversized one is cut below the manager's 4,096-byte limit")
    func statusText() throws {
        #expect(ServiceNotifier.message(for: [.status("one\ntwo\r\nthree\rfour")], monotonicMicroseconds: 0)
            == "STATUS=one two three four")
        let long = String(repeating: "é", count: 5_000)  // 10,000 bytes
        let message = ServiceNotifier.message(for: [.ready, .status(long)], monotonicMicroseconds: 0)
        #expect(message.utf8.count < 4_096 && message.utf8.count > 4_000)
        #expect(message.hasPrefix("READY=1\nSTATUS=éé") && message.hasSuffix("é…"))
        // And it is still one datagram the socket accepts.
        let fake = try FakeNotifySocket()
        try ServiceNotifier(address: fake.address).notify(.status(long))
        let received = try #require(fake.waitFor { $0.text.hasPrefix("STATUS=") })
        #expect(received.text.utf8.count < 4_096)
    }

    @Test("without NOTIFY_SOCKET the notifier is disabled and every call is a no-op")
    func disabled() throws {
        let notifier = try ServiceNotifier(environment: ["HOME": "/root"])
        #expect(!notifier.isEnabled && notifier.address == nil)
        try notifier.notify(.ready, .status("x"))
        try ServiceNotifier.disabled.notify(.watchdog)
        #expect(!ServiceNotifier.disabled.isEnabled)
    }

    @Test("malformed or oversized NOTIFY_SOCKET values are clear errors naming the variable")
    func badAddresses() throws {
        let longPath = "/tmp/" + String(repeating: "p", count: 103)  // 108 bytes: no room for the NUL
        let longName = "@" + String(repeating: "a", count: 109)
        for value in ["", "relative/notify", "vsock:2:1234", "@", longPath, longName] {
            #expect(throws: ServiceEnvironmentError.self, "\(value)") {
                _ = try ServiceNotifier(environment: ["NOTIFY_SOCKET": value])
            }
            do {
                _ = try ServiceNotifier(address: value)
            } catch {
                guard case .invalidValue(let variable, let shown, let expected) = error else {
                    Issue.record("unexpected \(error)")
                    continue
                }
                #expect(variable == "NOTIFY_SOCKET" && shown == value)
                #expect(expected.contains("absolute path") && expected.contains("@abstract"))
                #expect(error.description.contains("NOTIFY_SOCKET='"))
                #expect(error.description.count < 300, "the value is cut in messages")
            }
        }
        // The longest accepted: a 107-byte path, a 107-byte abstract name.
        _ = try ServiceNotifier(address: String(longPath.dropLast()))
        _ = try ServiceNotifier(address: String(longName.prefix(108)))
    }

    @Test("nobody listening at the address: notify throws a system error naming the socket")
    func nobodyListening() throws {
        // A fresh path in the process's own directory: nothing there.
        let path = uniqueTestPath("nobody.sock")
        let notifier = try ServiceNotifier(address: path)
        #expect {
            try notifier.notify(.ready)
        } throws: { error in
            guard case EventLoopError.system(let function, let code) = error else { return false }
            return function.contains("NOTIFY_SOCKET=\(path)") && code == ENOENT
        }
    }
}

@Suite("Service manager environment")
struct ServiceEnvironmentTests {
    @Test("WATCHDOG_USEC and WATCHDOG_PID: the interval for this process, nil for another, errors for junk")
    func watchdogVariables() throws {
        let me = String(getpid())
        #expect(try Watchdog.requestedInterval(environment: [:]) == nil)
        #expect(try Watchdog.requestedInterval(environment: ["WATCHDOG_USEC": "200000"]) == .milliseconds(200))
        #expect(try Watchdog.requestedInterval(environment: ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": me]) == .seconds(30))
        // Inherited from a parent the watchdog was meant for: not ours.
        #expect(try Watchdog.requestedInterval(environment: ["WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"]) == nil)
        let oversized = String(repeating: "9", count: 10_000)
        for value in ["abc", "0", "-5", "1e6", " 200000", "18446744073709551615", "18446744073709551616", oversized] {
            #expect(throws: ServiceEnvironmentError.invalidValue(
                variable: "WATCHDOG_USEC", value: value,
                expected: "a whole number of microseconds from 1 to 18446744073709551614")) {
                _ = try Watchdog.requestedInterval(environment: ["WATCHDOG_USEC": value])
            }
        }
        let error = ServiceEnvironmentError.invalidValue(variable: "WATCHDOG_USEC", value: oversized, expected: "x")
        #expect(error.description.contains("(10000 bytes)") && error.description.count < 200)
        #expect(throws: ServiceEnvironmentError.self) {
            _ = try Watchdog.requestedInterval(environment: ["WATCHDOG_USEC": "1000", "WATCHDOG_PID": "me"])
        }
    }

    @Test("LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES: sockets for this process only, names, clear errors")
    func listenVariables() throws {
        let me: Int32 = 4242
        func parse(_ environment: [String: String], limit: Int? = 1_024) throws(ServiceEnvironmentError) -> ActivatedSockets {
            try ActivatedSockets.parse(environment, processID: me, descriptorLimit: limit)
        }
        // Nothing passed.
        let none = try parse(["PATH": "/bin"])
        #expect(none.isEmpty && none.ignoredReason == nil)
        // Two sockets with names.
        let two = try parse(["LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "http:line"])
        #expect(two.sockets == [.init(descriptor: 3, index: 0, name: "http"), .init(descriptor: 4, index: 1, name: "line")])
        #expect(two.first(named: "line")?.descriptor == 4 && two.first(named: "nope") == nil)
        #expect(two.sockets[1].description == "descriptor 4 named 'line'")
        // Without names.
        #expect(try parse(["LISTEN_PID": "4242", "LISTEN_FDS": "1"]).sockets == [.init(descriptor: 3, index: 0, name: nil)])
        #expect(try parse(["LISTEN_PID": "4242", "LISTEN_FDS": "0", "LISTEN_FDNAMES": ""]).isEmpty)
        // Meant for another process, or without LISTEN_PID: ignored, with the reason.
        let other = try parse(["LISTEN_PID": "1", "LISTEN_FDS": "1"])
        #expect(other.isEmpty && other.ignoredReason?.contains("LISTEN_PID=1 names another process (this one is 4242)") == true)
        let orphan = try parse(["LISTEN_FDS": "1"])
        #expect(orphan.isEmpty && orphan.ignoredReason?.contains("without LISTEN_PID") == true)
        // LISTEN_FDS=999: parsed (the descriptors are checked when taken from the environment).
        #expect(try parse(["LISTEN_PID": "4242", "LISTEN_FDS": "999"]).sockets.count == 999)
        // Junk.
        let bad: [([String: String], String)] = [
            (["LISTEN_PID": "abc", "LISTEN_FDS": "1"], "LISTEN_PID"),
            (["LISTEN_PID": "-3", "LISTEN_FDS": "1"], "LISTEN_PID"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "many"], "LISTEN_FDS"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "-1"], "LISTEN_FDS"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "1022"], "LISTEN_FDS"),  // over the limit less 3
            (["LISTEN_PID": "4242", "LISTEN_FDS": "99999999999999999999999"], "LISTEN_FDS"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "one"], "LISTEN_FDNAMES"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "a:b"], "LISTEN_FDNAMES"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "bad\tname"], "LISTEN_FDNAMES"),
            (["LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": String(repeating: "n", count: 256)], "LISTEN_FDNAMES"),
        ]
        for (environment, variable) in bad {
            do {
                _ = try parse(environment)
                Issue.record("\(environment) was accepted")
            } catch {
                guard case .invalidValue(let name, _, _) = error else {
                    Issue.record("\(environment): \(error)")
                    continue
                }
                #expect(name == variable, "\(environment): \(error)")
            }
        }
        #expect(try parse(["LISTEN_PID": "4242", "LISTEN_FDS": "1021"]).sockets.count == 1_021)
    }

    @Test("the not-open error names LISTEN_FDS, the range and the missing descriptor")
    func notOpenMessage() {
        #expect(ServiceEnvironmentError.passedDescriptorNotOpen(descriptor: 3, count: 999).description
            == "LISTEN_FDS=999 says descriptors 3…1001 were passed, but descriptor 3 is not open")
        #expect(ServiceEnvironmentError.passedDescriptorNotOpen(descriptor: 3, count: 1).description
            == "LISTEN_FDS=1 says descriptor 3 was passed, but descriptor 3 is not open")
    }

    @Test("JOURNAL_STREAM: only a match of the descriptor's own device and inode counts")
    func journalStream() throws {
        let pipe = TestPipe()
        var st = stat()
        #expect(fstat(pipe.writeEnd, &st) == 0)
        let mine = "\(st.st_dev):\(st.st_ino)"
        #expect(JournalStream.isConnected(pipe.writeEnd, environment: ["JOURNAL_STREAM": mine]))
        #expect(!JournalStream.isConnected(pipe.writeEnd, environment: ["JOURNAL_STREAM": "\(st.st_dev):\(st.st_ino + 1)"]))
        for junk in ["", "garbage", "\(st.st_dev)", "\(st.st_dev):\(st.st_ino):1", "-1:-1"] {
            #expect(!JournalStream.isConnected(pipe.writeEnd, environment: ["JOURNAL_STREAM": junk]))
        }
        #expect(!JournalStream.isConnected(pipe.writeEnd, environment: [:]))
        #expect(!JournalStream.isConnected(-1, environment: ["JOURNAL_STREAM": mine]))
    }
}

@Suite("Watchdog", .serialized)
struct WatchdogTests {
    @Test("pings every half interval while the loops poll, none while one is wedged for 1 s, then pings again")
    func wedgedLoop() async throws {
        let fake = try FakeNotifySocket()
        let group = try EventLoopGroup(loopCount: 2)
        defer { group.shutdownBlocking(gracePeriod: .seconds(5)) }
        let changes = Locked<[Watchdog.Health]>([])
        let watchdog = Watchdog(watching: group.loops, notifier: try ServiceNotifier(address: fake.address),
                                interval: .milliseconds(200)) { health in changes.withLock { $0.append(health) } }
        defer { watchdog.stop() }
        #expect(watchdog.pingInterval == .milliseconds(100) && watchdog.stallThreshold == .milliseconds(100))
        func pings(after: Int = 0) -> [FakeNotifySocket.Message] {
            fake.messages.dropFirst(after).filter { $0.text == "WATCHDOG=1" }
        }
        // Healthy: ten pings, about 100 ms apart.
        _ = await fake.waitFor(timeout: .seconds(30)) { _ in pings().count >= 10 }
        let healthy = pings()
        try #require(healthy.count >= 10, "\(fake.messages)")
        let gaps = zip(healthy.dropFirst(), healthy).map { Double($0.arrival - $1.arrival) / 1e6 }.sorted()
        let median = gaps[gaps.count / 2]
        #expect(median > 60 && median < 200, "median gap \(median) ms: \(gaps)")

        // Wedge loop 1 for a second (a blocking call in a callback).
        let stamps = Locked<(start: UInt64, end: UInt64)?>(nil)
        group.loops[1].execute {
            let start = monotonicNanoseconds()
            usleep(1_000_000)
            stamps.withLock { $0 = (start, monotonicNanoseconds()) }
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while stamps.value == nil && ContinuousClock.now < deadline { usleep(10_000) }
        let wedge = try #require(stamps.value)
        // And then a few more pings.
        let afterWedge = await fake.waitFor(timeout: .seconds(30)) { message in
            message.text == "WATCHDOG=1" && message.arrival > wedge.end
        }
        #expect(afterWedge != nil, "no ping after the loop recovered: \(fake.messages.suffix(5))")
        // Pings may still arrive for the threshold (100 ms) after the wedge starts, and for a
        // scheduling delay after that (generous: a loaded machine); none for the rest of the
        // second. The watchdog's own count of withheld pings does not depend on delays.
        let quietFrom = wedge.start + 500_000_000
        let during = pings().filter { $0.arrival > quietFrom && $0.arrival < wedge.end }
        #expect(during.isEmpty, "pings while loop 1 was wedged: \(during); wedge \(wedge)")
        #expect(watchdog.counters.pingsWithheld >= 3, "\(watchdog.counters)")
        let seen = changes.value
        #expect(seen.count == 2, "\(seen)")
        if case .unresponsive(let index, let activity)? = seen.first {
            #expect(index == 1)
            if case .dispatching(let stuck) = activity { #expect(stuck > .milliseconds(100)) } else { Issue.record("\(activity)") }
        } else {
            Issue.record("first change: \(seen)")
        }
        #expect(seen.last == .healthy)
        #expect(watchdog.health == .healthy)

        // After stop() returns, no more pings.
        watchdog.stop()
        #expect(!watchdog.isRunning)
        let count = pings().count
        usleep(350_000)
        #expect(pings().count == count)
    }

    @Test("a loop that is not running counts as stuck once its start grace (one interval) is over: no more pings")
    func loopNotRunning() async throws {
        let fake = try FakeNotifySocket()
        let idle = try EventLoop()  // never runs
        let watchdog = Watchdog(watching: [idle], notifier: try ServiceNotifier(address: fake.address),
                                interval: .milliseconds(40))
        defer { watchdog.stop() }
        let deadline = ContinuousClock.now + .seconds(30)
        while watchdog.counters.pingsWithheld < 2 && ContinuousClock.now < deadline { usleep(5_000) }
        let sent = watchdog.counters.pingsSent
        while watchdog.counters.pingsWithheld < 6 && ContinuousClock.now < deadline { usleep(5_000) }
        #expect(watchdog.counters.pingsWithheld >= 6)
        // A grace of one interval (two checks at most), then nothing.
        #expect(sent <= 3 && watchdog.counters.pingsSent == sent, "\(watchdog.counters)")
        #expect(watchdog.health == .unresponsive(loopIndex: 0, activity: .notRunning))
        #expect(watchdog.health.description == "loop 0 is stuck: not running")
    }

    @Test("a loop that starts within the first interval (a group's threads still starting) is not reported stuck")
    func loopStartingLate() async throws {
        // A 6 s interval: the loop's grace to start, and pings every 3 s. The loop is started
        // only once the first ping is in (the first check comes at once, and let the loop off
        // for not running yet); a thread starting and running a loop fits in the rest of the
        // grace on a loaded machine — nearly always: a run that got the loop going only after
        // the grace (a suite at full load beside it took 7.6 s once) proves nothing either way,
        // and is tried again.
        try await inSomeAttempt(3) { () async throws -> String? in
            let fake = try FakeNotifySocket()
            let late = try EventLoop()
            let changes = Locked<[Watchdog.Health]>([])
            let interval = Duration.seconds(6)
            let created = ContinuousClock.now
            let watchdog = Watchdog(watching: [late], notifier: try ServiceNotifier(address: fake.address),
                                    interval: interval) { health in changes.withLock { $0.append(health) } }
            defer { watchdog.stop() }
            let pings = { fake.messages.filter { $0.text == "WATCHDOG=1" }.count }
            try #require(await fake.waitFor { $0.text == "WATCHDOG=1" } != nil, "no first ping: \(watchdog.counters)")
            #expect(late.activity == .notRunning, "checked before the loop ran")
            let running = Thread { try? late.run() }
            running.start()
            defer { late.stop() }
            let started = await eventually(timeout: .seconds(30)) { late.activity != .notRunning }
            let startedAfter = ContinuousClock.now - created
            try #require(started, "the loop never ran")
            if startedAfter >= interval - .milliseconds(500) {
                return "the loop ran \(startedAfter) after the watchdog started, past its grace"
            }
            // Two more checks at least, the last one past the start grace (checks at 0, 3, 6, 9 s).
            #expect(await fake.waitFor(timeout: .seconds(60)) { _ in pings() >= 4 } != nil, "\(watchdog.counters)")
            #expect(changes.value.isEmpty, "\(changes.value); the loop ran \(startedAfter) after the watchdog started")
            #expect(watchdog.counters.pingsWithheld == 0 && watchdog.health == .healthy)
            return nil
        }
    }

    @Test("a ping that cannot be sent is counted with its error; the watchdog keeps going")
    func failedPings() async throws {
        let notifier = try ServiceNotifier(address: uniqueTestPath("gone.sock"))  // never made
        let watchdog = Watchdog(watching: [], notifier: notifier, interval: .milliseconds(20))
        defer { watchdog.stop() }
        let deadline = ContinuousClock.now + .seconds(30)
        while watchdog.counters.pingsFailed < 3 && ContinuousClock.now < deadline { usleep(5_000) }
        let counters = watchdog.counters
        #expect(counters.pingsFailed >= 3 && counters.pingsSent == 0)
        if case .system(let function, _)? = counters.lastFailure {
            #expect(function.contains("NOTIFY_SOCKET"))
        } else {
            Issue.record("\(counters)")
        }
    }

    @Test("startIfRequested: only with WATCHDOG_USEC for this process and an enabled notifier")
    func startIfRequested() throws {
        let fake = try FakeNotifySocket()
        let notifier = try ServiceNotifier(address: fake.address)
        #expect(try Watchdog.startIfRequested(watching: [], notifier: notifier, environment: [:]) == nil)
        #expect(try Watchdog.startIfRequested(watching: [], notifier: .disabled, environment: ["WATCHDOG_USEC": "1000000"]) == nil)
        let started = try #require(try Watchdog.startIfRequested(watching: [], notifier: notifier,
                                                                 environment: ["WATCHDOG_USEC": "1000000"]))
        #expect(started.interval == .seconds(1) && started.pingInterval == .milliseconds(500))
        #expect(fake.waitFor { $0.text == "WATCHDOG=1" } != nil)
        started.stop()
        #expect(throws: ServiceEnvironmentError.self) {
            _ = try Watchdog.startIfRequested(watching: [], notifier: notifier, environment: ["WATCHDOG_USEC": "abc"])
        }
    }
}
