import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

/// The connection's lifecycle on its own: the transitions and what each asks the connection to
/// do, with no socket and no loop.
@Suite("Connection state machine (no sockets)")
struct ConnectionStateTests {
    @Test("an outgoing connect: writes accepted while connecting, reading waits for a reader, connected once")
    func connecting() {
        var state = ConnectionState(connected: false)
        #expect(state.phase == .connecting && state.isOpen && !state.isConnected)
        let v1 = state.readChange()
        #expect(v1 == nil, "nobody reads yet")
        let v2 = state.startReading()
        #expect(v2)
        let v3 = state.readChange()
        #expect(v3 == .enable)
        let v4 = state.readChange()
        #expect(v4 == nil, "no change twice")
        let v5 = state.connected()
        #expect(v5)
        let v6 = state.connected()
        #expect(!v6, "connected is news once")
        #expect(state.phase == .open && state.isConnected)
    }

    @Test("output over the limit pauses reading until it drains to half; then the flow resumes")
    func outputBackpressure() {
        var state = ConnectionState(connected: true)
        _ = state.startReading()
        let v7 = state.readChange()
        #expect(v7 == .enable)
        let v8 = state.outputGrew(to: 100, limit: 100)
        #expect(!v8, "at the limit is not over it")
        let v9 = state.outputGrew(to: 101, limit: 100)
        #expect(v9)
        let v10 = state.outputGrew(to: 500, limit: 100)
        #expect(!v10, "paused once")
        #expect(!state.mayDeliver)
        let v11 = state.readChange()
        #expect(v11 == .disable)
        let v12 = state.outputDrained(to: 51, limit: 100)
        #expect(v12.isEmpty, "not yet at half")
        let v13 = state.outputDrained(to: 50, limit: 100)
        #expect(v13 == .resumeFlow)
        #expect(state.mayDeliver)
        let v14 = state.readChange()
        #expect(v14 == .enable)
    }

    @Test("a full input buffer stops reading until a reader takes some, independently of the output")
    func inputFull() {
        var state = ConnectionState(connected: true)
        _ = state.startReading()
        _ = state.readChange()
        state.inputFilled()
        let v15 = state.readChange()
        #expect(v15 == .disable)
        _ = state.outputGrew(to: 10, limit: 5)
        let v16 = state.inputDrained()
        #expect(v16)
        let v17 = state.readChange()
        #expect(v17 == nil, "the output still holds reading back")
        _ = state.outputDrained(to: 0, limit: 5)
        let v18 = state.readChange()
        #expect(v18 == .enable)
        let v19 = state.inputDrained()
        #expect(!v19, "was not full")
    }

    @Test("close with output pending flushes first; with none it finishes at once; a second close does nothing")
    func closing() {
        var flushing = ConnectionState(connected: true)
        _ = flushing.startReading()
        _ = flushing.readChange()
        let v20 = flushing.closeRequested(outputLength: 10)
        #expect(v20 == .flush)
        #expect(flushing.phase == .closing && !flushing.isOpen && !flushing.mayDeliver)
        let v21 = flushing.readChange()
        #expect(v21 == .disable, "nothing more is read once closing")
        let v22 = flushing.closeRequested(outputLength: 10)
        #expect(v22 == nil)
        let v23 = flushing.outputDrained(to: 3, limit: 100)
        #expect(v23.isEmpty)
        let v24 = flushing.outputDrained(to: 0, limit: 100)
        #expect(v24 == .finishClosing)
        #expect(flushing.timeoutReason == .closed, "a close that times out is still .closed")
        let v25 = flushing.finish(.closed)
        #expect(v25)
        #expect(flushing.closeReason == .closed)

        var idle = ConnectionState(connected: true)
        let v26 = idle.closeRequested(outputLength: 0)
        #expect(v26 == .finish)
    }

    @Test("the first reason stands; nothing starts after the end; an idle timeout is .idleTimeout")
    func finishing() {
        var state = ConnectionState(connected: true)
        #expect(state.timeoutReason == .idleTimeout)
        let v27 = state.finish(.error(104))
        #expect(v27)
        let v28 = state.finish(.closed)
        #expect(!v28)
        #expect(state.closeReason == .error(104))
        let v29 = state.startReading()
        #expect(!v29)
        let v30 = state.closeRequested(outputLength: 0)
        #expect(v30 == nil)
        let v31 = state.shutdownOutputRequested(outputLength: 0)
        #expect(!v31)
        let v32 = state.outputDrained(to: 0, limit: 10)
        #expect(v32.isEmpty)
        let v33 = state.peerDidEnd()
        #expect(!v33, "the end of a closed connection is not delivered")
    }

    @Test("a half-close waits for the output to drain, once")
    func halfClose() {
        var state = ConnectionState(connected: true)
        let v34 = state.shutdownOutputRequested(outputLength: 10)
        #expect(!v34)
        #expect(state.outputShutdown == .requested)
        let v35 = state.shutdownOutputRequested(outputLength: 0)
        #expect(!v35, "requested once")
        let v36 = state.outputDrained(to: 0, limit: 100)
        #expect(v36 == .shutdownWrite)
        #expect(state.outputShutdown == .done)
        let v37 = state.outputDrained(to: 0, limit: 100)
        #expect(v37.isEmpty)
        var empty = ConnectionState(connected: true)
        let v38 = empty.shutdownOutputRequested(outputLength: 0)
        #expect(v38, "nothing buffered: shut now")
    }

    @Test("the peer's end while closing is not delivered; while open it is, and recorded once delivered")
    func peerEnd() {
        var open = ConnectionState(connected: true)
        let v39 = open.peerDidEnd()
        #expect(v39)
        #expect(open.peerEnded && !open.isEndDelivered)
        open.endDelivered()
        #expect(open.isEndDelivered)
        var closing = ConnectionState(connected: true)
        _ = closing.closeRequested(outputLength: 1)
        let v40 = closing.peerDidEnd()
        #expect(!v40)
    }

    @Test("CloseReason is no bigger than a String and a tag: every async read's frame holds one, and an idle connection's task holds those frames")
    func closeReasonStaysSmall() {
        let size = MemoryLayout<Connection.CloseReason>.size
        #expect(size <= MemoryLayout<String>.size + 1,
                "CloseReason is \(size) bytes (EventLoopError: \(MemoryLayout<EventLoopError>.size)); box its large payloads")
    }
}
