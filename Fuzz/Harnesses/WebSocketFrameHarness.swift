@_spi(Fuzzing) import MainspringHTTP

extension FuzzHarness {
    /// The WebSocket frame decoder (RFC 6455), as a server reads a client and as a client reads
    /// a server: it must not crash or allocate past its limit on any input, its outcome —
    /// events, the close code of a violation, what is left undecoded — must not depend on how
    /// the bytes arrive (whole, a byte at a time, in pseudo-random pieces), a violation's code
    /// must be one of 1002, 1007, 1009, and a binary frame made of the input decodes back whole.
    public static func webSocketFrames(_ input: [UInt8]) {
        let sizes = pieceSizes(seed: UInt32(truncatingIfNeeded: input.count), mixing: input.prefix(16), largest: 13)
        for asServer in [true, false] {
            let whole = WebSocketFrameCheck.decode(input, pieces: [input.count], asServer: asServer)
            precondition(WebSocketFrameCheck.decode(input, pieces: [1], asServer: asServer) == whole,
                         "byte-by-byte feeding changed the outcome")
            let cut = WebSocketFrameCheck.decode(input, pieces: sizes, asServer: asServer)
            precondition(cut == whole, "chunking changed the outcome: \(cut) vs \(whole)")
            if let code = whole.violation { precondition([1002, 1007, 1009].contains(code), "close code \(code)") }
        }
        let payload = Array(input.prefix(4096))
        let key = input.count >= 4 ? UInt32(input[0]) << 24 | UInt32(input[1]) << 16 | UInt32(input[2]) << 8 | UInt32(input[3]) : 7
        for (asServer, maskingKey) in [(true, Optional(key)), (false, nil)] {
            guard let frame = WebSocketFrameCheck.encode(opcode: 2, payload: payload, maskingKey: maskingKey) else { continue }
            let back = WebSocketFrameCheck.decode(frame, pieces: sizes, asServer: asServer)
            precondition(back == .init(events: ["binary \(payload.count)"], violation: nil, leftover: 0), "round trip: \(back)")
        }
    }
}
