/// Counts the primes below a limit with a segmented sieve of Eratosthenes, one segment at a
/// time: a long job whose answer can be checked (π(10⁷) = 664,579; π(10⁸) = 5,761,455), fed to
/// a loop in chunks.
public struct PrimeSieve: Sendable {
    /// Primes are counted in `2..<limit`.
    public let limit: Int
    /// The next number to sieve; the job is done when it reaches `limit`.
    public private(set) var position: Int
    /// Primes found below `position`.
    public private(set) var count: Int
    private let basePrimes: [Int]

    public init(limit: Int) {
        self.limit = max(2, limit)
        self.position = 2
        self.count = 0
        // Base primes up to √limit, with a plain sieve.
        let root = Int(Double(self.limit).squareRoot()) + 1
        var composite = [Bool](repeating: false, count: root + 1)
        var base: [Int] = []
        if root >= 2 {
            for n in 2...root where !composite[n] {
                base.append(n)
                var multiple = n * n
                while multiple <= root {
                    composite[multiple] = true
                    multiple += n
                }
            }
        }
        basePrimes = base
    }

    /// Whether every number below `limit` has been sieved.
    public var isDone: Bool { position >= limit }

    /// The fraction done, 0...1.
    public var progress: Double { isDone ? 1 : Double(position - 2) / Double(limit - 2) }

    /// Sieves the next `size` numbers (at least 1). Costs about `size` steps.
    public mutating func sieveNext(_ size: Int) {
        guard !isDone else { return }
        let low = position
        let high = min(limit, low + max(1, size))
        var composite = [Bool](repeating: false, count: high - low)
        for p in basePrimes {
            if p * p >= high { break }
            var multiple = max(p * p, (low + p - 1) / p * p)
            while multiple < high {
                composite[multiple - low] = true
                multiple += p
            }
        }
        for flag in composite where !flag { count += 1 }
        position = high
    }
}
