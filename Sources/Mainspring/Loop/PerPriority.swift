/// One value per `Priority`, stored inline (no dictionary, no array): the loop's per-priority
/// queues, batches and counters. Subscripting by priority is a switch the optimiser folds away
/// when the priority is known.
struct PerPriority<Value> {
    var input: Value
    var normal: Value
    var background: Value

    init(input: Value, normal: Value, background: Value) {
        self.input = input
        self.normal = normal
        self.background = background
    }

    /// The same value for every priority.
    init(repeating value: Value) {
        self.init(input: value, normal: value, background: value)
    }

    /// A value made for each priority.
    init(_ make: (Priority) -> Value) {
        self.init(input: make(.input), normal: make(.normal), background: make(.background))
    }

    subscript(priority: Priority) -> Value {
        @inline(__always) get {
            switch priority {
            case .input: return input
            case .normal: return normal
            case .background: return background
            }
        }
        @inline(__always) _modify {
            switch priority {
            case .input: yield &input
            case .normal: yield &normal
            case .background: yield &background
            }
        }
    }

    /// Runs `body` on the value of `priority`, in place. The hot paths use this rather than the
    /// subscript: a `_modify` accessor with one yield per priority is a coroutine the optimiser
    /// does not inline (a call of some 13 instructions per access), a closure here is.
    @inline(__always)
    mutating func update<Result>(_ priority: Priority, _ body: (inout Value) -> Result) -> Result {
        switch priority {
        case .input: return body(&input)
        case .normal: return body(&normal)
        case .background: return body(&background)
        }
    }

    /// The values as a dictionary, for public snapshots.
    func dictionary<T>(_ transform: (Value) -> T) -> [Priority: T] {
        [.input: transform(input), .normal: transform(normal), .background: transform(background)]
    }
}
