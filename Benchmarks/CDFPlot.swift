import Foundation
import Mainspring

/// A hand-written SVG plot of latency CDFs: one line per series, latency on a log-scale x axis
/// (ms), the cumulative fraction on the y axis. No dependencies.
func cdfPlot(title: String, series: [(String, LatencyHistogram)]) -> String {
    let width = 820.0, height = 460.0
    let left = 70.0, right = 230.0, top = 50.0, bottom = 60.0
    let plotWidth = width - left - right, plotHeight = height - top - bottom
    let colors = ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]

    // The x range: whole decades around every series' min and max (in ms).
    let values = series.filter { $0.1.count > 0 }
    let low = values.map { max($0.1.percentile(0.001).inMilliseconds, 1e-3) }.min() ?? 1e-3
    let high = values.map { max($0.1.max.inMilliseconds, 1e-3) }.max() ?? 1
    let lowDecade = floor(log10(low)), highDecade = max(ceil(log10(high)), lowDecade + 1)
    func x(_ ms: Double) -> Double {
        let clamped = min(max(ms, pow(10, lowDecade)), pow(10, highDecade))
        return left + (log10(clamped) - lowDecade) / (highDecade - lowDecade) * plotWidth
    }
    func y(_ fraction: Double) -> Double { top + (1 - fraction) * plotHeight }
    func f(_ v: Double) -> String { String(format: "%.1f", v) }

    var svg = """
    <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(width))" height="\(Int(height))" \
    viewBox="0 0 \(Int(width)) \(Int(height))" font-family="Helvetica, Arial, sans-serif" font-size="12">
    <rect width="100%" height="100%" fill="white"/>
    <text x="\(f(width / 2))" y="24" text-anchor="middle" font-size="14">\(escape(title))</text>

    """
    // Grid and axes.
    var decade = lowDecade
    while decade <= highDecade {
        for multiple in [1.0, 2.0, 5.0] {
            let ms = multiple * pow(10, decade)
            guard ms <= pow(10, highDecade) * 1.0001 else { continue }
            let gx = x(ms)
            let major = multiple == 1
            svg += "<line x1=\"\(f(gx))\" y1=\"\(f(top))\" x2=\"\(f(gx))\" y2=\"\(f(top + plotHeight))\" "
                + "stroke=\"\(major ? "#bbb" : "#e5e5e5")\" stroke-width=\"1\"/>\n"
            // Label every line when there is room (three decades or fewer), else the decades.
            if major || highDecade - lowDecade <= 3 {
                svg += "<text x=\"\(f(gx))\" y=\"\(f(top + plotHeight + 18))\" text-anchor=\"middle\" fill=\"#444\">"
                    + "\(label(ms))</text>\n"
            }
        }
        decade += 1
    }
    for step in 0...10 {
        let fraction = Double(step) / 10
        svg += "<line x1=\"\(f(left))\" y1=\"\(f(y(fraction)))\" x2=\"\(f(left + plotWidth))\" y2=\"\(f(y(fraction)))\" "
            + "stroke=\"\(step % 5 == 0 ? "#bbb" : "#e5e5e5")\" stroke-width=\"1\"/>\n"
        svg += "<text x=\"\(f(left - 8))\" y=\"\(f(y(fraction) + 4))\" text-anchor=\"end\" fill=\"#444\">"
            + String(format: "%.1f", fraction) + "</text>\n"
    }
    svg += "<rect x=\"\(f(left))\" y=\"\(f(top))\" width=\"\(f(plotWidth))\" height=\"\(f(plotHeight))\" fill=\"none\" stroke=\"#333\"/>\n"
    svg += "<text x=\"\(f(left + plotWidth / 2))\" y=\"\(f(height - 18))\" text-anchor=\"middle\">"
        + "input latency, write to handler start (ms, log scale)</text>\n"
    svg += "<text transform=\"translate(18 \(f(top + plotHeight / 2))) rotate(-90)\" text-anchor=\"middle\">"
        + "fraction of events ≤ latency</text>\n"

    // One polyline per series: the CDF at 400 evenly spaced fractions, plus min and max.
    for (index, (name, histogram)) in series.enumerated() where histogram.count > 0 {
        let color = colors[index % colors.count]
        var points = [(histogram.min.inMilliseconds, 0.0)]
        for step in 1...400 {
            let p = Double(step) / 400
            points.append((histogram.percentile(p).inMilliseconds, p))
        }
        // Steps: the curve rises at each latency, so draw horizontal-then-vertical segments.
        var path = "M\(f(x(points[0].0))),\(f(y(0)))"
        for (ms, p) in points.dropFirst() {
            path += " H\(f(x(ms))) V\(f(y(p)))"
        }
        svg += "<path d=\"\(path)\" fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"/>\n"
        let ly = top + 14 + Double(index) * 44
        let lx = left + plotWidth + 16
        svg += "<line x1=\"\(f(lx))\" y1=\"\(f(ly))\" x2=\"\(f(lx + 24))\" y2=\"\(f(ly))\" stroke=\"\(color)\" stroke-width=\"3\"/>\n"
        svg += "<text x=\"\(f(lx + 30))\" y=\"\(f(ly + 4))\">\(escape(name))</text>\n"
        let summary = String(format: "p99 %.2f ms, max %.2f ms", histogram.percentile(0.99).inMilliseconds,
                             histogram.max.inMilliseconds)
        svg += "<text x=\"\(f(lx + 30))\" y=\"\(f(ly + 20))\" font-size=\"10\" fill=\"#555\">\(summary)</text>\n"
    }
    svg += "</svg>\n"
    return svg
}

private func label(_ ms: Double) -> String {
    if ms >= 1 { return String(format: "%.0f", ms) }
    if ms >= 0.1 { return String(format: "%.1f", ms) }
    if ms >= 0.01 { return String(format: "%.2f", ms) }
    return String(format: "%.3f", ms)
}

private func escape(_ text: String) -> String {
    text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
        .replacingOccurrences(of: ">", with: "&gt;")
}
