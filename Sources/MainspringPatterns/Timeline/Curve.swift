import MainspringCore

/// An easing curve: maps a step's linear progress (elapsed time over duration, `0...1`) to the
/// progress a `Timeline` hands to the step's `update` closure.
///
/// The named curves are CSS's `cubic-bezier()` timing functions with the standard control
/// points (the curve runs from (0, 0) to (1, 1); `P1` and `P2` shape it):
///
/// | curve | P1 | P2 |
/// |---|---|---|
/// | `.linear` | — | — |
/// | `.easeIn` | (0.42, 0) | (1, 1) |
/// | `.easeOut` | (0, 0) | (0.58, 1) |
/// | `.easeInOut` | (0.42, 0) | (0.58, 1) |
///
/// The built-in curves and every `.cubicBezier` whose `y1`, `y2` lie in `0...1` are monotonic
/// and map `0...1` onto `0...1`, with exactly `0` at `0` and exactly `1` at `1`.
/// A `.custom` curve is called as given: Mainspring does not check that it is monotonic or that
/// it stays in `0...1` (an overshooting "back" curve is allowed).
public enum Curve: Sendable {
    /// Progress is passed through unchanged.
    case linear
    /// Starts slowly and accelerates: CSS `ease-in`, `cubic-bezier(0.42, 0, 1, 1)`.
    case easeIn
    /// Starts fast and decelerates: CSS `ease-out`, `cubic-bezier(0, 0, 0.58, 1)`.
    case easeOut
    /// Slow at both ends: CSS `ease-in-out`, `cubic-bezier(0.42, 0, 0.58, 1)`. Symmetric:
    /// `value(at: 0.5) == 0.5`.
    case easeInOut
    /// A CSS `cubic-bezier(x1, y1, x2, y2)` timing function. `x1` and `x2` are clamped to
    /// `0...1` (as CSS requires, so that the curve is a function of time); `y1` and `y2` may lie
    /// outside `0...1` for curves that overshoot. Non-finite control points count as zero.
    case cubicBezier(x1: Double, y1: Double, x2: Double, y2: Double)
    /// Your own function of linear progress. It is called on the timeline's loop thread, once
    /// per frame, with progress in `0..<1`; its result is passed to `update` unchanged. (The last
    /// update of a step is always exactly `1.0`, whatever the function returns at `1`.)
    case custom(@Sendable (Double) -> Double)

    /// The eased progress for linear `progress`, which is clamped to `0...1` first (NaN counts as
    /// zero).
    ///
    /// Cost: constant for `.linear`; for the Bézier curves, a few Newton steps (bisection when
    /// Newton would leave the curve or stall) to invert x(t) to within 1e-12, then one
    /// evaluation of y(t) — well under a microsecond.
    public func value(at progress: Double) -> Double {
        let x = progress > 0 ? min(progress, 1) : 0
        switch self {
        case .linear: return x
        case .easeIn: return CubicBezier.easeIn.value(at: x)
        case .easeOut: return CubicBezier.easeOut.value(at: x)
        case .easeInOut: return CubicBezier.easeInOut.value(at: x)
        case let .cubicBezier(x1, y1, x2, y2): return CubicBezier(x1: x1, y1: y1, x2: x2, y2: y2).value(at: x)
        case let .custom(function): return function(x)
        }
    }
}

/// A cubic Bézier timing function from (0, 0) to (1, 1) with control points (x1, y1), (x2, y2),
/// in polynomial form: x(t) = ((ax·t + bx)·t + cx)·t, likewise y(t).
struct CubicBezier: Sendable {
    private let ax, bx, cx: Double
    private let ay, by, cy: Double

    static let easeIn = CubicBezier(x1: 0.42, y1: 0, x2: 1, y2: 1)
    static let easeOut = CubicBezier(x1: 0, y1: 0, x2: 0.58, y2: 1)
    static let easeInOut = CubicBezier(x1: 0.42, y1: 0, x2: 0.58, y2: 1)

    init(x1: Double, y1: Double, x2: Double, y2: Double) {
        func unit(_ v: Double) -> Double { v.isFinite ? min(max(v, 0), 1) : 0 }
        func finite(_ v: Double) -> Double { v.isFinite ? v : 0 }
        cx = 3 * unit(x1)
        bx = 3 * (unit(x2) - unit(x1)) - cx
        ax = 1 - cx - bx
        cy = 3 * finite(y1)
        by = 3 * (finite(y2) - finite(y1)) - cy
        ay = 1 - cy - by
    }

    private func x(_ t: Double) -> Double { ((ax * t + bx) * t + cx) * t }
    private func y(_ t: Double) -> Double { ((ay * t + by) * t + cy) * t }
    private func slopeX(_ t: Double) -> Double { (3 * ax * t + 2 * bx) * t + cx }

    /// y at the parameter t where x(t) == `x`; exact at both ends.
    func value(at x: Double) -> Double {
        if x <= 0 { return 0 }
        if x >= 1 { return 1 }
        return y(parameter(for: x))
    }

    /// Solves x(t) = `target` for t in 0...1. x(t) is non-decreasing there (x1, x2 in 0...1), so
    /// the root is unique up to flat stretches. Newton from t = x converges in a handful of steps
    /// for every usual curve; bisection catches the rest (a near-zero slope, or a step that
    /// leaves 0...1).
    private func parameter(for target: Double) -> Double {
        let tolerance = 1e-12
        var t = target
        for _ in 0..<8 {
            let error = x(t) - target
            if abs(error) < tolerance { return t }
            let slope = slopeX(t)
            if abs(slope) < 1e-9 { break }
            let next = t - error / slope
            if !(next >= 0 && next <= 1) { break }
            t = next
        }
        var low = 0.0
        var high = 1.0
        t = target
        for _ in 0..<100 {
            let value = x(t)
            if abs(value - target) < tolerance { return t }
            if value < target { low = t } else { high = t }
            t = (low + high) / 2
        }
        return t
    }
}
