extension FuzzHarness {
    /// 32 piece sizes in `1...largest`, pseudo-random (xorshift32) from `seed` with `bytes`
    /// mixed in first: how the harnesses cut an input to check that an outcome does not depend
    /// on how the bytes arrive. The same arguments always give the same sizes, so a corpus
    /// file replays exactly.
    static func pieceSizes(seed: UInt32, mixing bytes: ArraySlice<UInt8> = [], largest: UInt32) -> [Int] {
        var state = seed &* 2_654_435_761 | 1
        for byte in bytes { state = (state ^ UInt32(byte)) &* 16_777_619 | 1 }
        var sizes: [Int] = []
        for _ in 0..<32 {
            state ^= state << 13
            state ^= state >> 17
            state ^= state << 5
            sizes.append(Int(state % largest) + 1)
        }
        return sizes
    }
}
