import Mainspring
import MainspringTesting
import Synchronization
import Testing

/// A value the tests' callbacks write on the simulation's driving thread and the test reads
/// between steps.
final class Box<Value: Sendable>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}

/// The simulation itself: virtual time, deadline order, `run`, deadlock, seeds, traces. None of
/// these tests waits for real time.
@Suite struct SimulationTests {
    @Test func timersFireInDeadlineOrderEachAtItsOwnInstant() throws {
        let simulation = try Simulation(seed: 1)
        let fired = Box<[String]>([])
        simulation.loop.schedule(after: .seconds(3)) { fired.value.append("c@\(simulation.now)") }
        simulation.loop.schedule(after: .seconds(1)) { fired.value.append("a@\(simulation.now)") }
        simulation.loop.schedule(after: .seconds(2)) { fired.value.append("b@\(simulation.now)") }
        simulation.loop.schedule(after: .seconds(2)) { fired.value.append("b2@\(simulation.now)") }

        simulation.advance(by: .milliseconds(999))
        #expect(fired.value.isEmpty)
        #expect(simulation.now == .milliseconds(999))
        simulation.advance(by: .seconds(10))
        #expect(fired.value == ["a@1.0 seconds", "b@2.0 seconds", "b2@2.0 seconds", "c@3.0 seconds"])
        #expect(simulation.now == .milliseconds(10_999))
    }

    @Test func runUntilIdleRunsWhatIsRunnableWithoutMovingTime() throws {
        let simulation = try Simulation()
        let ran = Box(0)
        simulation.loop.execute { ran.value += 1 }
        simulation.loop.schedule(after: .nanoseconds(1)) { ran.value += 10 }
        simulation.runUntilIdle()
        #expect(ran.value == 1)
        #expect(simulation.now == .zero)
        simulation.advance(by: .nanoseconds(1))
        #expect(ran.value == 11)
    }

    @Test func aNegativeAdvanceCountsAsZero() throws {
        let simulation = try Simulation()
        simulation.advance(by: .seconds(-5))
        #expect(simulation.now == .zero)
    }

