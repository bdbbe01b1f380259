import Testing
import Mainspring
import MainspringTestSupport
@testable import MainspringCore

@Suite("LatencyHistogram")
struct HistogramTests {
    @Test("percentiles are within 1% of the exact order statistic of a sorted array")
    func accuracy() {
        var generator = SystemRandomNumberGenerator()
        var histogram = LatencyHistogram()
        var values: [UInt64] = []
        for _ in 0..<100_000 {
            // Log-uniform from 10 ns to 10 s.
            let exponent = Double.random(in: 1...10, using: &generator)
            let value = UInt64(pow10(exponent))
            values.append(value)
            histogram.record(.nanoseconds(Int64(value)))
        }
        values.sort()
        #expect(histogram.count == values.count)
        for p in [0.01, 0.1, 0.5, 0.9, 0.99, 0.999] {
            let exact = Double(values[max(0, Int((p * Double(values.count)).rounded(.up)) - 1)])
            let got = Double(histogram.percentile(p).components.attoseconds) / 1e9
                + Double(histogram.percentile(p).components.seconds) * 1e9
            #expect(abs(got - exact) / exact <= 0.01, "p\(p): \(got) vs \(exact)")
        }
        #expect(histogram.max == .nanoseconds(Int64(values.last!)))
        #expect(histogram.min == .nanoseconds(Int64(values.first!)))
        #expect(histogram.percentile(1) == histogram.max)
    }

    @Test("merging two histograms equals recording everything in one")
    func merge() {
        var a = LatencyHistogram(), b = LatencyHistogram(), all = LatencyHistogram()
        for i in 1...1_000 {
            let d = Duration.microseconds(i * 7)
            if i % 3 == 0 { a.record(d) } else { b.record(d) }
            all.record(d)
        }
        a.merge(b)
        #expect(a == all)
        #expect(a.mean == all.mean)
    }

    @Test("empty histograms and negative durations")
    func edges() {
        var h = LatencyHistogram()
        #expect(h.percentile(0.5) == .zero)
        #expect(h.max == .zero)
        h.record(.milliseconds(-3))
        #expect(h.count == 1)
        #expect(h.max == .zero)
    }
}

private func pow10(_ x: Double) -> Double {
    var result = 1.0
    var remaining = x
    while remaining >= 1 { result *= 10; remaining -= 1 }
    return result * exp(remaining * 2.302585092994046)
}

#if canImport(Glibc)
import Glibc
#endif
