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

    @inline(__always)
    subscript(priority: Priority) -> Value {
        get {
            switch priority {
            case .input: return input
            case .normal: return normal
            case .background: return background
            }
        }
        _modify {
            switch priority {
            case .input: yield &input
            case .normal: yield &normal
            case .background: yield &background
            }
        }
    }

    /// The values as a dictionary, for public snapshots.
    func dictionary<T>(_ transform: (Value) -> T) -> [Priority: T] {
        [.input: transform(input), .normal: transform(normal), .background: transform(background)]
    }
}