    @Test func repeatingTimersStayOnTheirGridAndSkipTicksMissedUnderModelledCPU() throws {
        let simulation = try Simulation()
        let ticks = Box<[Duration]>([])
        simulation.loop.schedule(every: .milliseconds(10)) { _ in
            ticks.value.append(simulation.now)
            if ticks.value.count == 2 { simulation.consume(.milliseconds(25)) }
        }
        simulation.advance(by: .milliseconds(75))
        // 10, 20 (which computes until 45: the ticks at 30 and 40 are missed, not burst), 50,
        // 60, 70.
        #expect(ticks.value == [.milliseconds(10), .milliseconds(20), .milliseconds(50), .milliseconds(60),
                                .milliseconds(70)])
    }

    @Test func runJumpsToDeadlinesSoAnHourTakesNoRealTime() async throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        let start = ContinuousClock.now
        let slept = try await simulation.run { () async throws -> Duration in
            try await loop.sleep(for: .seconds(3600))
            try await loop.clock.sleep(for: .milliseconds(5))
            return simulation.now
        }
        #expect(slept == .seconds(3600) + .milliseconds(5))
        #expect(simulation.now == slept)
        // Not a timing bound on the code: a real hour would be 3,600 s.
        #expect(ContinuousClock.now - start < .seconds(60))
    }

    @Test func runRethrowsTheBodysError() async throws {
        struct Expected: Error, Equatable {}
        let simulation = try Simulation()
        let loop = simulation.loop
        await #expect(throws: Expected.self) {
            try await simulation.run {
                try await loop.sleep(for: .seconds(1))
                throw Expected()
            }
        }
        #expect(simulation.now == .seconds(1))
    }

    @Test func aBodyThatCanNeverResumeIsADeadlockNamingWhatWaits() async throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        let error = await #expect(throws: SimulationError.self) {
            try await simulation.run {
                try await loop.sleep(for: .seconds(2))
                await withUnsafeContinuation { (_: UnsafeContinuation<Void, Never>) in }
            }
        }
        let text = error.map(String.init(describing:)) ?? ""
        #expect(text.contains("deadlock"))
        #expect(text.contains("the body of run"))
        #expect(error == .deadlock(at: .seconds(2), waiting: "the body of run (a suspended task); no open sources"))
    }

    @Test func itsDescriptionNamesTheSeedToReplay() throws {
        let simulation = try Simulation(seed: 42)
        simulation.advance(by: .milliseconds(1_500))
        #expect(simulation.description == "Simulation(seed: 42) at 1.5 seconds")
    }

    @Test func loopClockIsVirtual() throws {
        let simulation = try Simulation()
        let start = simulation.loop.clock.now
        simulation.advance(by: .milliseconds(1_500))
        #expect(start.duration(to: simulation.loop.clock.now) == .milliseconds(1_500))
    }

    @Test func spinTimesOutOnVirtualTime() throws {
        let simulation = try Simulation()
        let result = Box<(Bool, Duration)?>(nil)
        simulation.loop.execute {
            let met = simulation.loop.spin(until: { false }, timeout: .seconds(30))
            result.value = (met, simulation.now)
        }
        simulation.runUntilIdle()
        #expect(result.value?.0 == false)
        #expect(result.value?.1 == .seconds(30))
    }

    @Test func spinRunsTimersDueWhileItWaits() throws {
        let simulation = try Simulation()
        let result = Box<(Bool, Duration)?>(nil)
        simulation.loop.execute {
            var done = false
            simulation.loop.schedule(after: .milliseconds(250)) { done = true }
            let met = simulation.loop.spin(until: { done }, timeout: .seconds(30))
            result.value = (met, simulation.now)
        }
        simulation.runUntilIdle()
        #expect(result.value?.0 == true)
        #expect(result.value?.1 == .milliseconds(250))
    }

    /// What is real — a descriptor the caller has, for a listener or a connection — is refused
    /// on a simulated loop, by name; TCP and Unix listeners and connections go over the
    /// simulation's network (NetworkSimulationTests).
    @Test func realDescriptorsAreRefused() throws {
        let simulation = try Simulation()
        let loop = simulation.loop
        let thrown = Box<EventLoopError?>(nil)
        loop.execute {
            do throws(EventLoopError) {
                _ = try Listener(.adopted(descriptor: 0), on: loop) { _ in }
            } catch {
                thrown.value = error
            }
        }
        simulation.runUntilIdle()
        guard case .simulatedLoop(let refused)? = thrown.value else {
            Issue.record("expected simulatedLoop, got \(String(describing: thrown.value))")
            return
        }
        #expect(refused.contains("a listener adopting descriptor 0"))
        let adopted = Box<EventLoopError?>(nil)
        loop.execute {
            do throws(EventLoopError) {
                _ = try Connection.adopting(descriptor: 0, on: loop)
            } catch {
                adopted.value = error
            }
        }
        simulation.runUntilIdle()
        guard case .simulatedLoop(let what)? = adopted.value else {
            Issue.record("expected simulatedLoop, got \(String(describing: adopted.value))")
            return
        }
        #expect(what.contains("Connection.adopting"))
    }

    @Test func theSameSeedGivesTheSameTraceAndSeedsChooseTheOrder() throws {
        func traceOfGroupProgram(seed: UInt64) throws -> [SimulationTrace.Entry] {
            let simulation = try Simulation(seed: seed)
            let group = try simulation.makeGroup(loopCount: 3)
            for loop in group.loops {
                for _ in 0..<4 { loop.execute {} }
            }
            simulation.loop.schedule(after: .milliseconds(5)) {}
            simulation.advance(by: .milliseconds(10))
            return simulation.trace
        }
        let first = try traceOfGroupProgram(seed: 7)
        #expect(first == (try traceOfGroupProgram(seed: 7)))
        #expect(first.count == 13)
        #expect(first.last == SimulationTrace.Entry(instant: .milliseconds(5), loop: 0, kind: "source", label: "TimerSource"))
        // Which loop runs first is the seed's choice: some seed of a few orders them otherwise.
        let orders = try Set((0..<8 as Range<UInt64>).map { try traceOfGroupProgram(seed: $0).map(\.loop) })
        #expect(orders.count > 1)
    }

    @Test func tasksPreferringAGroupLoopRunOnIt() async throws {
        let simulation = try Simulation(seed: 3)
        let group = try simulation.makeGroup(loopCount: 2)
        let second = group.loops[1]
        let result = try await simulation.run { () async throws -> Bool in
            try await Task(executorPreference: second) { () async throws -> Bool in
                try await second.sleep(for: .milliseconds(20))
                return second.isCurrent
            }.value
        }
        #expect(result)
        #expect(simulation.now == .milliseconds(20))
        #expect(simulation.trace.contains { $0.loop == 2 && $0.kind == "task" })
    }
}

/// A simulated group's graceful shutdown keeps its deadline on virtual time.
@Suite struct SimulatedGroupTests {
    @Test func shutdownRunsInFlightTimersWithinTheGracePeriodAndClosesTheRest() async throws {
        let simulation = try Simulation(seed: 5)
        let group = try simulation.makeGroup(loopCount: 2)
        let fired = Box<[Duration]>([])
        for (index, loop) in group.loops.enumerated() {
            loop.execute {
                loop.schedule(after: .seconds(index + 1)) { fired.value.append(simulation.now) }
                loop.schedule(after: .seconds(60)) { fired.value.append(.seconds(-1)) }  // past the grace
            }
        }
        simulation.runUntilIdle()
        let report = await group.shutdown(gracePeriod: .seconds(10))
        // Each loop waited for its in-flight timers until the 10 s deadline, then closed what was
        // left: the timer due in 60 s on each (one source per loop).
        #expect(fired.value.count == 2)
        #expect(fired.value.allSatisfy { $0 >= .seconds(1) && $0 <= .seconds(10) }, "\(fired.value)")
        #expect(report.closedSources == 2)
        #expect(report.timedOut)
        #expect(report.stuckLoops == 0)
        #expect(simulation.now == .seconds(10))
        simulation.advance(by: .seconds(60))
        #expect(!fired.value.contains(.seconds(-1)))
    }
}
