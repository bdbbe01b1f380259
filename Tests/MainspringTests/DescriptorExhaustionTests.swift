import Foundation
import Testing
import Mainspring
import MainspringTestSupport

/// Out of file descriptors (`EMFILE`), nothing traps: everything that needs a new descriptor
/// fails with an error that says so, and what is open keeps working. Run in a child process
/// (`mainspring-fixture descriptor-exhaustion`), which lowers its own `RLIMIT_NOFILE` and fills
/// it up, so that the test process's other tests keep their descriptors.
@Suite("Out of descriptors: errors, not traps; a running loop keeps serving")
struct DescriptorExhaustionTests {
    @Test("making a loop, a thread's loop, a listener, a connection, a UDP socket, a child, a watch: each an EMFILE error")
    func everythingNewIsAnError() async throws {
        let result = try await runFixture("descriptor-exhaustion")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["exhausted"] == "true", "\(result.summary)")
        let emfile = "Too many open files (errno \(EMFILE))"
        for key in ["new-loop", "thread-loop", "listener", "connection", "datagram", "spawn", "file-watch"] {
            let outcome = result[key] ?? "missing"
            #expect(outcome.contains(emfile), "\(key): \(outcome)")
        }
        // A loop needs four descriptors: the error says how many, not just that one failed.
        #expect(result["new-loop"]?.hasPrefix("event_base_new (needs 4 descriptors) failed") == true, "\(result.summary)")
        // A spinning operation whose worker thread cannot make its loop is cancelled, not run.
        #expect(result["spinning-operation"]?.hasPrefix("cancelled=true ") == true, "\(result.summary)")
        #expect(result["spinning-operation"]?.contains(emfile) == true, "\(result.summary)")
    }

    @Test("while out of descriptors the loop serves its connection, fires new timers, ends a spin at its timeout; then accepts the client that waited")
    func runningLoopKeepsServing() async throws {
        let result = try await runFixture("descriptor-exhaustion")
        #expect(result.status == 0, "\(result.summary)")
        #expect(result["echo-during"] == "echo during", "\(result.summary)")
        #expect(result["timer"] == "true", "\(result.summary)")
        #expect(result["group-timer"] == "true", "a loop's first timer, armed while out of descriptors: \(result.summary)")
        #expect(result["spin-timeout"] == "false", "\(result.summary)")
        #expect(result["late-echo"] == "echo late", "the listener paused on EMFILE and accepted once descriptors were free: \(result.summary)")
        #expect(result["new-loop-after"] == "made" && result["thread-loop-after"] == "made", "\(result.summary)")
    }
}
